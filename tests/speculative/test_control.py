"""The adaptive controller with a verify-cost curve (what `localrun tune`
measures): fixed costs fed in, no clock."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from localrun.speculative.base import Offer, Profile
from localrun.speculative.control import (
    PLAIN,
    USEFUL_CHANCE,
    AdaptiveController,
    StepGrowth,
    drafts_in_batch,
    padded_rows,
    useful_length,
)
from localrun.speculative.lookup import PromptLookupDrafter

PLAIN_S = 0.1  # a plain step, seconds
# the cost of r = 1..16 rows in plain steps: 8 rows cost about as much as 16 (kernels taking rows in groups)
BUMPY = (1.0, 1.6, 2.1, 2.7, 3.4, 4.2, 5.0, 5.9, 6.0, 6.1, 6.1, 6.2, 6.2, 6.3, 6.3, 6.3)
STEEP = tuple(1.0 + 0.8 * (r - 1) for r in range(1, 17))  # every extra row costs most of a plain step
LOOKUP = Offer(0, 0, 32)


def _lookup(curve: Sequence[float] | None, accepted: int = 19) -> AdaptiveController:
    """A controller over prompt lookup (free drafts) after a measured plain
    step, taught an acceptance of accepted / (accepted + 1): 19 is 0.95."""
    control = AdaptiveController([PromptLookupDrafter().profile], verify_curve=curve)
    control.observe_plain(PLAIN_S)
    for _ in range(40):
        control.observe_outcome(LOOKUP, 32, accepted)
    return control


def _slower_than_a_larger(curve: Sequence[float], rows: int, limit: int) -> bool:
    """Whether a batch of ``rows`` costs more than (or as much as) a larger one
    of at most ``limit`` rows, within the curve."""
    return any(curve[r - 1] <= curve[rows - 1] for r in range(rows + 1, min(limit, len(curve)) + 1))


def test_curve_is_the_prior_of_each_batch_size() -> None:
    control = _lookup(BUMPY)
    assert control.verify_cost(1) == PLAIN_S
    assert control.verify_cost(8) == pytest.approx(5.9 * PLAIN_S)
    assert control.verify_cost(16) == pytest.approx(6.3 * PLAIN_S)
    per_row = (6.3 - 1.0) / 15  # past its end the curve grows at its mean cost per extra row
    assert control.verify_cost(20) == pytest.approx((6.3 + 4 * per_row) * PLAIN_S)
    assert AdaptiveController([], verify_curve=[2.0, 3.0]).curve == (1.0, 1.5)  # relative to one row
    for bad in ([1.0], [1.0, 0.0], [1.0, float("nan")]):
        with pytest.raises(ValueError, match="verify curve"):
            AdaptiveController([], verify_curve=bad)


def test_a_batch_that_costs_as_much_as_a_larger_one_is_never_chosen() -> None:
    for accepted in (1, 2, 4, 9, 19, 49):  # acceptance 0.5 .. 0.98
        control = _lookup(BUMPY, accepted)
        considered = {n for n, _ in control.lengths(LOOKUP, 32)}
        tied = {8, 9, 11, 12, 13, 14}  # 9, 10, 12..15 rows: a larger batch costs as much
        assert considered.isdisjoint({n for n in tied if n < max(considered)})  # weighed up to the useful length
        for room in (32, 20, 16, 15, 12, 10, 8, 7, 5, 3, 1):
            n = control.choose([LOOKUP], room).n
            assert n <= room
            assert n != 7  # 8 rows: nearly the cost of 16
            assert not n or not _slower_than_a_larger(BUMPY, n + 1, room + 1), (accepted, room, n)
    assert _lookup(BUMPY, 19).choose([LOOKUP], 32).n == 15  # copying: the cheap large batch, 16 rows


def test_lengths_past_any_useful_chance_are_not_weighed() -> None:
    """A token drafted where acceptance is low is seldom reached: a noisy
    text's lookups weigh a few lengths, not the whole room, each step."""
    for accepted, longest in ((0, 1), (1, 5), (9, 32)):
        control = _lookup(BUMPY, accepted)
        a = control.acceptance(LOOKUP.drafter, LOOKUP.bucket)
        considered = [n for n, _ in control.lengths(LOOKUP, 32)]
        assert max(considered) == min(useful_length(a), 32) and a ** max(considered) >= USEFUL_CHANCE
        assert max(considered) <= longest if accepted < 9 else max(considered) == longest


