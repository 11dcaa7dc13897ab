"""The thread governor: its policy on fixed figures (no clock), and the
thread count a real generation reports."""

from __future__ import annotations

import io
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from localrun.events import TokenEvent
from localrun.runtime import threads as threads_mod
from localrun.runtime.engine import Engine
from localrun.runtime.generate import generate
from localrun.runtime.sampling import SamplingParams
from localrun.runtime.threads import BLIND_GAP, CONFIRM, EARLY, MAX_GAP, WINDOW, ThreadGovernor
from localrun.speculative import open_speculation
from localrun.ui.stream import JsonRenderer, footer
from tests.helpers import collect, engine_config

GREEDY = SamplingParams(temperature=0.0)


@dataclass
class Machine:
    """A step's wall seconds and the process's CPU seconds over it, by thread
    count, under a given load: fixed figures, shaped like one 2-core machine's."""

    walls: dict[int, float]
    shares: dict[int, float]  # the CPU each of our threads gets, as a fraction of the wall time

    def step(self, n: int, k: int) -> tuple[float, float]:
        wall = self.walls[n] * (1.0 + 0.01 * (k % 5 - 2))  # a little deterministic jitter
        return wall, wall * n * self.shares[n]


IDLE = Machine({1: 1 / 21.1, 2: 1 / 37.6}, {1: 1.0, 2: 0.995})
BUSY = Machine({1: 1 / 13.1, 2: 1 / 8.4}, {1: 2 / 3, 2: 0.5})  # 2 other busy processes on 2 cores
# one other busy process on 4 cores: our threads lose a little CPU, but 4 threads still decode fastest
CROWDED = Machine({1: 0.1, 2: 0.055, 3: 0.04, 4: 0.033}, {1: 1.0, 2: 1.0, 3: 1.0, 4: 0.8})
# one other busy process on 2 cores: 1 thread has a core to itself and is faster
HALF = Machine({1: 1 / 20.0, 2: 1 / 12.0}, {1: 1.0, 2: 2 / 3})


def drive(gov: ThreadGovernor, machine: Machine, steps: int, rows: int = 1) -> list[int]:
    """The thread count of each step, as a decode loop would run them (steps of ``rows`` sequences)."""
    counts = []
    n = gov.running
    for k in range(steps):
        counts.append(n)
        n = gov.observe(*machine.step(n, k), rows)
    return counts


