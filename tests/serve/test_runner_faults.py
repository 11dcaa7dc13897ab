"""The server's side of a runner that misbehaves (a stand-in runner,
`tests/serve/fake_runner.py`): no handler blocks on it, and it is ended
with every request it holds failed, whatever it did."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from localrun.runtime.batch.scheduler import BatchRequest
from localrun.serve.runner import Runner
from localrun.serve.worker import Failed, JobEvent
from tests.serve.test_served import plan


class Ends:
    """Each request's end, as the runner's reader delivers it."""

    def __init__(self) -> None:
        self.events: dict[int, JobEvent] = {}
        self.all = threading.Event()
        self.expected = 0

    def deliver(self, event: JobEvent) -> None:
        self.events[event.index] = event
        if len(self.events) == self.expected:
            self.all.set()


def test_a_runner_that_stops_reading_holds_no_handler_and_is_replaced(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_RUNNER", "silent")
    served = plan(tiny_model, "fake", max_queue=16)
    runner = Runner(served, served.run, hang_s=3, program="tests.serve.fake_runner")
    ends = Ends()
    ends.expected = 8
    t0 = time.monotonic()
    for _ in range(ends.expected):  # megabytes no one reads: more than the socket holds
        runner.submit(BatchRequest(runner.next_index(), [7] * 200_000), ends.deliver)
    assert time.monotonic() - t0 < 2.5  # queued, not sent from the handler's thread
    assert runner.status().busy + runner.status().queued == ends.expected
    assert ends.all.wait(30)
    assert all(isinstance(e, Failed) and "stopped answering" in e.error.message for e in ends.events.values())
    assert runner.ended is not None and runner.proc.poll() is not None  # killed, and reaped
    assert runner.status().busy == runner.status().queued == 0
    runner.stop()


def test_a_runner_that_says_what_cannot_be_read_is_ended(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_RUNNER", "garbage")
    served = plan(tiny_model, "fake", max_queue=16)
    runner = Runner(served, served.run, hang_s=60, program="tests.serve.fake_runner")
    ends = Ends()
    ends.expected = 1
    runner.submit(BatchRequest(runner.next_index(), [7, 8, 9]), ends.deliver)
    assert ends.all.wait(30)  # not left waiting for ever on a reader that died
    (event,) = ends.events.values()
    assert isinstance(event, Failed) and "could not be understood" in event.error.message
    assert runner.proc.poll() is not None
    runner.stop()