def test_steep_curve_keeps_drafts_short_or_plain() -> None:
    assert _lookup(STEEP, 4).choose([LOOKUP], 32).n == 0  # 80% accepted does not pay for a row
    for accepted in (9, 19):  # 90%, 95%
        assert 1 <= _lookup(STEEP, accepted).choose([LOOKUP], 32).n <= 2
    assert _lookup(BUMPY, 9).choose([LOOKUP], 32).n <= 2  # at 90% the cheap large batch does not pay either


def test_ties_do_not_chain_into_the_longest_draft() -> None:
    """When each extra row costs a little (a GPU), every length is within the
    tie of the next one; that alone does not make the longest draft win."""
    flat = tuple(1.0 + 0.01 * (r - 1) for r in range(1, 17))
    control = _lookup(flat, 1)  # 50% accepted: tokens past the first few are rarely kept
    n = control.choose([LOOKUP], 32).n
    assert 2 <= n <= 8


def test_live_measurements_override_the_curve() -> None:
    control = _lookup(BUMPY)
    for _ in range(10):
        for rows in range(2, 16):
            control.observe_verify(rows, BUMPY[rows - 1] * PLAIN_S)  # as the curve says
        control.observe_verify(16, 2 * 6.3 * PLAIN_S)  # 16 rows: twice what the curve says
    assert control.verify_cost(16) == pytest.approx(2 * 6.3 * PLAIN_S)
    assert control.verify_cost(8) == pytest.approx(5.9 * PLAIN_S)
    assert control.choose([LOOKUP], 32).n == 14  # 16 rows no longer pay: 15 cost what 16 were said to

    dearer = _lookup(BUMPY)  # every batch measured dearer than the curve: the sizes not measured follow
    for _ in range(20):
        for rows in (2, 3, 4):
            dearer.observe_verify(rows, 1.5 * BUMPY[rows - 1] * PLAIN_S)
    assert 1.3 * 6.3 * PLAIN_S < dearer.verify_cost(16) <= 1.5 * 6.3 * PLAIN_S


# a plain step's growth with the context: 20 ms after 32 tokens, 30 ms after 1,632 (attention reads them all)
GROWTH = StepGrowth(32, 19.8, 1 / 160)
# the curve of a CPU where an extra row costs most of a step (two cores, a 0.5B model), measured after 32 tokens
CPU_CURVE = (1.0, 1.9, 2.0, 2.2, 3.2, 3.6)


def test_step_growth_is_relative_to_the_curves_depth() -> None:
    assert GROWTH.at(32) == pytest.approx(1.0)
    assert GROWTH.at(1632) == pytest.approx(1.5)
    assert GROWTH.at(0) == 1.0  # never cheaper than where the curve was measured
    assert StepGrowth(32, 20.0, 0.0).at(4096) == 1.0  # a flat line: no growth


