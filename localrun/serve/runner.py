"""Each served model in a runner process of its own, as the server sees it.

`start_runner` starts ``python -m localrun.serve.runner_process`` on one
end of a Unix socket pair (never a network port), sends it the model's
plan and waits for its load. The `ServedModel` it gives has a `Runner` as
its backend: requests go to the runner whole, their text comes back token
by token, and the runner's heartbeat says how far its engine has got. The
server holds nothing of the model itself, not even its vocabulary:
`RemoteTokens` asks the runner to tokenize (a request's prompt, a
grammar's markers) and remembers what does not change (a token's text).

A runner that dies (killed, aborted, out of memory) costs only its own
requests: each ends with an error naming the model and the cause, and the
model is loaded again on its next request (the router reaps it). One that
hangs (no heartbeat, or no decode with requests admitted) for ``hang_s`` is
killed and counts as died. An unload is the runner's exit: everything it
held goes back to the system with it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from localrun.assemble import Assembled
from localrun.errors import EngineError, LocalrunError
from localrun.events import SequenceDone
from localrun.gguf.info import describe
from localrun.gguf.reader import GGUFInfo
from localrun.runtime.batch.scheduler import BatchRequest, check_request
from localrun.runtime.embed import makes_embeddings
from localrun.serve.runner_wire import HEARTBEAT_S, Outbox
from localrun.serve.served import Handler, Loaded, ModelPlan, ServedModel
from localrun.serve.worker import Deliver, Failed, WorkerStatus, admit

PROGRAM = "localrun.serve.runner_process"  # the module a runner runs (`python -m`)
DEFAULT_HANG_S = 120.0  # a runner silent, or stuck with requests admitted, this long is replaced
MIN_HANG_S = 3 * HEARTBEAT_S  # less would take a runner between two heartbeats for a hung one
STOP_S = 30.0  # a runner told to stop that has not ended by then is killed
ASK_S = 30.0  # a question of the vocabulary not answered by then is an error
WAIT_S = 10.0  # for a process killed to be reaped


def _cause(returncode: int | None) -> str:
    if returncode is None:
        return "stopped answering"
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-returncode).name}"
        return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


class Runner:
    """A model's runner process: the `Backend` its requests go to."""

    def __init__(
        self, plan: ModelPlan, run: Assembled, *, hang_s: float = DEFAULT_HANG_S, program: str = PROGRAM
    ) -> None:
        self.id = plan.id
        self.hang_s = hang_s
        self.max_queue = plan.max_queue
        self.ended: str | None = None  # why it serves no more (None while it does)
        self.pieces: dict[int, bytes] = {}  # tokens' text, as the runner sent it ahead of their events
        self._lock = threading.Lock()  # what is in flight, and the counts (never held across a send)
        self._stop_lock = threading.Lock()  # `stop`, one caller at a time
        self._stopped = False
        self._deliver: dict[int, Deliver] = {}  # every request submitted and not yet ended
        self._pending: dict[int, concurrent.futures.Future[Any]] = {}  # calls and questions not yet answered
        self._indexes = itertools.count()
        self._numbers = itertools.count()
        self._said: list[str] = []
        self._done = self._cancelled = self._failed = 0
        self._stopping = False
        self._hung: str | None = None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with theirs:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", program, str(theirs.fileno())],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    start_new_session=True,  # a Ctrl-C at the server's terminal is the server's to handle
                )
        except BaseException:
            ours.close()
            raise
        self.conn = Connection(ours.detach())
        self._out = Outbox(self.conn)
        try:
            self._out.send(plan, run)
            self.loaded = self._load(plan.id)
        except BaseException:
            self._kill()
            self._out.close(1)
            self.conn.close()
            raise
        self.parallel = self.loaded.parallel
        self.capacity = self.loaded.capacity
        now = time.monotonic()
        self._beat: WorkerStatus | None = None
        self._beat_at = now
        self._progress = -1
        self._moved_at = now
        self._reader = threading.Thread(target=self._read, name=f"localrun-runner-{plan.id}", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _load(self, model: str) -> Loaded:
        """What the load measured, once the runner has loaded the model (it
        says every second that it still loads: silent for ``hang_s``, it is killed)."""
        heard = time.monotonic()
        try:
            while True:
                if not self.conn.poll(HEARTBEAT_S):
                    if time.monotonic() - heard > self.hang_s:
                        raise EngineError(f"{model}: its runner stopped answering while loading, and was killed")
                    continue
                kind, said = self.conn.recv()
                if kind != "loading":
                    break
                heard = time.monotonic()
        except (EOFError, OSError):
            raise EngineError(f"{model}: its runner {_cause(self._reaped())} while loading") from None
        if kind == "failed":
            raise said if isinstance(said, LocalrunError) else EngineError(str(said))
        assert isinstance(said, Loaded)
        return said

    # -- the backend, from the handlers --

    def _gone(self) -> EngineError:
        assert self.ended is not None
        return EngineError(self.ended)

    def next_index(self) -> int:
        return next(self._indexes)

    def _idle_until_now(self) -> None:
        """Called with the lock held before work is added: an engine with nothing to do had no reason to move."""
        if not self._deliver and not self._pending:
            self._moved_at = time.monotonic()

    def submit(self, request: BatchRequest, deliver: Deliver) -> None:
        check_request(request, self.capacity)
        packed = self._out.pack("submit", request)
        with self._lock:
            if self.ended is not None:
                raise self._gone()
            admit(len(self._deliver), self.parallel, self.max_queue, self._stopping)
            self._idle_until_now()
            self._deliver[request.index] = deliver
            self._out.put(packed)

    def cancel(self, index: int) -> None:
        with self._lock:
            if self._deliver.pop(index, None) is not None:
                self._cancelled += 1
                self._out.send("cancel", index)

    def _request(self, kind: str, *fields: Any) -> tuple[int, concurrent.futures.Future[Any]]:
        """Send ``kind`` with a number of its own; the future its answer settles."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        ident = next(self._numbers)
        packed = self._out.pack(kind, ident, *fields)
        with self._lock:
            if self.ended is not None:
                raise self._gone()
            self._idle_until_now()
            self._pending[ident] = future
            self._out.put(packed)
        return ident, future

    async def call(self, handler: Handler, model: ServedModel, body: dict[str, Any]) -> dict[str, Any]:
        """``handler(model, body)`` in the runner, on the model it loaded there (not ``model``, the server's)."""
        _, future = self._request("call", handler, body)
        result: dict[str, Any] = await asyncio.wrap_future(future)
        return result

    def call_blocking(self, handler: Handler, model: ServedModel, body: dict[str, Any]) -> dict[str, Any]:
        """`call`, waited for on this thread (at most `ASK_S`)."""
        result: dict[str, Any] = self._answer(*self._request("call", handler, body))
        return result

    def ask(self, what: str, *args: Any, **kwargs: Any) -> Any:
        """``engine.WHAT(*args, **kwargs)`` of the model's vocabulary, in the runner (`RemoteTokens`)."""
        return self._answer(*self._request("ask", what, args, kwargs))

    def _answer(self, ident: int, future: concurrent.futures.Future[Any]) -> Any:
        try:
            return future.result(ASK_S)
        except concurrent.futures.TimeoutError:
            with self._lock:
                self._pending.pop(ident, None)
            raise EngineError(f"{self.id}: its runner did not answer within {ASK_S:g} s") from None

    def status(self) -> WorkerStatus:
        """Its requests as counted here, where they are sent and end (the
        runner's scheduler gives a slot at its next step to each request
        that has one free; calls in flight count as waiting); its tokens as
        its last heartbeat said."""
        with self._lock:
            running, calls = len(self._deliver), len(self._pending)
            done, cancelled, failed = self._done, self._cancelled, self._failed
        busy = min(running, self.parallel)
        beat = self._beat
        return WorkerStatus(
            parallel=self.parallel,
            busy=busy,
            queued=running - busy + calls,
            done=done,
            cancelled=cancelled,
            failed=failed,
            generated_tokens=beat.generated_tokens if beat is not None else 0,
            tokens_per_s=beat.tokens_per_s if beat is not None else 0.0,
        )

    def notices(self) -> list[str]:
        with self._lock:
            said, self._said = self._said, []
        return said

    def stop(self, timeout: float | None = None) -> None:
        """Tell the runner to end (the requests it still has end with an
        error saying the server is shutting down), and wait for it; killed
        if it has not ended within ``timeout`` (`STOP_S`)."""
        with self._stop_lock:  # once: the shutdown's thread and the table's close may both stop it
            if self._stopped:
                return
            with self._lock:
                self._stopping = True
            if self.proc.poll() is None:
                self._out.send("stop")
            try:
                self.proc.wait(STOP_S if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                self._kill()
            self._reader.join(WAIT_S)
            self._out.close(1)
            self.conn.close()
            self._stopped = True

    def _kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        self._reaped()

    def _reaped(self) -> int | None:
        """Its exit status, once the system has it (None: it has not ended within `WAIT_S`)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.proc.wait(WAIT_S)
        return None

    # -- the reader thread --

    def _read(self) -> None:
        """Take what the runner says until it ends or is killed for hanging;
        then fail what it left. Whatever goes wrong here ends the runner: a
        reader gone would leave its requests waiting for ever."""
        cause: str | None = None
        try:
            while self._hung is None:
                try:
                    if self.conn.poll(HEARTBEAT_S):
                        self._take(self.conn.recv())
                except (EOFError, OSError):
                    break
                self._watch()
        except Exception as exc:
            cause = f"could not be understood ({type(exc).__name__}: {exc}), and was killed"
        if cause is not None or self._hung is not None:
            self._kill()
        code = self._reaped()
        self._end(cause or self._hung or _cause(code))

    def _take(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "events":
            self._events(message[1])
        elif kind == "pieces":
            self.pieces.update(message[1])
        elif kind == "beat":
            _, status, notices, progress = message
            now = time.monotonic()
            self._beat, self._beat_at = status, now
            with self._lock:
                self._said += notices
            if progress != self._progress:
                self._progress, self._moved_at = progress, now
        elif kind == "answered":
            _, ident, result, error = message
            with self._lock:
                future = self._pending.pop(ident, None)
            if future is not None:
                _settle(future, result, error)

    def _events(self, events: list[Any]) -> None:
        for event in events:
            ends = isinstance(event, SequenceDone | Failed)
            with self._lock:
                deliver = self._deliver.pop(event.index, None) if ends else self._deliver.get(event.index)
                if deliver is not None and ends:
                    self._done += isinstance(event, SequenceDone)
                    self._failed += isinstance(event, Failed)
            if deliver is not None:
                deliver(event)

    def _watch(self) -> None:
        """Mark a runner that hangs, for the reader to kill: no heartbeat, or no decode with work admitted."""
        now = time.monotonic()
        with self._lock:
            working = bool(self._deliver or self._pending)
            stopping = self._stopping
        if stopping or self.proc.poll() is not None:
            return
        if now - self._beat_at > self.hang_s:
            self._hung = f"stopped answering (no heartbeat for {self.hang_s:g} s) and was replaced"
        elif working and now - self._moved_at > self.hang_s:
            self._hung = f"made no progress for {self.hang_s:g} s with requests running, and was replaced"

    def _end(self, cause: str) -> None:
        """The runner is gone: everything in flight fails, naming it and why."""
        with self._lock:
            stopping = self._stopping
            self.ended = f"{self.id}: " + ("the server is shutting down" if stopping else f"its runner {cause}")
            delivers, self._deliver = self._deliver, {}
            pending, self._pending = self._pending, {}
            self._failed += len(delivers)
        error = EngineError(self.ended)
        for index, deliver in delivers.items():
            deliver(Failed(index, error))
        for future in pending.values():
            _settle(future, None, error)


def _settle(future: concurrent.futures.Future[Any], result: Any, error: BaseException | None) -> None:
    """Settle ``future`` unless its waiter gave up on it (a cancelled request)."""
    if future.done():
        return
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


class RemoteTokens:
    """A runner's model's vocabulary (`Tokens`), as the server uses it: what
    a load told of it (its size, its markers) kept here, the rest asked of
    the runner, which holds it; a token's text and kind, once known, remembered."""

    def __init__(self, runner: Runner, info: GGUFInfo) -> None:
        self.runner = runner
        self.info = info
        self.vocab = None  # held by the runner alone
        loaded = runner.loaded
        self.n_vocab, self.add_bos = loaded.n_vocab, loaded.add_bos
        self._bos, self._eos = loaded.bos_token, loaded.eos_token
        self._pieces = runner.pieces  # the runner sends the pieces its log-probabilities name
        self._eog: dict[int, bool] = {}
        self._special: dict[int, bool] = {}

    def _remembered(self, table: dict[int, Any], what: str, token: int) -> Any:
        known = table.get(token)
        if known is None:
            known = table[token] = self.runner.ask(what, token)
        return known

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        tokens: list[int] = self.runner.ask("tokenize", text, add_special=add_special, parse_special=parse_special)
        return tokens

    def piece(self, token: int) -> bytes:
        piece: bytes = self._remembered(self._pieces, "piece", token)
        return piece

    def detokenize(self, tokens: list[int]) -> str:
        text: str = self.runner.ask("detokenize", tokens)
        return text

    def is_eog(self, token: int) -> bool:
        return bool(self._remembered(self._eog, "is_eog", token))

    def token_text(self, token: int) -> str:
        text: str = self.runner.ask("token_text", token)
        return text

    def is_special(self, token: int) -> bool:
        return bool(self._remembered(self._special, "is_special", token))

    @property
    def bos_token(self) -> str:
        return self._bos

    @property
    def eos_token(self) -> str:
        return self._eos


def start_runner(plan: ModelPlan, run: Assembled, *, hang_s: float = DEFAULT_HANG_S) -> ServedModel:
    """``plan``'s model loaded as ``run`` says, in a runner process of its own."""
    runner = Runner(plan, run, hang_s=hang_s)
    try:
        return ServedModel(
            plan.id,
            plan.names,
            RemoteTokens(runner, run.info),
            runner,
            describe(plan.info),
            runner.loaded,
            plan.system,
            plan=plan,
            chat=not makes_embeddings(plan.info),
        )
    except BaseException:
        runner.stop()
        raise
