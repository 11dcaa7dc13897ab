"""The engine thread: one per served model, driving its continuous batch.

Requests arrive from the HTTP handlers (any thread) through `Worker.submit`;
the thread hands them to the scheduler at its next step, so a new request
joins the running batch without waiting for the others. Each request's text
and end go back through the callback it was submitted with, called on the
engine thread. `cancel` frees a request's slot before the next step.

Embeddings (`Worker.embed`) decode on the same thread, on the model's
embedding context, between the batch's steps: the inputs of every request
waiting then are packed into one run. llama.cpp's threads for them are this
thread's, which ends when the model unloads; nothing of them stays behind
on a thread of the server's pool.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from localrun.errors import EngineError, LocalrunError, ServerBusyError, engine_failure
from localrun.events import SequenceDone, SequenceReasoning, SequenceText
from localrun.runtime.batch.scheduler import BatchRequest, ContinuousBatch
from localrun.runtime.embed import Embedder
from localrun.runtime.engine import Engine
from localrun.runtime.promptcache import PromptCache
from localrun.serve.own_thread import in_own_thread
from localrun.speculative import Speculation

_M = TypeVar("_M")  # a served model
_R = TypeVar("_R")

RATE_WINDOW_S = 5.0  # the aggregate decode rate is measured over this much recent time


@dataclass(frozen=True)
class Failed:
    """A request ended by an error (a failed decode, the server shutting down)."""

    index: int
    error: LocalrunError


JobEvent = SequenceText | SequenceReasoning | SequenceDone | Failed
Deliver = Callable[[JobEvent], None]


def admit(admitted: int, parallel: int, max_queue: int, stopping: bool) -> None:
    """Refuse one more request beside ``admitted`` ones: a server shutting
    down, or every slot busy and ``max_queue`` waiting already."""
    if stopping:
        raise ServerBusyError("the server is shutting down")
    if admitted >= parallel + max_queue:
        raise ServerBusyError(
            f"all {parallel} slots are busy and {max_queue} requests wait already", hint="retry later"
        )


@dataclass(eq=False)
class _EmbedJob:
    """One request's inputs for the embedding context, and where their pooled outputs go."""

    inputs: list[list[int]]
    result: Future[list[np.ndarray]] = field(default_factory=Future)


@dataclass(frozen=True)
class WorkerStatus:
    parallel: int
    busy: int  # slots decoding or evaluating a prompt
    queued: int  # requests admitted and waiting for a slot
    done: int
    cancelled: int
    failed: int
    generated_tokens: int
    tokens_per_s: float  # all slots together, over the last RATE_WINDOW_S