def test_rows_at_depth_each_pay_the_steps_growth() -> None:
    """Every row of a verify batch attends to the whole context: past the
    curve's depth each pays what a plain step's growth costs, so a batch
    costs more plain steps than the curve says, and a draft that pays on a
    short context does not after a long prompt."""
    control = AdaptiveController([PromptLookupDrafter().profile], verify_curve=CPU_CURVE, growth=GROWTH)
    control.observe_plain(PLAIN_S)
    offer = Offer(0, 4, 32)  # lookup, 9-15 tokens agreeing: a prior acceptance of 0.7
    control.observe_depth(40)
    assert control.verify_cost(4) == pytest.approx(2.2 * PLAIN_S, rel=0.01)
    assert control.choose([offer], 32).n == 3  # 1 + 0.7 + 0.49 + 0.34 tokens for 2.2 steps
    control.observe_depth(1632)  # a step costs 1.5 of one after 32 tokens: 4 rows, (2.2 + 4 * 0.5) / 1.5
    assert control.verify_cost(4) == pytest.approx(2.8 * PLAIN_S)
    assert control.choose([offer], 32).offer is None
    before = control.curve_level.value
    control.observe_verify(4, 2.8 * PLAIN_S)  # as predicted at this depth: the curve's level stays
    assert control.curve_level.value == pytest.approx(before)
    unknown = AdaptiveController([PromptLookupDrafter().profile], verify_curve=CPU_CURVE)
    unknown.observe_plain(PLAIN_S)
    unknown.observe_depth(1632)  # without a measured growth the curve stands as measured
    assert unknown.verify_cost(4) == pytest.approx(2.2 * PLAIN_S)
    gpu = AdaptiveController([PromptLookupDrafter().profile], verify_curve=FLAT, growth=GROWTH)
    gpu.observe_plain(PLAIN_S)
    before_depth = gpu.verify_cost(8)
    gpu.observe_depth(1632)  # a flat curve: rows share the step's reads, and the curve stands at depth too
    assert gpu.verify_cost(8) == before_depth


def test_live_measurements_without_a_curve_reveal_the_same_sizes() -> None:
    """No curve: once each size is measured, a batch that costs as much as a
    larger one is left aside as it is with the curve."""
    control = _lookup(None)
    shape = AdaptiveController([], verify_curve=BUMPY)
    for _ in range(3):
        for rows in range(2, 34):
            control.observe_verify(rows, shape.curve_point(rows) * PLAIN_S)
    assert control.choose([LOOKUP], 32).n == 15
    assert control.choose([LOOKUP], 10).n == 10  # up to 11 rows: 11 cost about what 9 and 10 do


def test_a_draft_models_step_counts_in_the_tie() -> None:
    """A flat verify cost does not make a draft model draft its longest: each
    drafted token costs a step of its own."""
    draft = Profile(name="draft", step_cost=0.3, catch_up_cost=0.05, setup_s=0.0, acceptance=(0.7,), free=False)
    control = AdaptiveController([draft], verify_curve=[1.0] * 16)
    control.observe_plain(PLAIN_S)
    offer = Offer(0, 0, 8)
    for _ in range(40):
        control.observe_outcome(offer, 8, 2)  # 67% accepted
    assert [n for n, _ in control.lengths(offer, 8)] == list(range(1, 9))
    assert 1 <= control.choose([offer], 8).n <= 3


def test_forced_tokens_count_as_drafts_that_cannot_be_rejected() -> None:
    """Tokens the grammar forced ride at the head of the batch: a plain step
    already costs their rows, so drafts that fill the batch to a cheap size pay."""
    control = _lookup(BUMPY, 9)  # 90%: alone, only short drafts pay
    assert control.choose([LOOKUP], 32).n <= 2
    assert control.choose([LOOKUP], 32, forced=8).n == 7  # 9 rows cost about what 16 do: fill them
    assert control.choose([LOOKUP], 5, forced=8).n <= 5  # never past the room left
    steep = _lookup(STEEP, 4)  # where no draft pays, forced tokens do not make one pay
    assert steep.choose([LOOKUP], 32, forced=8).n == 0


# a GPU-like curve: reading the weights dominates a step, so 64 rows cost 1.3 of one row
FLAT = tuple(1.0 + 0.3 * (r - 1) / 63 for r in range(1, 65))
# what `localrun tune` measured for the 0.5B on two CPU cores (docs/benchmarks.md), filled in between
CPU_05B = (1.0, 1.3, 1.5, 1.7, 2.05, 2.4, 2.75, 3.1, 3.275, 3.45, 3.625, 3.8, 4.025, 4.25, 4.475, 4.7)


