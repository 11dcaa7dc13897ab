"""Models on demand: the models a server can serve, loaded when a request
names one, and unloaded again when idle.

A model given at start (pinned) loads then and stays. Any other servable
model loads on its first request, planned against what the loaded models
hold on each device (`served.placed`); past ``models_max`` the least
recently used idle model goes first, and one idle for longer than its keep
alive (``idle_unload_s``, or the last request's ``keep_alive``) is unloaded.
A model is idle when no request holds it (`holding`: from `ready` to the end
of the request's response) and its worker has nothing running or waiting.

Loads and unloads run one at a time, off the event loop; a request that
arrives while its model loads or unloads waits for that, so two first
requests for one model load it once.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import json
import math
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from starlette.types import ASGIApp, Receive, Scope, Send

from localrun.errors import InvalidRequestError, LocalrunError, ModelNotFoundError, ServerBusyError, UsageError
from localrun.serve.events import Notice, ServerStatus
from localrun.serve.heap import trim_heap
from localrun.serve.own_thread import in_own_thread
from localrun.serve.served import Loader, ModelPlan, ServedModel, held_by, load_model, looks_like_path, placed
from localrun.store.registry import Registry

DEFAULT_IDLE_UNLOAD_S = 300.0
SWEEP_EVERY_S = 1.0  # how often idle models are looked for (`tick`)
DEFAULT_QUEUE_TIMEOUT_S = 300.0  # how long a request waits for a model to make room for its own
REDISCOVER_EVERY_S = 5.0  # a listing looks for newly pulled models at most this often
ROOM_POLL_S = 0.25  # a wait for room looks again this often (a request's end also wakes it)

State = Literal["loaded", "loading", "unloading", "unloaded"]


@dataclass(frozen=True)
class Servable:
    """A model the server may load on demand: its id, the other names it
    answers to, and how to plan it (called off the event loop, when it loads)."""

    id: str
    names: frozenset[str]
    plan: Callable[[], ModelPlan]


@dataclass(eq=False)
class _Entry:
    id: str
    names: frozenset[str]
    plan: Callable[[], ModelPlan] | None  # None: pinned, never loaded again
    pinned: bool = False
    model: ServedModel | None = None
    state: State = "unloaded"
    change: asyncio.Future[None] | None = None  # the load or unload under way
    last_used: float = field(default_factory=time.monotonic)
    holds: int = 0  # requests between `ready` and the end of their response
    keep_alive: float | None = None  # seconds idle before it unloads, from a request (inf: never)
    created: int = field(default_factory=lambda: int(time.time()))

    def answers_to(self, name: str) -> bool:
        return name == self.id or name in self.names


_HOLDS: contextvars.ContextVar[list[_Entry] | None] = contextvars.ContextVar("localrun_model_holds", default=None)


_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)(ms|s|m|h)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: object, what: str = "keep_alive") -> float:
    """Seconds in ``value`` as ollama's ``keep_alive`` takes it: a number of
    seconds, or a duration such as "5m", "30s", "1h30m"; a negative one is
    ``inf`` (never). What does not parse is an InvalidRequestError naming ``what``."""
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            sign = -1.0 if text.startswith("-") else 1.0
            body = text.lstrip("-")
            parts = _DURATION.findall(body)
            if parts and "".join(n + u for n, u in parts) == body:
                seconds = sign * sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds is None or math.isnan(seconds):
        raise InvalidRequestError(f'{what}: {value!r} is not a duration (say "5m", "30s", seconds, or -1)', what)
    return math.inf if seconds < 0 else seconds


def take_keep_alive(data: dict[str, Any]) -> float | None:
    """Remove ``keep_alive`` from a request body (ollama's extra field) and give it in seconds."""
    if "keep_alive" not in data:
        return None
    return parse_duration(data.pop("keep_alive"))


def split_keep_alive(raw: bytes) -> tuple[bytes, float | None]:
    """A request body without its ``keep_alive`` (ollama's extra field, in
    chat, completions and messages bodies), and that in seconds; a body
    without one comes back as it is (one that is not JSON is the parser's to refuse)."""
    if b'"keep_alive"' not in raw:
        return raw, None
    try:
        data = json.loads(raw)
    except ValueError:
        return raw, None
    if not isinstance(data, dict):
        return raw, None
    seconds = take_keep_alive(data)
    return json.dumps(data).encode(), seconds


def model_named(data: dict[str, Any]) -> str:
    """The ``model`` of a `/models/load` or `/models/unload` body."""
    name = data.get("model")
    if not isinstance(name, str) or not name:
        raise InvalidRequestError("model: required, the name of a model", "model")
    return name


class HoldRequests:
    """ASGI middleware: each request within its table's `ModelTable.holding`."""

    def __init__(self, app: ASGIApp, table: ModelTable) -> None:
        self.app = app
        self.table = table

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with self.table.holding():
            await self.app(scope, receive, send)


def _mib(size: int) -> str:
    return f"{size / 2**20:.0f} MiB"


class ModelTable:
    """The models a server serves, found by id, by a name they answer to, or
    by a registry alias of one of them: the pinned ones (loaded at start),
    and the servable ones, loaded when asked for.

    A route gets its model with ``await table.ready(name)``; `find` gives one
    already loaded, without waiting."""

    def __init__(
        self,
        models: Sequence[ServedModel],
        registry: Registry | None = None,
        *,
        servable: Sequence[Servable] = (),
        models_max: int = 0,
        idle_unload_s: float | None = DEFAULT_IDLE_UNLOAD_S,
        queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S,
        max_waiting: int | None = None,
        discover: Callable[[], Sequence[Servable]] | None = None,
        loader: Loader = load_model,
    ) -> None:
        if not models and not servable and discover is None:
            raise ValueError("a server needs a model")
        self.registry = registry
        self.discover = discover  # the servable models as they are now: a model pulled since is served too
        self.models_max = models_max  # 0: no limit
        self.idle_unload_s = idle_unload_s  # None: never
        self.queue_timeout_s = queue_timeout_s  # a load waits this long for an idle model to make room
        self.max_waiting = max_waiting  # requests that may wait for a model to load; None: no bound
        self.waiting = 0  # requests waiting now for their model to load (or unload and load again)
        self._freed: asyncio.Event | None = None  # set when a request ends: a model may have gone idle
        self._discovered = -math.inf  # when `discover` last looked
        self.loader = loader  # in this process, or each model in a runner process of its own
        self.entries: list[_Entry] = [
            _Entry(m.id, m.names, _again(m), pinned=True, model=m, state="loaded") for m in models
        ]
        self._add(servable)
        self._lock: asyncio.Lock | None = None  # made on the event loop that first needs it
        self._last_sweep = 0.0
        self._sweeping: asyncio.Future[list[str]] | None = None
        self._said: list[Notice] = []  # loads and unloads, for the server's log (`notices`)
        self._stopping = False
        self._wanting: set[_Entry] = set()  # loads waiting for a loaded model to go idle and make room
        self._swapped: asyncio.Event | None = None  # set when one of them ends

    # -- finding --

    def _add(self, servable: Sequence[Servable]) -> bool:
        """Each servable model not served yet (nor given with -m) as an entry; whether any was."""
        added = False
        for each in servable:
            if not any(e.answers_to(name) for e in self.entries for name in (each.id, *each.names)):
                self.entries.append(_Entry(each.id, each.names, each.plan))
                added = True
        return added

    def _rediscover(self, unless_within: float = 0.0) -> bool:
        """Models pulled (or put in --models-dir) since the server started, added; whether any was.
        ``unless_within``: seconds since the last look within which it does not look again
        (a listing asked for often need not walk the store each time)."""
        now = time.monotonic()
        if self.discover is None or now - self._discovered < unless_within:
            return False
        self._discovered = now
        return self._add(self.discover())

    @property
    def models(self) -> list[ServedModel]:
        """The models loaded now."""
        return [e.model for e in self.entries if e.model is not None]

    def _entry(self, name: str | None) -> _Entry:
        """The entry ``name`` names (none: the first pinned or loaded model, else the first servable)."""
        if not name:
            if not self.entries and not self._rediscover():
                raise ModelNotFoundError(
                    "no model is pulled to serve yet", hint="localrun pull MODEL: the next request finds it"
                )
            return next((e for e in self.entries if e.model is not None), self.entries[0])
        for entry in self.entries:
            if entry.answers_to(name):
                return entry
        if looks_like_path(name):
            raise InvalidRequestError(
                f"model {name!r} is a file path; a request names one of the models this server serves", "model"
            )
        by_alias = self._by_alias(name)
        if by_alias is not None:
            return by_alias
        if self._rediscover():
            return self._entry(name)
        served = ", ".join(e.id for e in self.entries)
        hint = f"served: {served}" if served else f"none is pulled yet: localrun pull {name}"
        raise ModelNotFoundError(f"model {name!r} is not served here", hint=hint)

    def _by_alias(self, name: str) -> _Entry | None:
        """The entry of the registry alias ``name`` is another name of (its file's name, a bare family)."""
        if self.registry is None or "/" in name:
            return None
        entry_ = self.registry.by_file(name)
        alias: str | None = entry_.alias if entry_ is not None else None
        if alias is None:
            with contextlib.suppress(ModelNotFoundError):
                alias = self.registry.resolve(name).alias
        return next((e for e in self.entries if alias is not None and e.answers_to(alias)), None)

    def find(self, name: str | None) -> ServedModel:
        """The loaded model ``name`` names, now; a servable one not loaded is
        a ServerBusyError (a route that may load it awaits `ready`)."""
        entry = self._entry(name)
        if entry.model is None or entry.state != "loaded":
            raise ServerBusyError(f"model {entry.id!r} is not loaded", hint="load it: POST /models/load")
        return entry.model

    # -- loading --

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """A request's span: every model `ready` gives within it is kept from
        eviction and idle unload until it ends (the app wraps each request)."""
        held: list[_Entry] = []
        token = _HOLDS.set(held)
        try:
            yield
        finally:
            _HOLDS.reset(token)
            now = time.monotonic()
            for entry in held:
                entry.holds -= 1
                entry.last_used = now
            if held and self._freed is not None:
                self._freed.set()
                self._freed = None
            if any(self._timeout(e) == 0 for e in held):
                with contextlib.suppress(RuntimeError):  # no event loop: the next tick sweeps
                    asyncio.get_running_loop().create_task(self.sweep())

    async def ready(self, name: object, keep_alive: float | None = None) -> ServedModel:
        """The model ``name`` names, loaded if it is not (a request for a model
        that loads or unloads waits for that), marked used, and held until the
        request's end (within `holding`). ``keep_alive``: seconds it may then
        stay idle (inf: never), for this model from now on."""
        if name is not None and not isinstance(name, str):
            raise InvalidRequestError("model: must be a string", "model")
        entry = self._entry(name)
        await self._behind_swaps(entry)
        held = _HOLDS.get()
        if held is not None:
            held.append(entry)
            entry.holds += 1
        if keep_alive is not None and not entry.pinned:
            entry.keep_alive = keep_alive
        entry.last_used = time.monotonic()
        self._reap(entry)
        if entry.model is None or entry.change is not None:
            full = bool(self.models_max) and len(self.models) >= self.models_max  # it waits for room, not a load
            if full and self.max_waiting is not None and self.waiting >= self.max_waiting:
                raise ServerBusyError(
                    f"{self.waiting} requests are waiting for a model to load (--queue {self.max_waiting})",
                    hint="retry later",
                )
            self.waiting += 1
            try:
                while entry.model is None or entry.change is not None:
                    change = entry.change
                    if change is None:
                        change = entry.change = asyncio.ensure_future(self._load(entry))
                    elif change.done():  # ended, its owner not yet past its `finally`: let it run (awaiting
                        await asyncio.sleep(0)  # a done future yields nothing, and the loop would spin)
                        continue
                    await asyncio.shield(change)
            finally:
                self.waiting -= 1
        entry.last_used = time.monotonic()
        return entry.model

    async def _behind_swaps(self, entry: _Entry) -> None:
        """A request for a loaded model waits while another model's load
        waits for room, in the order they came: taken at once, requests to
        the loaded models would keep them busy, and the load would wait for
        ever for one to go idle. (Not held meanwhile: its model may be the
        one that goes.)"""
        if entry.pinned or entry.model is None or not self._wanting or entry in self._wanting:
            return
        self.waiting += 1
        try:
            while self._wanting and entry not in self._wanting and entry.model is not None:
                if self._swapped is None:
                    self._swapped = asyncio.Event()
                await self._swapped.wait()
        finally:
            self.waiting -= 1

    async def load(self, name: str) -> ServedModel:
        """`POST /models/load`: as `ready`, held by no request."""
        return await self.ready(name)

    async def unload(self, name: str) -> bool:
        """`POST /models/unload`: unload the model now, once its requests have
        ended; False when it was not loaded. A pinned model stays (a UsageError)."""
        entry = self._entry(name)
        if entry.pinned:
            raise UsageError(f"model {entry.id!r} was given at start and stays loaded")
        async with self._locked():
            if entry.model is None:
                return False
            if not self._idle(entry):
                raise ServerBusyError(f"model {entry.id!r} has requests running or waiting", hint="retry later")
            await self._drop(entry)
        return True

    def _locked(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def _load(self, entry: _Entry) -> None:
        deadline = time.monotonic() + self.queue_timeout_s  # from the request's arrival, the lock's queue included
        try:
            async with self._locked():
                entry.state = "loading"
                await self._make_room(entry, deadline)
                while True:
                    try:
                        t0 = time.monotonic()
                        entry.model = await in_own_thread(self._load_now, entry)
                        held = sum(entry.model.held.values())
                        took = time.monotonic() - t0
                        self._said.append(Notice(f"{entry.id}: loaded ({_mib(held)}) in {took:.1f} s", warning=False))
                        self._said += [Notice(f"{entry.id}: {text}") for text in entry.model.notices]
                        break
                    except _NoRoom as no_room:
                        while (victim := self._victim(entry)) is None:  # planned again only once one can go
                            if not await self._room(entry, deadline):
                                raise ServerBusyError(f"{no_room}; {self._holders()}", hint="retry later") from None
                        await self._drop(victim)
            entry.state = "loaded"
            entry.last_used = time.monotonic()
        except BaseException:
            entry.state = "unloaded"
            raise
        finally:
            entry.change = None
            if entry in self._wanting:  # the requests queued behind this load go on
                self._wanting.discard(entry)
                if self._swapped is not None:
                    self._swapped.set()
                    self._swapped = None

    def _load_now(self, entry: _Entry) -> ServedModel:
        """On a worker thread, the lock held: plan the model and load it."""
        assert entry.plan is not None  # a model given at start loads again only with its plan
        plan = entry.plan()
        try:
            run = placed(plan, held_by(self.models))
        except UsageError as exc:
            raise _NoRoom(f"model {entry.id!r} does not fit: {exc.message}") from exc
        try:
            return self.loader(replace_id(plan, entry), run)
        except LocalrunError:
            raise
        except (OSError, ValueError, RuntimeError) as exc:
            raise ModelNotFoundError(f"model {entry.id!r} could not be loaded: {exc}") from exc

    async def _make_room(self, entry: _Entry, deadline: float) -> None:
        """Past ``models_max``, unload the least recently used idle model
        first; while none is idle, wait (up to ``deadline``) for one to be."""
        while self.models_max and len(self.models) >= self.models_max:
            victim = self._victim(entry)
            if victim is not None:
                await self._drop(victim)
            elif not await self._room(entry, deadline):
                busy = ", ".join(m.id for m in self.models)
                raise ServerBusyError(
                    f"{len(self.models)} models are loaded (--models-max {self.models_max}) and none went idle"
                    f" within {self.queue_timeout_s:g} s: {busy}",
                    hint="retry when a request ends",
                )

    async def _room(self, entry: _Entry, deadline: float) -> bool:
        """Wait for a request to end (or `ROOM_POLL_S`); False once ``deadline``
        has passed, or when no other model could ever make room (none loaded
        but pinned ones). The lock stays held: loads queue behind this one in
        the order they came."""
        left = deadline - time.monotonic()
        if left <= 0 or not any(e is not entry and e.model is not None and not e.pinned for e in self.entries):
            return False
        self._wanting.add(entry)  # from now on, requests for the loaded models queue behind it
        if self._freed is None:
            self._freed = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._freed.wait(), min(left, ROOM_POLL_S))
        return True

    def _victim(self, entry: _Entry) -> _Entry | None:
        idle = [e for e in self.entries if e is not entry and self._idle(e)]
        return min(idle, key=lambda e: e.last_used, default=None)

    def _idle(self, entry: _Entry) -> bool:
        """Loaded, not pinned, held by no request, nothing running or waiting on it."""
        if entry.model is None or entry.pinned or entry.holds or entry.change is not None:
            return False
        status = entry.model.worker.status()
        return status.busy == 0 and status.queued == 0

    async def _drop(self, entry: _Entry) -> None:
        """Unload ``entry`` (the lock held); a request for it meanwhile waits, then loads it again."""
        model = entry.model
        assert model is not None
        entry.model = None
        entry.state = "unloading"
        self._said.append(Notice(f"{entry.id}: unloaded", warning=False))
        entry.keep_alive = None
        change = asyncio.ensure_future(in_own_thread(_free, model))
        entry.change = change
        try:
            await asyncio.shield(change)
        finally:
            entry.change = None
            entry.state = "unloaded"

    def _reap(self, entry: _Entry) -> None:
        """Forget ``entry``'s model if its runner ended (died, or was killed
        hanging): its requests have failed already; it loads again on the next."""
        model = entry.model
        if model is None or model.ended is None or entry.change is not None or self._stopping:
            return
        entry.model = None
        entry.state = "unloaded"
        self._said.append(Notice(f"{model.ended}; it loads again on its next request"))
        model.close()

    def _holders(self) -> str:
        """What holds the memory: each loaded model and its size on each device."""
        each = [
            f"{m.id} ({', '.join(f'{device} {_mib(size)}' for device, size in m.held.items()) or 'nothing measured'})"
            for m in self.models
        ]
        return "held by " + "; ".join(each) if each else "no other model is loaded"

    # -- unloading the idle --

    def _timeout(self, entry: _Entry) -> float | None:
        """Seconds ``entry`` may stay idle; None: for ever."""
        if entry.pinned:
            return None
        seconds = entry.keep_alive if entry.keep_alive is not None else self.idle_unload_s
        return None if seconds is None or math.isinf(seconds) else seconds

    async def sweep(self) -> list[str]:
        """Unload every model idle for longer than its keep alive; their ids."""
        now = time.monotonic()
        due = [
            e for e in self.entries if (t := self._timeout(e)) is not None and self._idle(e) and now - e.last_used >= t
        ]
        if not due:
            return []
        dropped = []
        async with self._locked():
            for entry in due:
                timeout = self._timeout(entry)
                if timeout is not None and self._idle(entry) and time.monotonic() - entry.last_used >= timeout:
                    await self._drop(entry)
                    dropped.append(entry.id)
        return dropped

    def tick(self) -> None:
        """Called often on the event loop (the server's ticks): a sweep every
        `SWEEP_EVERY_S`, on a task of its own (a load under way holds the lock)."""
        for entry in self.entries:
            self._reap(entry)
        now = time.monotonic()
        if now - self._last_sweep >= SWEEP_EVERY_S and (self._sweeping is None or self._sweeping.done()):
            self._last_sweep = now
            self._sweeping = asyncio.ensure_future(self.sweep())

    # -- what it says --

    def describe(self) -> list[dict[str, Any]]:
        """Every servable model's /v1/models entry: its ``status`` (loaded,
        loading, unloading, unloaded) and, loaded, what it holds and does."""
        self._rediscover(unless_within=REDISCOVER_EVERY_S)
        now = time.monotonic()
        listed = []
        for entry in self.entries:
            model = entry.model
            body: dict[str, Any] = (
                model.describe()
                if model is not None
                else {"id": entry.id, "object": "model", "created": entry.created, "owned_by": "localrun"}
            )
            status: dict[str, Any] = {"value": entry.state, "pinned": entry.pinned}
            if model is not None and entry.state == "loaded":
                worker = model.worker.status()
                idle = worker.busy == 0 and worker.queued == 0 and entry.holds == 0
                status |= {
                    "memory": model.held,
                    "slots": worker.parallel,
                    "slots_busy": worker.busy,
                    "queued": worker.queued,
                    "requests": entry.holds,  # being answered (streams included)
                    "pid": model.worker.pid,  # its runner's (the server's own: loaded in process)
                    "idle_s": round(now - entry.last_used, 1) if idle else 0.0,
                }
            body["status"] = status
            if entry.names:
                body["aliases"] = sorted(entry.names)
            listed.append(body)
        return listed

    def describe_one(self, name: str) -> dict[str, Any]:
        entry = self._entry(name)
        return next(d for d in self.describe() if d["id"] == entry.id)

    def unloads_in(self, name: str) -> float | None:
        """Seconds until ``name``'s model unloads if it stays idle from now
        (ollama's ``expires_at``); None: never (given at start, or no keep alive)."""
        entry = self._entry(name)
        timeout = self._timeout(entry)
        if timeout is None:
            return None
        idle = entry.holds == 0 and (entry.model is None or self._idle(entry))
        return max(timeout - (time.monotonic() - entry.last_used), 0.0) if idle else timeout

    def status(self) -> ServerStatus:
        """All loaded models' slots and requests together."""
        each = [m.worker.status() for m in self.models]
        return ServerStatus(
            slots=sum(s.parallel for s in each),
            busy=sum(s.busy for s in each),
            queued=sum(s.queued for s in each) + self.waiting,
            done=sum(s.done for s in each),
            cancelled=sum(s.cancelled for s in each),
            tokens_per_s=sum(s.tokens_per_s for s in each),
        )

    def notices(self) -> list[Notice]:
        """What the table (loads, unloads) and each model's scheduler had to say since the last call."""
        said, self._said = self._said, []
        return said + [Notice(f"{m.id}: {text}") for m in self.models for text in m.worker.notices()]

    def stop(self) -> None:
        """End every request still running or waiting (each gets an error saying why); no more are taken."""
        self._stopping = True  # a runner that ends now is not reloaded
        for model in self.models:
            model.worker.stop()

    def close(self) -> None:
        for entry in self.entries:
            if entry.model is not None:
                entry.model.close()
                entry.model = None
                entry.state = "unloaded"


def _free(model: ServedModel) -> None:
    """Close ``model`` and give what it held back to the system: the C heap
    keeps freed buffers for reuse (a model's KV cache and compute buffers are
    large) until trimmed."""
    model.close()
    gc.collect()
    trim_heap()


class _NoRoom(Exception):
    """The model's plan does not fit beside the models loaded."""


def _again(model: ServedModel) -> Callable[[], ModelPlan] | None:
    """How a model given at start loads again once its runner ended."""
    plan = model.plan
    return None if plan is None else lambda: plan


def replace_id(plan: ModelPlan, entry: _Entry) -> ModelPlan:
    """``plan`` under the id and names the table knows the model by."""
    return replace(plan, id=entry.id, names=entry.names)
