"""Each served model in a runner process of its own, as the server sees it.

`start_runner` starts ``python -m localrun.serve.runner_process`` on one
end of a Unix socket pair (never a network port), sends it the model's
plan and waits for its load; the `ServedModel` it gives holds the model's
vocabulary here (requests are rendered and tokenized where they arrive) and
a `Runner` as its backend: requests go to the runner whole, their text
comes back token by token, and the runner's heartbeat says how far its
engine has got.

The server holds nothing of the model itself, not even its vocabulary:
`RemoteTokens` asks the runner to tokenize (a request's prompt, a
grammar's markers) and remembers what does not change (a token's text).

A runner that dies (killed, aborted, out of memory) costs only its own
requests: each ends with an error naming the model and the cause, and the
model is loaded again on its next request (the router reaps it). One that
hangs (no heartbeat, or an engine that stopped moving with requests
admitted) for ``hang_s`` is killed and counts as died. An unload is the
runner's exit: everything it held goes back to the system with it.
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
from localrun.runtime.engine import Tokens
from localrun.serve.runner_process import HEARTBEAT_S
from localrun.serve.served import Handler, Loaded, ModelPlan, ServedModel
from localrun.serve.worker import Deliver, Failed, WorkerStatus, admit

DEFAULT_HANG_S = 120.0  # a runner silent, or stuck with requests admitted, this long is replaced
STOP_S = 30.0  # a runner told to stop that has not ended by then is killed
ASK_S = 30.0  # a question of the vocabulary not answered by then is an error (the runner hangs)


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

    def __init__(self, plan: ModelPlan, run: Assembled, *, hang_s: float = DEFAULT_HANG_S) -> None:
        self.id = plan.id
        self.hang_s = hang_s
        self.max_queue = plan.max_queue
        self.ended: str | None = None  # why it serves no more (None while it does)
        self._lock = threading.Lock()  # the sends, and the requests and calls in flight
        self._deliver: dict[int, Deliver] = {}  # every request submitted and not yet ended
        self._pending: dict[int, concurrent.futures.Future[Any]] = {}  # calls and questions not yet answered
        self._indexes = itertools.count()
        self._requests = itertools.count()
        self._said: list[str] = []
        self._done = self._cancelled = self._failed = 0
        self._stopping = False
        self._hung: str | None = None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "localrun.serve.runner_process", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C at the server's terminal is the server's to handle
            )
        self.conn = Connection(ours.detach())
        try:
            self.loaded = self._load(plan, run)
        except BaseException:
            self._kill()
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

    def _load(self, plan: ModelPlan, run: Assembled) -> Loaded:
        """Send the plan; what the load measured, once the runner has loaded
        it (it says every second that it still loads: silent for ``hang_s``, it is killed)."""
        self.conn.send((plan, run))
        heard = time.monotonic()
        try:
            while True:
                if not self.conn.poll(HEARTBEAT_S):
                    if time.monotonic() - heard > self.hang_s:
                        self._kill()
                        raise EngineError(f"{plan.id}: its runner stopped answering while loading, and was killed")
                    continue
                kind, said = self.conn.recv()
                if kind != "loading":
                    break
                heard = time.monotonic()
        except (EOFError, OSError):
            raise EngineError(f"{plan.id}: its runner {_cause(self.proc.wait())} while loading") from None
        if kind == "failed":
            raise said if isinstance(said, LocalrunError) else EngineError(str(said))
        assert isinstance(said, Loaded)
        return said

    # -- the backend, from the handlers --

    def next_index(self) -> int:
        return next(self._indexes)

    def _send(self, *message: Any) -> None:
        with contextlib.suppress(OSError):  # it ended: the reader fails what is in flight
            self.conn.send(message)

    def submit(self, request: BatchRequest, deliver: Deliver) -> None:
        check_request(request, self.capacity)
        with self._lock:
            if self.ended is not None:
                raise EngineError(self.ended, hint="it loads again on its next request")
            admit(len(self._deliver), self.parallel, self.max_queue, self._stopping)
            if not self._deliver and not self._pending:
                self._moved_at = time.monotonic()  # idle until now: the engine had no reason to move
            self._deliver[request.index] = deliver
            self._send("submit", request)

    def cancel(self, index: int) -> None:
        with self._lock:
            if self._deliver.pop(index, None) is not None:
                self._cancelled += 1
                self._send("cancel", index)

    def _request(self, *message: Any) -> tuple[int, concurrent.futures.Future[Any]]:
        """Send ``message`` with a number of its own; the future its answer settles."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if self.ended is not None:
                raise EngineError(self.ended, hint="it loads again on its next request")
            ident = next(self._requests)
            if not self._deliver and not self._pending:
                self._moved_at = time.monotonic()  # idle until now: the engine had no reason to move
            self._pending[ident] = future
            self._send(message[0], ident, *message[1:])
        return ident, future

    async def call(self, handler: Handler, body: dict[str, Any]) -> dict[str, Any]:
        """``handler(model, body)`` in the runner, on the model it loaded."""
        _, future = self._request("call", handler, body)
        result: dict[str, Any] = await asyncio.wrap_future(future)
        return result

    def ask(self, what: str, *args: Any, **kwargs: Any) -> Any:
        """``engine.WHAT(*args, **kwargs)`` of the model's vocabulary, in the runner (`RemoteTokens`)."""
        ident, future = self._request("ask", what, args, kwargs)
        try:
            return future.result(ASK_S)
        except concurrent.futures.TimeoutError:
            with self._lock:
                self._pending.pop(ident, None)
            raise EngineError(f"{self.id}: its runner did not answer within {ASK_S:g} s") from None

    def status(self) -> WorkerStatus:
        """Its requests as counted here, where they are sent and end (the
        runner's scheduler gives a slot at its next step to each request
        that has one free); its tokens as its last heartbeat said."""
        with self._lock:
            admitted = len(self._deliver) + len(self._pending)
            done, cancelled, failed = self._done, self._cancelled, self._failed
        busy = min(admitted, self.parallel)
        beat = self._beat
        return WorkerStatus(
            parallel=self.parallel,
            busy=busy,
            queued=admitted - busy,
            done=done,
            cancelled=cancelled,
            failed=failed,
            generated_tokens=beat.generated_tokens if beat is not None else 0,
            tokens_per_s=beat.tokens_per_s if beat is not None else 0.0,
        )

    def notices(self) -> list[str]:
        said, self._said = self._said, []
        return said

    def stop(self, timeout: float | None = None) -> None:
        """Tell the runner to end (the requests it still has end with an
        error saying the server is shutting down), and wait for it; killed
        if it has not ended within ``timeout`` (`STOP_S`)."""
        with self._lock:
            self._stopping = True
            if self.proc.poll() is None:
                self._send("stop")
        try:
            self.proc.wait(STOP_S if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            self._kill()
        self._reader.join(10)
        self.conn.close()

    def kill(self) -> None:
        """SIGKILL the runner (what a crash would do): its requests fail, the model reloads on its next."""
        self._kill()

    def _kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    # -- the reader thread --

    def _read(self) -> None:
        while True:
            try:
                if self.conn.poll(HEARTBEAT_S):
                    self._take(self.conn.recv())
            except (EOFError, OSError):
                break
            self._watch()
        try:
            code: int | None = self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self._kill()
            code = self.proc.returncode
        self._end(self._hung or _cause(code))

    def _take(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "events":
            self._events(message[1])
        elif kind == "beat":
            _, status, notices, progress = message
            now = time.monotonic()
            self._beat, self._beat_at = status, now
            self._said += notices
            if progress != self._progress:
                self._progress, self._moved_at = progress, now
        elif kind == "answered":
            _, ident, result, error = message
            with self._lock:
                future = self._pending.pop(ident, None)
            if future is not None and error is not None:
                future.set_exception(error)
            elif future is not None:
                future.set_result(result)

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
        """Kill a runner that hangs: no heartbeat, or its engine not moving with work admitted."""
        now = time.monotonic()
        with self._lock:
            working = bool(self._deliver or self._pending)
        if self._hung is not None or self._stopping or self.proc.poll() is not None:
            return
        if now - self._beat_at > self.hang_s:
            self._hung = f"stopped answering (no heartbeat for {self.hang_s:g} s) and was replaced"
        elif working and now - self._moved_at > self.hang_s:
            self._hung = f"made no progress for {self.hang_s:g} s with requests running, and was replaced"
        if self._hung is not None:
            self._kill()

    def _end(self, cause: str) -> None:
        """The runner is gone: everything in flight fails, naming it and why."""
        with self._lock:
            self.ended = f"{self.id}: its runner {cause}"
            delivers, self._deliver = self._deliver, {}
            pending, self._pending = self._pending, {}
            self._failed += len(delivers)
        if self._stopping and not delivers and not pending:
            return
        error = EngineError(self.ended, hint="it loads again on its next request")
        for index, deliver in delivers.items():
            deliver(Failed(index, error))
        for future in pending.values():
            future.set_exception(error)


class RemoteTokens(Tokens):
    """A runner's model's vocabulary, as the server uses it: what a load
    told of it (its size, its markers) kept here, the rest asked of the
    runner; a token's text, once asked, remembered."""

    def __init__(self, runner: Runner, info: GGUFInfo) -> None:
        self.runner = runner
        self.info = info
        self.vocab = None  # held by the runner alone
        loaded = runner.loaded
        self.n_vocab, self.add_bos = loaded.n_vocab, loaded.add_bos
        self._bos, self._eos = loaded.bos_token, loaded.eos_token
        self._pieces, self._eog = {}, {}
        self._specials: dict[int, bool] = {}

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        tokens: list[int] = self.runner.ask("tokenize", text, add_special=add_special, parse_special=parse_special)
        return tokens

    def piece(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self.runner.ask("piece", token)
        return piece

    def detokenize(self, tokens: list[int]) -> str:
        text: str = self.runner.ask("detokenize", tokens)
        return text

    def is_eog(self, token: int) -> bool:
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = self.runner.ask("is_eog", token)
        return eog

    def token_text(self, token: int) -> str:
        text: str = self.runner.ask("token_text", token)
        return text

    def is_special(self, token: int) -> bool:
        special = self._specials.get(token)
        if special is None:
            special = self._specials[token] = self.runner.ask("is_special", token)
        return special

    @property
    def bos_token(self) -> str:
        return self._bos

    @property
    def eos_token(self) -> str:
        return self._eos


def start_runner(plan: ModelPlan, run: Assembled, *, hang_s: float = DEFAULT_HANG_S) -> ServedModel:
    """``plan``'s model loaded as ``run`` says, in a runner process of its own."""
    runner = Runner(plan, run, hang_s=hang_s)
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