def test_a_flat_curve_drafts_longer_and_at_lower_acceptance() -> None:
    for accepted in (1, 4, 9, 19):  # 50% .. 95%
        flat, steep = _lookup(FLAT, accepted).choose([LOOKUP], 32).n, _lookup(STEEP, accepted).choose([LOOKUP], 32).n
        assert flat > max(steep, 2), (accepted, flat, steep)
    assert _lookup(STEEP, 1).choose([LOOKUP], 32).n == 0  # 50% accepted: no row pays on a CPU ...
    assert _lookup(FLAT, 1).choose([LOOKUP], 32).n >= 3  # ... and a short draft does on a GPU


def test_draft_length_follows_the_curves_length_not_a_cpus() -> None:
    """Rows 1..64 measured: a draft that is nearly always kept fills them."""
    long_offer = Offer(0, 0, 64)
    control = _lookup(FLAT, 49)  # 98%
    assert control.choose([long_offer], 63).n == 63
    assert control.choose([long_offer], 40).n == 40
    assert _lookup(STEEP, 49).choose([long_offer], 63).n <= 4


def test_padding_only_where_the_curve_is_flat() -> None:
    assert [padded_rows(FLAT, r, 64) for r in (1, 2, 3, 4, 5, 7, 8)] == [1, 2, 4, 4, 8, 8, 8]
    assert padded_rows(FLAT, 5, 6) == 5  # never past the room there is
    assert padded_rows(FLAT[:6], 5, 64) == 5  # nor past the sizes the curve measured
    for rows in range(1, 40):  # a size dearer than TIE is left as it is
        size = padded_rows(FLAT, rows, 64)
        assert size == rows or FLAT[size - 1] <= FLAT[rows - 1] * 1.03
    for curve in (STEEP, BUMPY, CPU_05B, None):  # a CPU: never (BUMPY's plateau included)
        assert all(padded_rows(curve, r, 64) == r for r in range(1, 20))


def test_drafting_in_a_batch_only_where_extra_rows_are_nearly_free() -> None:
    assert all(drafts_in_batch(FLAT, rows) for rows in range(1, 33))
    assert not drafts_in_batch(FLAT, 33)  # twice the rows is past what was measured
    gpu = (1.0, 1.1, 1.2, 1.3, 1.35, 1.4, 1.45, 1.5)  # 2 rows 1.1x, 4 rows 1.3x: a consumer card's figures
    assert drafts_in_batch(gpu, 2) and drafts_in_batch(gpu, 4)
    for curve in (STEEP, BUMPY, CPU_05B, None):
        assert not any(drafts_in_batch(curve, rows) for rows in range(1, 9))


def test_in_a_batch_the_other_rows_count_as_forced() -> None:
    """Seven other sequences' rows in the batch: on a flat curve a draft of
    even half-kept tokens adds tokens for nearly no time; on a steep one it
    does not pay."""
    assert _lookup(FLAT, 1).choose([LOOKUP], 32, forced=7).n >= 2
    assert _lookup(STEEP, 1).choose([LOOKUP], 32, forced=7).n == 0


def test_a_padded_size_costs_what_its_padding_does() -> None:
    control = _lookup(FLAT)
    control.observe_verify(8, 2 * FLAT[7] * PLAIN_S)  # 8 rows measured dearer than the curve
    assert control.verify_cost(5) == control.verify_cost(8) == pytest.approx(2 * FLAT[7] * PLAIN_S)
    assert _lookup(STEEP).verify_cost(5) == pytest.approx(STEEP[4] * PLAIN_S)


def test_a_batch_teaches_the_plain_cost_through_the_curve() -> None:
    """Sequences decoding together take no step alone: a batch's time over
    the curve's point for its rows stands for a plain step until one is measured."""
    control = AdaptiveController([PromptLookupDrafter().profile], verify_curve=FLAT)
    assert control.choose([LOOKUP], 32, forced=3) == PLAIN  # nothing measured
    control.observe_batch(4, FLAT[3] * PLAIN_S)
    assert control.plain_cost() == pytest.approx(PLAIN_S)
    assert control.verify_cost(4) == pytest.approx(FLAT[3] * PLAIN_S)
    blind = AdaptiveController([PromptLookupDrafter().profile])  # no curve: nothing to go on
    blind.observe_batch(4, 0.2)
    assert blind.plain.value is None