class Worker:
    """``parallel`` slots of ``capacity`` tokens on ``engine``; at most
    ``max_queue`` requests wait beyond the busy slots, more are refused
    (`ServerBusyError`)."""

    ended: str | None = None  # a thread in the server's own process ends only with it

    @property
    def pid(self) -> int:
        return os.getpid()

    def __init__(
        self,
        engine: Engine,
        parallel: int,
        capacity: int,
        *,
        max_queue: int,
        name: str = "engine",
        speculation: Speculation | None = None,
        prompt_cache: PromptCache | None = None,
        embedder: Embedder | None = None,
    ) -> None:
        self.engine = engine
        self.embedder = embedder  # the model's embedding context: `embed` runs on it
        self.run = ContinuousBatch(
            engine,
            parallel,
            capacity,
            reuse_prefix=True,
            stream=True,
            speculation=speculation,
            prompt_cache=prompt_cache,
        )
        self.parallel = len(self.run.slots)
        self.capacity = capacity
        self.max_queue = max_queue
        self._cond = threading.Condition()
        self._incoming: list[BatchRequest] = []
        self._cancels: list[int] = []
        self._embeds: list[_EmbedJob] = []
        self._deliver: dict[int, Deliver] = {}  # every admitted request not yet ended
        self._stopping = False
        self._failed = 0
        self._indexes = itertools.count()
        self._samples: deque[tuple[float, int]] = deque(maxlen=64)
        self._thread = threading.Thread(target=self._loop, name=f"localrun-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def next_index(self) -> int:
        return next(self._indexes)

    # -- from the handlers --

    def submit(self, request: BatchRequest, deliver: Deliver) -> None:
        """Admit ``request`` (its index from `next_index`), or refuse it: a
        prompt the slot cannot hold, a full queue, a server shutting down."""
        self.run.check(request)
        with self._cond:
            admit(len(self._deliver), self.parallel, self.max_queue, self._stopping)
            self._deliver[request.index] = deliver
            self._incoming.append(request)
            self._cond.notify()

    def call_blocking(self, handler: Callable[[_M, dict[str, Any]], _R], model: _M, body: dict[str, Any]) -> _R:
        """``handler(model, body)`` on the calling thread."""
        return handler(model, body)

    async def call(self, handler: Callable[[_M, dict[str, Any]], _R], model: _M, body: dict[str, Any]) -> _R:
        """``handler(model, body)`` on a thread of its own (it ends with it): a
        handler that decodes hands its work to this engine thread."""
        return await in_own_thread(handler, model, body)

    def embed(self, inputs: Sequence[list[int]]) -> Future[list[np.ndarray]]:
        """Each input's pooled output (a vector, or a rank head's scores), raw,
        in order, once the engine thread has run them on the embedding
        context with whatever other requests' inputs wait then."""
        if self.embedder is None:
            raise EngineError("this model has no embedding context")
        job = _EmbedJob([list(tokens) for tokens in inputs])
        with self._cond:
            if self._stopping:
                raise ServerBusyError("the server is shutting down")
            self._embeds.append(job)
            self._cond.notify()
        return job.result

    def embed_now(self, inputs: Sequence[list[int]]) -> list[np.ndarray]:
        """`embed`, waiting for the outputs (from a thread that is not the engine's)."""
        return self.embed(inputs).result()

    def cancel(self, index: int) -> None:
        """Drop request ``index`` (nothing if it has ended): it is no longer
        admitted, so a request submitted right after it finds its place in
        the queue, and nothing more is delivered to it; the engine thread
        frees its slot at its next step."""
        with self._cond:
            if self._deliver.pop(index, None) is not None:
                self._cancels.append(index)
                self._cond.notify()

    def stop(self, timeout: float | None = None) -> None:
        """End every request still admitted and the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def notices(self) -> list[str]:
        """What the scheduler had to say since the last call (the prompt cache's warnings)."""
        taken = []
        while self.run.warnings:  # appended to by the engine thread and the cache's writer: pop is atomic
            taken.append(self.run.warnings.pop(0))
        return taken

    def status(self) -> WorkerStatus:
        with self._cond:
            admitted = len(self._deliver)
        busy = self.run.active
        return WorkerStatus(
            parallel=self.parallel,
            busy=busy,
            queued=max(admitted - busy, 0),
            done=self.run.done,
            cancelled=self.run.cancelled,
            failed=self._failed,
            generated_tokens=self.run.generated,
            tokens_per_s=self._rate(),
        )

    def _rate(self) -> float:
        now = time.perf_counter()
        recent = [(t, n) for t, n in list(self._samples) if now - t <= RATE_WINDOW_S]
        if not recent:
            return 0.0
        t0, n0 = recent[0]
        return (self.run.generated - n0) / (now - t0) if now > t0 else 0.0

    # -- the engine thread --

    def _end(self, index: int, event: JobEvent | None) -> None:
        with self._cond:
            deliver = self._deliver.pop(index, None)
        if deliver is not None and event is not None:
            deliver(event)

    def _take(self) -> tuple[list[BatchRequest], list[int], list[_EmbedJob], bool]:
        with self._cond:
            while not (self._incoming or self._cancels or self._embeds or self._stopping or self.run.busy):
                self._cond.wait()
            incoming, self._incoming = self._incoming, []
            cancels, self._cancels = self._cancels, []
            embeds, self._embeds = self._embeds, []
            return incoming, cancels, embeds, self._stopping

    def _loop(self) -> None:
        embeds: list[_EmbedJob] = []
        try:
            while True:
                incoming, cancels, embeds, stopping = self._take()
                for request in incoming:
                    self.run.submit(request)
                for index in cancels:  # their deliveries went when they were cancelled
                    self.run.cancel(index)
                if stopping:
                    for index in self.run.cancel_all():
                        self._end(index, Failed(index, ServerBusyError("the server is shutting down")))
                    return
                self._run_embeds(embeds)
                if self.run.busy:
                    self._step()
        finally:
            with self._cond:
                embeds += self._embeds
                self._embeds = []
            for job in embeds:
                if not job.result.done():
                    job.result.set_exception(ServerBusyError("the server is shutting down"))
            self.run.close()

    def _run_embeds(self, jobs: list[_EmbedJob]) -> None:
        """Every waiting request's inputs in one run of the embedding context
        (packed into as few decodes as it holds), each request's outputs back to it."""
        if not jobs:
            return
        assert self.embedder is not None  # `embed` takes no job without it
        inputs = [tokens for job in jobs for tokens in job.inputs]
        try:
            outputs = self.embedder.run(inputs)
        except Exception as exc:  # a failed decode fails these requests, not the server
            error = engine_failure(exc)
            self._failed += len(jobs)
            for job in jobs:
                job.result.set_exception(error)
            return
        start = 0
        for job in jobs:
            job.result.set_result(outputs[start : start + len(job.inputs)])
            start += len(job.inputs)

    def _step(self) -> None:
        try:
            _, events = self.run.step()
        except Exception as exc:  # a failed decode ends the running requests, not the server
            error = engine_failure(exc)
            for index in self.run.reset():
                self._failed += 1
                self._end(index, Failed(index, error))
            return
        now = time.perf_counter()
        if not self._samples or now - self._samples[-1][0] >= RATE_WINDOW_S / 20:
            self._samples.append((now, self.run.generated))
        for event in events:
            if isinstance(event, SequenceDone):
                self._end(event.index, event)
                continue
            with self._cond:
                deliver = self._deliver.get(event.index)
            if deliver is not None:
                deliver(event)