def rare(counts: list[int], n: int) -> bool:
    """At most one probe window (at ``n`` threads) per MAX_GAP windows: the gap has doubled to its longest."""
    return counts.count(n) <= WINDOW * (len(counts) // (MAX_GAP * WINDOW) + 1)


def test_idle_machine_never_probes() -> None:
    gov = ThreadGovernor(2)
    assert set(drive(gov, IDLE, 5000)) == {2}
    gov4 = ThreadGovernor(4)
    idle4 = Machine({1: 0.1, 2: 0.055, 3: 0.04, 4: 0.03}, dict.fromkeys((1, 2, 3, 4), 0.99))
    assert set(drive(gov4, idle4, 5000)) == {4}


def test_one_window_that_reads_a_passing_task_probes_nothing() -> None:
    """A short step on an idle machine loses some of its threads' time to their
    own sleeping, and the machine then decides: a reading that catches a task
    passing by (a kernel thread, the next process of a pipeline starting) in one
    window, and not the next, is not contention."""
    sleepy = Machine({1: 1 / 400.0, 2: 1 / 650.0}, {1: 1.0, 2: 0.85})  # 0.3 cores lost, nothing else running
    readings = itertools.count()

    def free_cpus() -> int:
        return 1 if next(readings) % 40 == 7 else 2  # now and then, one reading sees another task

    gov = ThreadGovernor(2, free_cpus=free_cpus)
    assert set(drive(gov, sleepy, 4000)) == {2}
    busy = ThreadGovernor(2, free_cpus=lambda: 1)  # a task that stays: a probe down after CONFIRM windows
    counts = drive(busy, sleepy, (CONFIRM + 1) * WINDOW)
    assert counts.index(1) == CONFIRM * WINDOW


def test_contention_moves_down_and_stays() -> None:
    gov = ThreadGovernor(2)
    counts = drive(gov, BUSY, 4000)
    assert gov.threads == 1
    assert counts.index(1) <= 2 * WINDOW  # the first window shows contention, the second probes and wins
    later = counts[1000:]
    assert later.count(2) <= 0.05 * len(later)  # probes up grow rarer as they lose


def test_fewer_threads_kept_where_they_have_the_cores_to_themselves() -> None:
    gov = ThreadGovernor(2)
    counts = drive(gov, HALF, 4000)
    assert gov.threads == 1
    assert rare(counts[2000:], 2)


def test_contention_where_all_threads_are_still_best_stays() -> None:
    gov = ThreadGovernor(4)
    counts = drive(gov, CROWDED, 6000)
    assert gov.threads == 4
    assert min(counts) == 3  # it probed one fewer, never further
    assert rare(counts[3000:], 3)  # and the probes grow rarer


def test_returns_to_all_threads_when_the_load_goes() -> None:
    gov = ThreadGovernor(2)
    drive(gov, BUSY, 2000)
    assert gov.threads == 1
    counts = drive(gov, IDLE, 2000)
    assert gov.threads == 2
    assert counts.index(2) <= 3 * WINDOW  # the contention signal cleared: a probe up at once
    assert set(counts[4 * WINDOW :]) == {2}  # and then no more probing


def test_a_start_below_the_count_for_a_busy_machine() -> None:
    """Other processes seen running at the start: fewer threads at once; where
    they were passing (the machine is idle), the first window probes back up."""
    busy = ThreadGovernor(2)
    busy.start_below(1)
    counts = drive(busy, BUSY, 2000)
    assert counts[: 4 * WINDOW] == [1] * (4 * WINDOW) and busy.threads == 1
    idle = ThreadGovernor(2)
    idle.start_below(1)
    counts = drive(idle, IDLE, 500)
    assert counts.index(2) <= 2 * WINDOW and idle.threads == 2
    assert set(counts[3 * WINDOW :]) == {2}


def test_others_running_reads_the_machine() -> None:
    assert threads_mod.others_running() >= 0


def test_returns_even_when_the_load_end_is_invisible() -> None:
    """With one thread on a core of its own, the other process's end shows in
    nothing this process measures: the doubling probe up finds it."""
    gov = ThreadGovernor(2)
    drive(gov, HALF, 3000)
    assert gov.threads == 1
    counts = drive(gov, IDLE, (MAX_GAP + 4) * WINDOW)
    assert gov.threads == 2 and counts[-1] == 2


def test_walks_down_several_steps_and_back() -> None:
    busy4 = Machine({1: 0.06, 2: 0.07, 3: 0.09, 4: 0.12}, {1: 0.8, 2: 4 / 6, 3: 4 / 7, 4: 0.5})  # 4 busy on 4 cores
    idle4 = Machine({1: 0.1, 2: 0.055, 3: 0.04, 4: 0.03}, dict.fromkeys((1, 2, 3, 4), 1.0))
    gov = ThreadGovernor(4)
    counts = drive(gov, busy4, 3000)
    assert gov.threads == 1 and counts.index(1) <= 5 * WINDOW
    drive(gov, idle4, (MAX_GAP + 10) * WINDOW)
    assert gov.threads == 4


def test_pinned_never_changes() -> None:
    for gov in (ThreadGovernor(2, adapt=False), ThreadGovernor(1), ThreadGovernor(4, threads=2, adapt=False)):
        start = gov.threads
        assert set(drive(gov, BUSY if gov.max_threads <= 2 else CROWDED, 3000)) == {start}
        assert not gov.active


def test_resume_drops_a_running_probe() -> None:
    gov = ThreadGovernor(2)
    drive(gov, BUSY, CONFIRM * WINDOW)  # windows judged contended: the next is a probe
    assert gov.running == 1 and gov.threads == 2
    assert gov.resume(gov.threads) == 2 and gov.running == 2


def test_footer_shows_the_thread_count() -> None:
    assert "2 threads" in footer(40, 11.5, 0.8, 4.2, "length", threads=2).plain
    assert "1 thread " in footer(40, 11.5, 0.8, 4.2, "length", threads=1).plain + " "
    narrow = footer(40, 11.5, 0.8, 4.2, "length", threads=2, width=60).plain
    assert "thread" not in narrow and narrow.startswith("40 tokens") and narrow.endswith("stop: length")


# -- on a real (tiny) model --


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> Iterator[Engine]:
    with Engine(engine_config(tiny_model, n_ctx=512, n_threads=2)) as eng:
        yield eng


def test_done_event_reports_the_thread_count(engine: Engine) -> None:
    assert engine.threads == engine.max_threads == 2
    out = io.StringIO()
    stats = JsonRenderer(out).render(generate(engine, engine.tokenize("the cat"), GREEDY, max_tokens=40))
    done = json.loads(out.getvalue().splitlines()[-1])
    assert done["type"] == "done" and done["threads"] == stats.threads == engine.threads
    assert stats.threads in (1, 2)
    shares = done["thread_shares"]  # the share of the decode steps at each count, for the history
    assert set(shares) <= {"1", "2"} and abs(sum(shares.values()) - 1) < 0.01

    spec = open_speculation(engine, "lookup")
    assert spec is not None
    events = list(spec.generate(engine, engine.tokenize("the cat"), GREEDY, max_tokens=40))
    assert all(e.threads in (1, 2) for e in events if isinstance(e, TokenEvent))
    _, stats = collect(events)
    assert stats.threads == engine.threads


def test_pinned_engine_keeps_its_count(tiny_model: Path) -> None:
    with Engine(engine_config(tiny_model, n_ctx=256, n_threads=2, adapt_threads=False)) as eng:
        with pytest.raises(ValueError):
            eng.set_threads(0)
        eng.set_threads(1)
        _, stats = collect(generate(eng, eng.tokenize("the cat"), GREEDY, max_tokens=60))
        assert stats.threads == eng.threads == 1


class Flipping(ThreadGovernor):
    """Changes the count at every step."""

    def observe(self, wall_s: float, cpu_s: float, rows: int = 1) -> int:
        self.threads = 3 - self.threads
        return self.threads


def test_changing_threads_while_generating(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    with_two, _ = collect(generate(engine, engine.tokenize("on the"), GREEDY, max_tokens=50))
    monkeypatch.setitem(threads_mod._governors, engine, Flipping(2))
    text, stats = collect(generate(engine, engine.tokenize("on the"), GREEDY, max_tokens=50))
    assert stats.generated_tokens == 50 and stats.threads == engine.threads
    assert text == with_two  # a row's dot products do not depend on how the rows are split among threads


# -- the load read, and probes cut short --


class Load:
    """A fake load reading: the CPUs other tasks leave free, set by the test."""

    def __init__(self, free: int | None) -> None:
        self.free = free
        self.reads = 0

    def __call__(self) -> int | None:
        self.reads += 1
        return self.free


def test_no_probe_up_at_once_while_the_load_read_leaves_no_cpu() -> None:
    """One other busy process on 2 CPUs, seen at the start: the count stays
    down; a probe up waits its gap (it does not run at once, as it would where
    the load cannot be read), and the gaps double as the probes lose."""
    load = Load(free=1)
    gov = ThreadGovernor(2, free_cpus=load)
    gov.start_below(1)
    counts = drive(gov, HALF, 4000)
    assert gov.threads == 1 and load.reads > 0
    starts = [i // WINDOW for i, n in enumerate(counts) if n == 2 and counts[i - 1] == 1]
    assert starts[0] >= BLIND_GAP  # one sequence: a blind probe up waits BLIND_GAP windows, not MIN_GAP
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # rarer and rarer, to one per MAX_GAP windows (a probe cut short after its first steps counts as a
    # window: the steps' windows and the governor's drift apart by one)
    assert all(b >= a - 1 for a, b in itertools.pairwise(gaps)) and gaps[-1] >= MAX_GAP
    assert all(counts[i : i + EARLY + 1].count(2) <= EARLY for i in range(len(counts)))  # each cut short
    blind = ThreadGovernor(2)
    blind.start_below(1)
    counts = drive(blind, HALF, 4 * WINDOW)
    assert 2 in counts[: 2 * WINDOW]  # without the reading, a clear window probes up at once


def test_a_thread_more_that_wins_under_load_is_found() -> None:
    """A batch of many sequences: even with another busy process, 2 threads
    decode faster than 1. The load read leaves no CPU, but the probe up on its
    gap finds it, and the count stays up."""
    batch = Machine({1: 1 / 20.0, 2: 1 / 35.0}, {1: 1.0, 2: 0.8})
    gov = ThreadGovernor(2, free_cpus=Load(free=1))
    gov.start_below(1)
    counts = drive(gov, batch, 2000, rows=8)
    assert gov.threads == 2 and counts.index(2) <= 6 * WINDOW
    assert counts[1000:].count(1) <= 0.05 * 1000


@pytest.mark.parametrize("loaded", [2000, 2100, 2350])
def test_probes_up_soon_once_the_load_read_frees_a_cpu(loaded: int) -> None:
    """However far the blind probes' gap has doubled, the read of a free CPU
    after the load's end probes up at once."""
    load = Load(free=1)
    gov = ThreadGovernor(2, free_cpus=load)
    gov.start_below(1)
    drive(gov, HALF, loaded)
    load.free = 2
    counts = drive(gov, IDLE, 40 * WINDOW)
    assert gov.threads == 2 and counts.index(2) <= 2 * WINDOW


class Flickering(Load):
    """A load read that now and then misses the busy task (between its time slices)."""

    def __call__(self) -> int | None:
        self.reads += 1
        return 2 if self.reads % 5 == 0 else 1


def test_one_reading_of_a_free_cpu_amid_a_load_probes_nothing() -> None:
    gov = ThreadGovernor(2, free_cpus=Flickering(free=1))
    gov.start_below(1)
    counts = drive(gov, HALF, 4000)
    assert gov.threads == 1 and rare(counts, 2)


def test_a_probe_up_that_lost_with_a_free_cpu_waits_its_gap() -> None:
    """The read says a CPU is free, yet a thread more is slower (the read is
    wrong, or the cores are not what it counts): the probes do not repeat at
    every window but wait their doubling gap."""
    gov = ThreadGovernor(2, free_cpus=Load(free=2))
    gov.start_below(1)
    counts = drive(gov, HALF, 3000)
    assert gov.threads == 1 and rare(counts[1000:], 2)


def test_a_probe_only_a_little_slower_runs_its_whole_window() -> None:
    """Cut short only when its first steps are far slower: a probe within
    `EARLY_LOSS` of the settled steps runs its window, and the medians decide."""
    close = Machine({1: 1 / 20.0, 2: 1 / 19.0}, {1: 1.0, 2: 1.0})
    gov = ThreadGovernor(2)
    gov.start_below(1)
    counts = drive(gov, close, 40 * WINDOW)
    first = counts.index(2)
    assert counts[first : first + WINDOW] == [2] * WINDOW and gov.threads == 1


def test_the_load_is_not_read_at_the_full_count() -> None:
    load = Load(free=0)
    gov = ThreadGovernor(2, free_cpus=load)
    assert set(drive(gov, IDLE, 2000)) == {2} and load.reads == 0


def test_threads_that_sleep_on_an_idle_machine_are_not_contention() -> None:
    """Steps of a millisecond outlast the spin count between barriers: our
    own threads sleep, and the CPU time says as much time was lost as under
    load. Where the machine says nothing else runs, nothing is probed; where
    it says something does, or cannot say, the count goes down as before."""
    sleepy = Machine({1: 1 / 400.0, 2: 1 / 600.0}, {1: 1.0, 2: 0.6})
    idle = Load(free=2)
    gov = ThreadGovernor(2, free_cpus=idle)
    assert set(drive(gov, sleepy, 2000)) == {2} and idle.reads > 0
    for busy in (Load(free=1), None):
        assert 1 in drive(ThreadGovernor(2, free_cpus=busy), sleepy, 2000)


def test_a_probe_step_far_slower_ends_the_probe_at_once() -> None:
    """A thread more under load can make a step many times slower: one such
    step ends the probe, not a whole window of them."""
    collapse = Machine({1: 1 / 60.0, 2: 1 / 0.5}, {1: 1.0, 2: 0.5})
    gov = ThreadGovernor(2)
    gov.start_below(1)
    counts = drive(gov, collapse, 3000)
    assert gov.threads == 1
    probes = sum(1 for i, n in enumerate(counts) if n == 2 and (i == 0 or counts[i - 1] == 1))
    assert probes >= 1 and counts.count(2) == probes  # each probe took one step


def test_a_dropped_thread_stops_running(tiny_model: Path) -> None:
    """After the count drops to 1, one thread of the process does the decoding:
    the thread dropped sleeps (it neither computes nor spins) while 1-thread
    decodes run. Counts the CPU time of every thread of the process."""
    with Engine(engine_config(tiny_model, n_ctx=256, n_threads=2, adapt_threads=False)) as eng:
        prompt = eng.tokenize("the cat sat on the mat")
        collect(generate(eng, prompt, GREEDY, max_tokens=8))  # the worker pool starts and decodes
        eng.set_threads(1)
        before = _thread_cpu()
        for _ in range(500):
            collect(generate(eng, prompt, GREEDY, max_tokens=200))
            if sum(_thread_cpu().values()) - sum(before.values()) >= 0.6:
                break
    after = _thread_cpu()
    used = sorted((after[t] - before.get(t, 0.0) for t in after), reverse=True)
    assert used[0] >= 0.5
    assert sum(used[1:]) <= 0.1 * used[0], used  # the others: a spin after the first decode at most


def _thread_cpu() -> dict[int, float]:
    """CPU seconds per thread of this process (Linux)."""
    tick = float(os.sysconf("SC_CLK_TCK"))
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def test_a_change_of_rows_starts_the_window_afresh() -> None:
    """A batch's steps are compared only with steps of as many rows: a probe
    whose window saw a sequence end is dropped, not judged."""
    gov = ThreadGovernor(2)
    drive(gov, BUSY, CONFIRM * WINDOW)  # contended: the next window probes one fewer
    assert gov.running == 1
    gov.observe(0.01, 0.01, rows=3)  # a sequence joined: the probe is dropped
    assert gov.running == 2 and gov.threads == 2


class Recording(ThreadGovernor):
    """Records the rows of every step it is fed."""

    def __init__(self) -> None:
        super().__init__(2)
        self.rows: list[int] = []

    def observe(self, wall_s: float, cpu_s: float, rows: int = 1) -> int:
        self.rows.append(rows)
        return super().observe(wall_s, cpu_s, rows)


def test_batch_steps_feed_the_governor(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--batch` and `serve` adapt their threads as generate does: each step of
    one token per sequence is timed, with its rows."""
    from localrun.runtime.batch.scheduler import BatchRequest, run_batch

    recording = Recording()
    with Engine(engine_config(tiny_model, n_ctx=512, n_threads=2, n_seq_max=2)) as eng:
        monkeypatch.setitem(threads_mod._governors, eng, recording)
        prompts = ("the cat", "a dog")
        list(run_batch(eng, [BatchRequest(i, eng.tokenize(p), GREEDY, max_tokens=20) for i, p in enumerate(prompts)]))
    assert recording.rows.count(2) >= 15  # both sequences decoding, a row each
    assert set(recording.rows) <= {1, 2}
