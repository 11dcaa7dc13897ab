"""Speculation pays its own way (`control.Payoff`): whole steps' times fed
in, no clock; and the stepper on a fake machine whose clock moves only
with the work it is given."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import pytest

from localrun.runtime.llama import DecodeStatus
from localrun.runtime.sampling import SamplingParams
from localrun.speculative import Speculation, stepper
from localrun.speculative.base import Offer
from localrun.speculative.control import (
    CALIBRATE,
    PAYOFF_EVIDENCE,
    PROBE_SHARE,
    REST_MAX,
    REST_MIN,
    AdaptiveController,
    FixedController,
    Payoff,
)
from localrun.speculative.lookup import PromptLookupDrafter

PLAIN_S = 1.0  # a plain step, seconds


def _measured(payoff: Payoff, steps: int = 4) -> Payoff:
    """Plain steps nothing asked for: what a token costs plainly."""
    for _ in range(steps):
        assert payoff.wants_offers()
        payoff.observe_step(PLAIN_S, 1, 0.0, 0)
    return payoff


def _touch(payoff: Payoff, steps: int, draft_s: float, tokens: int, after_s: float = PLAIN_S) -> int:
    """``steps`` rounds of a verify step of ``tokens`` tokens taking
    ``draft_s``, then a plain step asked for (0.05 s of asking) taking
    ``after_s``, each where the drafters are asked (else a plain step); how
    many of the steps the drafters were asked at."""
    asked = 0
    for _ in range(steps):
        if payoff.wants_offers():
            asked += 1
            payoff.observe_step(draft_s, tokens, 0.05, tokens - 1)
        else:
            payoff.observe_step(PLAIN_S, 1, 0.0, 0)
        if payoff.wants_offers():
            asked += 1
            payoff.observe_step(after_s + 0.05, 1, 0.05, 0)
        else:
            payoff.observe_step(PLAIN_S, 1, 0.0, 0)
    return asked


def _rested(payoff: Payoff) -> int:
    """Plain steps until the drafters are asked again."""
    rested = 0
    while not payoff.wants_offers():
        rested += 1
        payoff.observe_step(PLAIN_S, 1, 0.0, 0)
    return rested


def test_drafting_that_costs_more_per_token_than_plain_steps_rests_the_drafters() -> None:
    """Each verify step takes 2.5 s for 2 tokens and slows the step after it
    (1.5 s): more per token than plain steps. The drafters rest for so long
    that the loss is `PROBE_SHARE` of the time."""
    payoff = _measured(Payoff())
    _touch(payoff, PAYOFF_EVIDENCE // 2, 2.5, 2, after_s=1.5)
    assert payoff.calibrating  # every step judged drafted or followed a draft: the plain cost is measured again
    while payoff.calibrating:
        assert not payoff.wants_offers()
        payoff.observe_step(PLAIN_S, 1, 0.0, 0)
    loss = -payoff.gain
    assert loss > 5 * PLAIN_S  # a loss of over a second per step with a draft, fading
    assert payoff.rests == 1 and payoff.rest == min(int(loss / (PROBE_SHARE * PLAIN_S)), REST_MAX)
    assert _rested(payoff) > 400


def test_asking_for_nothing_rests_the_drafters_where_it_costs_a_share_of_a_step() -> None:
    """Drafters asked at every step and never drafting lose their asking:
    a twentieth of a step rests them, a thousandth (a large model's step)
    does not."""
    for ask, rests in ((0.05 * PLAIN_S, True), (0.001 * PLAIN_S, False)):
        payoff = _measured(Payoff())
        for _ in range(4 * PAYOFF_EVIDENCE):
            if payoff.wants_offers():
                payoff.observe_step(PLAIN_S + ask, 1, ask, 0)
            else:
                payoff.observe_step(PLAIN_S, 1, 0.0, 0)
        assert (payoff.rests > 0) == rests
        assert payoff.rest <= REST_MAX


def test_drafting_that_pays_keeps_the_drafters_asked() -> None:
    """A verify step of 4 tokens in 1.5 s pays for its asking and for the
    slower step after it: the drafters are asked at every step."""
    payoff = _measured(Payoff())
    steps = 10 * PAYOFF_EVIDENCE
    assert _touch(payoff, steps, 1.5, 4, after_s=1.2) == 2 * steps
    assert payoff.pays and payoff.rests == 0


def test_a_probe_is_judged_on_its_own_steps() -> None:
    """After a rest, the drafters are asked again: a probe that loses rests
    them again, one that pays keeps them asked (the text changed)."""
    payoff = _measured(Payoff())
    for probe in range(1, 4):
        _touch(payoff, PAYOFF_EVIDENCE // 2, 2.5, 2)
        assert _rested(payoff) >= REST_MIN + CALIBRATE
        assert payoff.rests == probe
    asked = _touch(payoff, 10 * PAYOFF_EVIDENCE, 1.5, 4)
    assert asked == 20 * PAYOFF_EVIDENCE and payoff.rests == 3


def test_a_stall_counts_as_a_few_plain_steps() -> None:
    """One step stalled by other work (100 plain steps' time) does not
    outweigh the steps with a draft that paid around it."""
    payoff = _measured(Payoff())
    for i in range(PAYOFF_EVIDENCE):
        payoff.observe_step(100.0 if i == 5 else 1.5, 4, 0.0, 3)
    assert payoff.pays


def pays(payoff: Payoff) -> bool:
    return payoff.pays


def test_a_stale_plain_cost_is_measured_again_before_a_rest() -> None:
    """The plain cost measured early (1 s) is stale after `PAYOFF_EVIDENCE`
    steps with a draft, each 3 tokens in 3.3 s: a loss against it, but the plain steps
    now take 1.5 s. Before resting, `CALIBRATE` plain steps measure it
    again, and the drafts paid after all."""
    payoff = _measured(Payoff())
    for _ in range(PAYOFF_EVIDENCE):
        assert payoff.wants_offers()
        payoff.observe_step(3.3, 3, 0.0, 2)
    assert payoff.calibrating == CALIBRATE and not payoff.pays
    steps = 0
    while not payoff.wants_offers():
        steps += 1
        payoff.observe_step(1.5, 1, 0.0, 0)
    assert steps == CALIBRATE + 1  # the first plain step follows a draft: it measures nothing
    assert payoff.plain.value == 1.5 and pays(payoff) and payoff.rests == 0  # read anew: the steps changed it
    # the same drafts against plain steps that still take 1 s: a loss, and a rest
    payoff = _measured(Payoff())
    for _ in range(PAYOFF_EVIDENCE):
        payoff.observe_step(3.3, 3, 0.0, 2)
    while payoff.calibrating:
        assert not payoff.wants_offers()
        payoff.observe_step(PLAIN_S, 1, 0.0, 0)
    assert payoff.rests == 1 and payoff.rest >= REST_MIN


def test_nothing_is_judged_before_a_plain_step_is_measured() -> None:
    payoff = Payoff()
    for _ in range(4 * PAYOFF_EVIDENCE):  # verify steps only: no plain cost to weigh them against
        assert payoff.wants_offers()
        payoff.observe_step(10.0, 2, 0.0, 1)
    assert payoff.rests == 0 and payoff.touched == 0


def test_a_rest_measures_a_calibration_whole() -> None:
    """The stepper measures the first `stepper.MEASURED` steps of a rest:
    a calibration's plain steps, and the step after a draft before them."""
    assert stepper.MEASURED >= CALIBRATE + 1


def test_the_fixed_controller_is_never_rested() -> None:
    fixed = FixedController(0, 4)
    for _ in range(4 * PAYOFF_EVIDENCE):
        fixed.observe_step(10.0, 1, 5.0, 0)
        assert fixed.wants_offers()


# -- the stepper on a fake machine --


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Machine:
    """A `runtime.stepper.SteppedSequence` whose model writes a loop of
    ``period`` tokens (prompt lookup drafts it right), on a clock that moves
    only by the work it is given: a batch costs ``step_s`` plus ``row_s`` per
    row after the first, and the plain step after a verify batch ``slower_s``
    more (the backend's graph built again)."""

    def __init__(self, clock: Clock, step_s: float, row_s: float, slower_s: float, period: int = 7) -> None:
        self.clock, self.step_s, self.row_s, self.slower_s, self.period = clock, step_s, row_s, slower_s, period
        self.context: list[int] = [100 + i % period for i in range(3 * period)]  # the prompt
        self.n_past = len(self.context) - 1
        self.left = 10**6
        self.n_ctx = 10**6
        self.n_batch = 512
        self.draft_room = 8
        self.constraint = None
        self._start = self._rows = 0  # where the last batch started, and its rows
        self._verified = False

    @property
    def generated(self) -> Sequence[int]:
        return self.context

    def fast_forward(self) -> list[int]:
        return []

    def _batch(self, tokens: Sequence[int]) -> DecodeStatus:
        rows = len(tokens)
        self.clock.now += self.step_s + self.row_s * (rows - 1) + (self.slower_s if self._verified else 0.0)
        self._verified = rows > 1
        self._start, self._rows = self.n_past, rows
        self.n_past += rows
        return DecodeStatus.OK

    def evaluate(self, tokens: Sequence[int]) -> DecodeStatus:
        return self._batch(tokens)

    def evaluate_rows(self, tokens: Sequence[int], first: int) -> DecodeStatus:
        return self._batch(tokens)

    def sample(self, row: int = -1) -> int:
        pos = self._start + (row if row >= 0 else self._rows - 1)  # the row decides the token after pos
        return 100 + (pos + 1) % self.period

    def logits(self, row: int) -> object:
        raise AssertionError("greedy drafts are checked by sample")

    def accept(self, token: int) -> None:
        pass

    def rollback(self, pos: int) -> None:
        self.n_past = pos


class Timed(PromptLookupDrafter):
    """Prompt lookup whose asking costs ``ask_s`` on the fake clock."""

    def __init__(self, clock: Clock, ask_s: float) -> None:
        super().__init__()
        self.clock, self.ask_s = clock, ask_s
        self.asked = 0

    def offer(self, context: Sequence[int], index: int) -> Offer | None:
        self.clock.now += self.ask_s
        self.asked += 1
        return super().offer(context, index)


def _run(monkeypatch: pytest.MonkeyPatch, row_s: float, slower_s: float, tokens: int = 2000) -> tuple[int, float]:
    """Decode a loop to ``tokens`` tokens on the fake machine (a plain step 1 s,
    asking 0.05 s); (how many steps the drafters were asked at, the time
    taken over what plain steps alone would have taken)."""
    clock = Clock()
    monkeypatch.setattr(stepper, "time", SimpleNamespace(perf_counter=clock))
    machine = Machine(clock, 1.0, row_s, slower_s)
    drafter = Timed(clock, 0.05)
    spec = Speculation([drafter], AdaptiveController([drafter.profile]))
    step = spec.stepper(machine, SamplingParams(temperature=0.0))
    step.begin()
    prompt = len(machine.context)
    while len(machine.context) < tokens:
        decided = step.next()
        assert decided
        machine.context += decided
    expected = [100 + i % machine.period for i in range(len(machine.context))]
    assert machine.context == expected  # drafted or not, the model's own text
    return drafter.asked, clock.now / ((len(machine.context) - prompt) * machine.step_s)


def test_where_verify_rows_cost_a_step_the_drafters_rest_and_decoding_keeps_plain_speed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every extra verify row costs most of a plain step, the step after a
    verify batch half a step more, and asking a twentieth: drafting loses
    even on a loop. Once measured, the drafters rest for long stretches
    (asked at a tenth of the steps at most) and the run takes within 1% of
    plain decoding's time (`PROBE_SHARE`; asked at every eighth step, as the
    stepper's own rests have it, it took 4% more)."""
    asked, slower = _run(monkeypatch, row_s=0.95, slower_s=0.5)
    assert asked < 2000 // 10
    assert slower < 1.01


def test_where_verify_rows_are_cheap_drafting_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Extra rows cost a tenth of a step: on a loop, the drafters are asked
    at every step, each step decides many tokens, and the run takes under a
    quarter of plain decoding's time."""
    asked, slower = _run(monkeypatch, row_s=0.1, slower_s=0.05)
    assert asked < 2000 // 5  # a step per draft: most tokens came in drafts
    assert slower < 0.25
