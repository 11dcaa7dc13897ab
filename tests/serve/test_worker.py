"""The engine thread's admission (`localrun.serve.worker.Worker`): what it
counts against its slots and its queue, on a real engine."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from localrun.errors import ServerBusyError
from localrun.events import SequenceDone
from localrun.runtime.batch.scheduler import BatchRequest
from localrun.runtime.engine import Engine
from localrun.serve.worker import JobEvent, Worker
from tests.helpers import engine_config


def test_a_cancelled_request_leaves_the_queue_at_once(long_model: Path) -> None:
    """A client that drops its streams and asks again at once is admitted:
    the requests it dropped count against the queue no longer, though the
    engine thread frees their slot only at its next step (a runner process
    gets the cancels and the new request in one go)."""
    with Engine(engine_config(long_model, n_ctx=4096, n_threads=2)) as engine:
        worker = Worker(engine, 1, 4096, max_queue=1)
        worker.start()
        try:
            prompt = engine.tokenize("go")
            started = threading.Event()
            running = BatchRequest(worker.next_index(), prompt, max_tokens=30000)
            worker.submit(running, lambda event: started.set())
            assert started.wait(60)  # it holds the one slot
            waiting = BatchRequest(worker.next_index(), prompt, max_tokens=4)
            worker.submit(waiting, lambda event: None)
            with pytest.raises(ServerBusyError, match="1 requests wait already"):
                worker.submit(BatchRequest(worker.next_index(), prompt, max_tokens=4), lambda event: None)
            worker.cancel(running.index)
            worker.cancel(waiting.index)
            answered: list[JobEvent] = []
            done = threading.Event()

            def deliver(event: JobEvent) -> None:
                answered.append(event)
                if isinstance(event, SequenceDone):
                    done.set()

            worker.submit(BatchRequest(worker.next_index(), prompt, max_tokens=2), deliver)
            assert done.wait(60)
            finished = answered[-1]
            assert isinstance(finished, SequenceDone) and finished.stats.generated_tokens == 2
        finally:
            worker.stop(30)
