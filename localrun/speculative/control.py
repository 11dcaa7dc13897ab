"""Which way to take the next step: plain decoding, or a drafter and a draft length.

`AdaptiveController` measures, while generating, what each way costs on this
machine and how often each drafter is right, and picks per step the way with
the highest expected tokens per second:

    expected tokens  E(a, n) = 1 + a + a^2 + ... + a^n
    time             T(n)    = draft(n) + verify(n + 1)
    plain                      1 token in one plain step

with ``a`` the acceptance of the drafter in the offer's bucket (each drafted
token is kept with probability a, given the ones before it were), draft(n)
the drafter's measured cost for n tokens (plus any catch-up or loading), and
verify(n) the target's measured cost for a batch of n rows.

With structured output, the f tokens the grammar forces next ride in the
step's batch before the draft, as drafts that cannot be rejected: a step
yields f + E(a, n) tokens in draft(n) + verify(f + n + 1), and a plain step
f + 1 tokens in verify(f + 1).

The cost of a verify batch need not grow smoothly with its rows: kernels can
take rows in groups, so a batch can cost as much as a larger one, and where
that happens differs from machine to machine. Each size measured keeps its
own average. A size not measured yet
is estimated from, in this order:

- the verify curve, if one is given (``verify_curve``: what `localrun tune`
  measured on this machine, the cost of r rows over the cost of one, for
  r = 1..len): a plain step times the curve's point, times a factor learned
  live from the sizes measured (how much dearer or cheaper than the curve
  they came out; 1 until measured). Past its last point the curve grows at
  its own mean cost per extra row, so it never turns cheaper past what was
  measured. The curve is measured on a short context; every row of a batch
  attends to the whole context, as a plain step does, and where a row costs
  a good share of a step (a CPU: the curve is not `flat`) it pays that work
  about in full. So where tune's rates say how a plain step grows with the
  context (`StepGrowth`), that growth is added for every row: a plain step
  at this depth costs g times one at the curve's, and r rows cost
  (curve(r) + r (g - 1)) / g plain steps here (after a long prompt, a
  draft the curve alone says pays can cost more than it yields). On a flat
  curve (a GPU), where rows share the step's reads, the curve stands;
- else a line fitted to all verify batches (a fixed cost plus a cost per
  row), a little optimistically, so that the size gets tried. Until a batch
  is measured the line is a plain step plus `PRIOR_VERIFY_SLOPE` of a plain
  step per extra row, a guess and not a measurement: an extra row costs
  between nothing (reading the weights dominates the step) and a whole step
  (computing dominates), and the guess is the middle.

A draft length whose step (drafting plus verifying) takes about as long as a
longer one's, within `TIE`, is never chosen: the longer one yields more
tokens for the same time (`lengths`; the longer one must itself be kept, so
ties do not chain into the longest draft when every row costs a little).
With a curve this rules out, before anything is measured, the batch sizes
that cost as much as a larger one; live measurements move the estimates, and
the rule follows them. Until a drafter is measured, the controller assumes
its `Profile` (a draft model's step costs its size ratio to the target;
lookup is free).

It keeps probing cheaply so it can change its mind when the text changes: a
way that is not the best is tried again with a short draft after a number of
steps that doubles each time it is probed (up to `MAX_GAP`), and only while
the estimated time lost to probing stays within `explore_share` of the time
spent decoding. Acceptance counts fade with use and with idle steps, so a
probe after a change of text weighs more than the old evidence.

Above the per-step choice, speculation must pay its own way (`Payoff`):
asking the drafters costs Python time on every step (an n-gram search, the
text followed, the weighing above), and a verify batch can slow the plain
step after it (the backend rebuilds its compute graph for the other
shape), costs no estimate above sees. Where a step takes a fraction of a
millisecond (a tiny model, a hybrid whose every verify row costs nearly a
step) they decide. So each whole step is timed as it ran, and the steps
speculation touched (the drafters asked, a draft verified, the step after
one) are weighed against what plain steps, timed the same way, would have
taken for their tokens. Where that ledger comes out at a loss, the drafters
are not asked at all for so long that the loss is a small share of the
time, then asked again: a probe, judged the same way.

The constants below are choices of how fast to learn and how much to trust
a guess, not costs measured on some machine: costs are measured here, as it
runs, or come from the curve `localrun tune` measured here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from localrun.speculative.base import Draft, Offer, Profile

# an extra verify row, as a fraction of a plain step, until measured and without a curve: the middle of
# what it can cost (nothing when reading the weights dominates, a whole step when computing does); a guess
PRIOR_VERIFY_SLOPE = 0.5
TIE = 0.03  # a step within this share of a longer draft's step time is no quicker: the longer draft is taken
CURVE_WEIGHT = 2.0  # how many measured batches the verify curve's level is worth
PRIOR_WEIGHT = 2.0  # how many observations a prior acceptance is worth
ACCEPT_MEMORY = 0.9  # per use: older acceptance counts fade, so the estimate follows the text
IDLE_FADE = 16  # ... and fade once more per this many steps the way was not used
MAX_ACCEPTANCE = 0.98
# a drafted token reached with a smaller chance than this is not worth a
# length of its own: lengths past it are not weighed (a step's choice costs
# a few microseconds a length, which counts where a step takes a millisecond)
USEFUL_CHANCE = 0.01
COST_ALPHA = 0.2  # moving-average weight of a new cost measurement
SPIKE = 3.0  # a cost measurement counts as at most this many times the current estimate
UNTRIED_SIZE = 0.8  # without a curve, a verify batch size not measured yet: this share of the extra cost the fit says
MIN_GAP = 16  # steps before a way that is not the best is probed again (doubles per probe)
MAX_GAP = 128
PROBE_MAX = 2  # the longest draft of a probe
# an extra verify row that costs at most this share of a one-row step is nearly free: a GPU, where reading
# the weights dominates a step (0.03-0.1 of a step on the cards published); on a CPU an extra row costs
# 0.2-0.9 of a step (0.5B to 1.5B models on two cores). Only on such a curve (`flat`) are verify batches
# padded, and may sequences decoding together in one batch draft
FREE_ROW = 0.1
PAD_SIZES = (2, 4, 8, 16, 32, 64, 128, 256)  # the row counts a verify batch is padded up to (`padded_rows`)
# whether speculation pays its way (`Payoff`): judged every this many steps it touched
PAYOFF_EVIDENCE = 16
PAYOFF_MEMORY = 0.97  # per step touched: older gains and losses fade, so the ledger follows the text
# once speculation lost, the drafters rest so long that the steps that lost were this share of the time
PROBE_SHARE = 0.005
REST_MIN = 16  # a shorter rest is not taken (the stepper rests them for up to `MAX_REST` steps itself)
REST_MAX = 2048  # ... nor a longer one: a text that turns to copying waits for the next probe
# the draft lengths weighed are weighed again when the plain cost moves by more than this share since (the
# verify costs of sizes not measured yet follow it), and forgotten past this many acceptances weighed
MEMO_SHIFT = 0.1
MEMO_SIZE = 64
STALL = 2.0  # a step with a draft loses at most this many plain steps (more: stalled by other work)
CALIBRATE = 3  # plain steps that measure the plain cost afresh, where it is stale (`Payoff`)
GROWTH_SHIFT = 0.02  # the draft lengths weighed are weighed again when the step's growth moves by this share


@dataclass(frozen=True)
class Plan:
    offer: Offer | None = None  # None: a plain step
    n: int = 0  # tokens to draft
    probe: bool = False
    best_rate: float = 0.0  # the expected tokens/s of the best way, when the plan was made


PLAIN = Plan()


class Controller(Protocol):
    def choose(self, offers: Sequence[Offer], room: int, forced: int = 0) -> Plan:
        """The way to take this step; drafts at most ``room`` tokens.
        ``forced``: tokens the grammar decided that ride in the step's batch
        before the draft (drafts that cannot be rejected)."""

    def observe_plain(self, seconds: float) -> None: ...

    def observe_verify(self, rows: int, seconds: float) -> None: ...

    def observe_draft(self, drafter: int, draft: Draft) -> None: ...

    def observe_outcome(self, offer: Offer, proposed: int, accepted: int) -> None: ...

    def observe_round(self, plan: Plan, seconds: float, tokens: int) -> None: ...

    def observe_batch(self, rows: int, seconds: float) -> None:
        """A batch of several sequences' rows (each its next token, some with
        a draft) took ``seconds``."""

    def wants_offers(self) -> bool:
        """Whether a sequence decoding alone asks the drafters this step
        (False: a plain step, nothing asked). Called once per such step."""

    def observe_step(self, seconds: float, tokens: int, asked_s: float, drafted: int) -> None:
        """A whole step of a sequence decoding alone took ``seconds`` and
        decided ``tokens``; ``asked_s`` of it went to asking the drafters and
        weighing their offers (0: not asked); ``drafted``: the tokens of the
        draft it verified (0: none)."""

    def observe_depth(self, tokens: int) -> None:
        """The KV cache of a sequence decoding alone holds ``tokens`` tokens
        before its next step's batch (said before each step it prepares)."""


@dataclass(frozen=True)
class StepGrowth:
    """How a plain step's cost grows with the context, as `localrun tune`
    measured it on this machine for the run's KV types and flash attention:
    ``base_ms + per_token_ms * depth``; and ``depth``, the context the verify
    curve was measured on (see the module's docstring)."""

    depth: int
    base_ms: float
    per_token_ms: float

    def at(self, depth: int) -> float:
        """A plain step's cost with ``depth`` tokens in the context over its
        cost at the curve's depth (1 at or below it)."""
        if self.base_ms <= 0.0 or self.per_token_ms <= 0.0:  # flat, or a line no step could follow
            return 1.0
        reference = self.base_ms + self.per_token_ms * self.depth
        return max((self.base_ms + self.per_token_ms * depth) / reference, 1.0)


class _Average:
    """An exponential moving average, seeded by its first value."""

    __slots__ = ("count", "value")

    def __init__(self) -> None:
        self.value: float | None = None
        self.count = 0

    def get(self, default: float) -> float:
        return default if self.value is None else self.value

    def add(self, x: float, alpha: float = COST_ALPHA) -> None:
        if self.value is not None and self.value > 0:
            x = min(x, SPIKE * self.value)  # a step stalled by other work on the machine counts less
        self.value = x if self.value is None else self.value + alpha * (x - self.value)
        self.count += 1


class _LineFit:
    """cost(rows) = a + s * rows, fitted to fading observations by least
    squares, with the slope pulled toward a prior (ridge) so that a few
    observations of one size do not decide it alone."""

    MEMORY = 0.97  # per observation
    PRIOR_WEIGHT = 4.0  # the prior slope weighs like observations spread over 2 rows

    def __init__(self) -> None:
        self.w = self.x = self.y = self.xx = self.xy = 0.0

    def add(self, rows: int, seconds: float) -> None:
        m = self.MEMORY
        self.w, self.x, self.y = self.w * m + 1, self.x * m + rows, self.y * m + seconds
        self.xx, self.xy = self.xx * m + rows * rows, self.xy * m + rows * seconds

    @property
    def empty(self) -> bool:
        return self.w == 0.0

    def line(self, prior_slope: float) -> tuple[float, float]:
        lam = self.PRIOR_WEIGHT
        det = self.w * (self.xx + lam) - self.x * self.x
        slope = (self.w * (self.xy + lam * prior_slope) - self.x * self.y) / det
        return (self.y - slope * self.x) / self.w, slope


class _Ratio:
    """measured / predicted, over fading observations, pulled toward 1 (the
    prediction right) as if `CURVE_WEIGHT` observations had said so."""

    MEMORY = 0.97  # per observation

    def __init__(self) -> None:
        self.w = self.sum = 0.0

    def add(self, ratio: float) -> None:
        self.w, self.sum = self.w * self.MEMORY + 1, self.sum * self.MEMORY + ratio

    @property
    def value(self) -> float:
        return (self.sum + CURVE_WEIGHT) / (self.w + CURVE_WEIGHT)


class Payoff:
    """Whether speculation pays its way on this machine, from whole steps as
    they ran (see the module's docstring): a ledger of the time the steps
    speculation touched saved (negative: lost) against plain steps.

    A plain step after a plain step measures what a token costs plainly
    (less the asking, where the drafters were asked). The steps touched are
    those asked for (a plain one loses its asking) and those that verified
    a draft or followed one (they gain their tokens' plain cost less their
    time). A step stalled by other work (a millisecond, where a step takes a
    tenth) would outweigh dozens that gained: one loses at most `STALL`
    plain steps. Every `PAYOFF_EVIDENCE` steps touched the ledger is judged:
    at a loss, the drafters rest (`wants_offers` says no) for so many steps
    that the loss is `PROBE_SHARE` of their time (a loss of a few plain
    steps rests them for hundreds; one of a fraction of a step, asking
    beside a large model's steps, not at all: under `REST_MIN`), at most
    `REST_MAX`. A rest's end starts a probe with a fresh ledger, judged the
    same way.

    What a plain step costs moves as the text grows (attention reads the
    whole context: on a small model, a step late in a long text can cost
    twice one early on) and as other work comes and goes on the machine, and
    while every step drafts, no plain step measures it. So the steps with a
    draft are weighed against the plain cost measured before them and the
    one measured after, halfway; where the ledger is judged at a loss with
    none measured for half of `PAYOFF_EVIDENCE` steps touched or more,
    `CALIBRATE` plain steps measure it (their median) before any rest.
    Until a plain step is measured, nothing is judged."""

    def __init__(self) -> None:
        self.plain = _Average()  # seconds per token of a plain step, asking aside
        self.settled = 0.0  # seconds the steps touched saved (negative: lost), fading per step touched
        self.tokens = 0.0  # the steps with a draft since the plain cost was last measured: their tokens,
        self.seconds = 0.0  # ... and their time, fading too
        self.stale = 0  # ... how many
        self.touched = 0  # steps touched since the last judgement
        self.rest = 0  # steps left in which the drafters are not asked
        self.rests = 0  # rests begun (for the figures)
        self.calibrating = 0  # plain steps still to measure before the ledger is judged again
        self._samples: list[float] = []
        self._after_draft = False  # the last step verified a draft

    @property
    def gain(self) -> float:
        """The seconds the steps touched saved, fading (negative: lost); the
        steps with a draft since the last plain step weighed against it."""
        plain = self.plain.value
        return self.settled if plain is None else self.settled + self.tokens * plain - self.seconds

    @property
    def pays(self) -> bool:
        """Whether the ledger, as it stands, is not at a loss."""
        return self.gain >= 0.0

    def wants_offers(self) -> bool:
        if self.calibrating:
            return False
        if self.rest > 0:
            self.rest -= 1
            if not self.rest:  # a probe: judged on its own steps
                self.settled = self.tokens = self.seconds = 0.0
                self.touched = self.stale = 0
            return False
        return True

    def observe_step(self, seconds: float, tokens: int, asked_s: float, drafted: int) -> None:
        after, self._after_draft = self._after_draft, drafted > 0
        plain = self.plain.value
        if tokens < 1 or (plain is None and (drafted or after)):
            return
        if not drafted and not after:
            if tokens == 1:  # a batch of tokens the grammar forced costs less per token: not a plain step's
                self._measured(max(seconds - asked_s, 0.0))
                if self.calibrating:
                    return
            plain = self.plain.value
            if asked_s <= 0.0 or plain is None:
                return  # plain, nothing asked: speculation did not touch it
            self._fade()
            self.settled -= min(asked_s, STALL * plain)
        else:
            assert plain is not None
            self._fade()
            self.tokens += tokens
            self.seconds += min(seconds, (tokens + STALL) * plain)
            self.stale += 1
        self.touched += 1
        if self.touched >= PAYOFF_EVIDENCE:
            self.touched = 0
            self._judge()

    def _fade(self) -> None:
        m = PAYOFF_MEMORY
        self.settled, self.tokens, self.seconds = self.settled * m, self.tokens * m, self.seconds * m

    def _measured(self, seconds: float) -> None:
        """A plain step's cost (while calibrating, its median over `CALIBRATE` steps)."""
        before = self.plain.value
        if not self.calibrating:
            self.plain.add(seconds)
            self._settle(before)
            return
        self._samples.append(seconds)
        self.calibrating -= 1
        if not self.calibrating:
            self.plain.value, self._samples = sorted(self._samples)[len(self._samples) // 2], []
            self._settle(before)
            self._judge()

    def _settle(self, before: float | None) -> None:
        """The steps with a draft since the plain cost ``before`` was
        measured, weighed against it and the one measured now, halfway."""
        now = self.plain.value
        if before is not None and now is not None and self.stale:
            self.settled += self.tokens * (before + now) / 2 - self.seconds
        self.tokens = self.seconds = 0.0
        self.stale = 0

    def _judge(self) -> None:
        gain, plain = self.gain, self.plain.value
        if gain >= 0.0 or plain is None:
            return
        if self.stale >= PAYOFF_EVIDENCE // 2:  # half the steps judged, or more, weighed against an old cost
            self.calibrating = CALIBRATE
            return
        rest = min(int(-gain / (PROBE_SHARE * plain)), REST_MAX)  # the probe's loss: PROBE_SHARE of the time
        if rest >= REST_MIN:
            self.rest = rest
            self.rests += 1


def checked_curve(curve: Sequence[float]) -> tuple[float, ...]:
    """The curve relative to its first point (one row costs 1)."""
    points = tuple(float(x) for x in curve)
    if len(points) < 2 or not all(math.isfinite(x) and x > 0 for x in points):
        raise ValueError(f"a verify curve needs two or more positive costs, not {list(curve)!r}")
    return tuple(x / points[0] for x in points)


def curve_point(curve: Sequence[float], rows: int) -> float:
    """The cost of ``rows`` rows on ``curve`` (relative to one row, see
    `checked_curve`); past its last point it grows at the curve's mean cost
    per extra row, so it never turns cheaper past what was measured."""
    if rows <= len(curve):
        return curve[max(rows, 1) - 1]
    per_row = max((curve[-1] - 1.0) / (len(curve) - 1), 0.0)
    return curve[-1] + per_row * (rows - len(curve))


def flat(curve: Sequence[float] | None) -> bool:
    """Whether ``curve`` says extra rows are nearly free: its mean cost per
    extra row is at most `FREE_ROW` of a one-row step."""
    return curve is not None and (curve[-1] / curve[0] - 1.0) / (len(curve) - 1) <= FREE_ROW


def padded_rows(curve: Sequence[float] | None, rows: int, limit: int) -> int:
    """The rows a verify batch of ``rows`` rows is padded to, at most ``limit``:
    the next of `PAD_SIZES` where ``curve`` measured it and says it costs
    about as much (within `TIE`), so that steps repeat their shape and the
    backend reuses its compute graph (and a GPU replays it); else ``rows``.
    A curve that is not `flat` (a CPU), or none, never pads."""
    if curve is None or rows < 2 or not flat(curve):
        return rows
    size = next((s for s in PAD_SIZES if s >= rows), rows)
    if size == rows or size > min(limit, len(curve)):
        return rows
    return size if curve_point(curve, size) <= curve_point(curve, rows) * (1.0 + TIE) else rows


def drafts_in_batch(curve: Sequence[float] | None, rows: int) -> bool:
    """Whether sequences decoding together in a batch of ``rows`` rows (one
    each) may draft: ``curve`` measured that a batch of twice as many rows
    costs at most `FREE_ROW` of a one-row step per extra row. Without a
    curve, or on one that is not `flat` (a CPU), only a sequence decoding
    alone drafts."""
    if curve is None or rows < 1 or 2 * rows > len(curve) or not flat(curve):
        return False
    return curve_point(curve, 2 * rows) - curve_point(curve, rows) <= FREE_ROW * rows


def useful_length(a: float) -> int:
    """The longest draft whose last token is accepted with a chance (``a``
    to the power of its length) of at least `USEFUL_CHANCE`."""
    if a <= USEFUL_CHANCE:
        return 1
    return max(1, int(math.log(USEFUL_CHANCE) / math.log(a)))


def expected_tokens(a: float, n: int) -> float:
    """1 + a + ... + a^n: tokens a verify step yields with n drafted tokens."""
    return float(n + 1) if a >= 1.0 else (1.0 - a ** (n + 1)) / (1.0 - a)


@dataclass
class AdaptiveController:
    """The way with the highest expected tokens per second, from live
    measurements (see the module's docstring).

    ``verify_curve``: the cost of a verify batch of r rows over the cost of
    one row, for r = 1..len (`localrun tune`'s measurement on this machine);
    it is the prior of a batch size until that size is measured here. None:
    the prior is a line (`PRIOR_VERIFY_SLOPE`), learned live. ``growth``: how
    a plain step grows with the context, for the curve at the context's
    depth (None: the curve as measured)."""

    profiles: Sequence[Profile]
    explore_share: float = 0.01
    verify_curve: Sequence[float] | None = None
    growth: StepGrowth | None = None
    plain: _Average = field(default_factory=_Average)
    verify: _LineFit = field(default_factory=_LineFit)  # seconds for a verify batch, by rows

    def __post_init__(self) -> None:
        self.curve = None if self.verify_curve is None else checked_curve(self.verify_curve)
        self.curve_level = _Ratio()  # measured verify batches over what the curve says
        self.depth_cost = 1.0  # a plain step at the context's depth over one at the curve's (`StepGrowth.at`)
        self._memo_depth_cost = 1.0  # ... where the memos below were weighed
        self.pads = flat(self.curve)  # verify batches are padded (`padded_rows`)
        n = len(self.profiles)
        self.step = [_Average() for _ in range(n)]  # seconds per drafted token
        self.catch_up = [_Average() for _ in range(n)]  # seconds per catch-up token
        self.ready = [p.setup_s == 0.0 for p in self.profiles]  # setup (loading) done
        self.counts: dict[tuple[int, int], tuple[float, float, int]] = {}  # (accepted, tested, step), fading
        self.last_used: dict[tuple[int, int], int] = {}
        self.gap: dict[tuple[int, int], int] = {}
        self._line: tuple[float, float] | None = None  # the verify fit, cached until the next observation
        # `lengths` and `best_length`, weighed at every step the drafters are asked, kept until a cost
        # they use moves: a verify batch or a draft measured, the plain cost by more than `MEMO_SHIFT`
        self._lengths: dict[tuple[int, int, int, int], list[tuple[int, float]]] = {}
        self._best: dict[tuple[int, int, int, int, float], tuple[float, int]] = {}
        self._memo_plain = 0.0  # the plain cost they were weighed at
        self.sizes: dict[int, _Average] = {}  # verify cost per batch size measured
        self.rounds = 0
        self.elapsed = 0.0
        self.explored = 0.0
        self.payoff = Payoff()  # whether speculation pays its way, on whole steps

    # -- estimates --

    def acceptance(self, drafter: int, bucket: int) -> float:
        prior = self.profiles[drafter].acceptance
        a0 = prior[min(bucket, len(prior) - 1)]
        accepted, tested, _ = self.counts.get((drafter, bucket), (0.0, 0.0, 0))
        return min((accepted + a0 * PRIOR_WEIGHT) / (tested + PRIOR_WEIGHT), MAX_ACCEPTANCE)

    def plain_cost(self) -> float:
        return self.plain.get(1.0)

    def verify_cost(self, rows: int) -> float:
        c1 = self.plain_cost()
        if rows <= 1:
            return c1
        if self.pads:  # a batch is padded where the curve says so: it costs what its padded size does
            assert self.curve is not None
            rows = padded_rows(self.curve, rows, len(self.curve))
        measured = self.sizes.get(rows)
        if measured is not None and measured.value is not None:
            return measured.value
        if self.curve is not None:
            return self._curve_cost(rows)
        return c1 + (self._line_cost(rows) - c1) * UNTRIED_SIZE

    def curve_point(self, rows: int) -> float:
        """The curve's cost of ``rows`` rows, in plain steps at the context's
        depth; past its last point it grows at the curve's mean cost per
        extra row. Each row beyond the first pays the growth of a step past
        the curve's depth (`StepGrowth`) as the first does."""
        assert self.curve is not None
        g = self.depth_cost
        return (curve_point(self.curve, rows) + rows * (g - 1.0)) / g

    def _curve_cost(self, rows: int) -> float:
        c1 = self.plain_cost()
        return max(c1 * self.curve_point(rows) * self.curve_level.value, c1)

    def _expected_verify(self, rows: int) -> float:
        """What a batch of ``rows`` rows should cost, before its own measurements."""
        return self._curve_cost(rows) if self.curve is not None else self._line_cost(rows)

    def _line_cost(self, rows: int) -> float:
        c1 = self.plain_cost()
        if self.verify.empty:
            return c1 + PRIOR_VERIFY_SLOPE * c1 * (rows - 1)
        a, slope = self._line if self._line is not None else self.verify.line(PRIOR_VERIFY_SLOPE * c1)
        self._line = (a, slope)
        return max(a + max(slope, 0.0) * rows, c1)

    def setup_cost(self, drafter: int) -> float:
        """The drafter's one-time cost still to pay (loading), seconds."""
        return 0.0 if self.ready[drafter] else self.profiles[drafter].setup_s

    def draft_cost(self, offer: Offer, n: int) -> float:
        d = offer.drafter
        profile = self.profiles[d]
        c1 = self.plain_cost()
        step = self.step[d].get(profile.step_cost * c1)
        catch_up = self.catch_up[d].get(profile.catch_up_cost * c1)
        return self.setup_cost(d) + max(offer.catch_up - 2, 0) * catch_up + n * step

    def lengths(self, offer: Offer, room: int, forced: int = 0) -> list[tuple[int, float]]:
        """The draft lengths worth choosing, with their step's time (drafting
        and verifying, seconds, without the one-time setup): up to the room
        left and the offer's longest, less every length whose step takes as
        long as a longer one's, within `TIE` (a batch size that costs as much
        as a larger one). Lengths past `useful_length` of the offer's
        acceptance are not weighed."""
        d = offer.drafter
        limit = min(offer.max_len, room, useful_length(self.acceptance(d, offer.bucket)))
        key = (d, offer.catch_up, forced, limit)
        known = self._lengths.get(key)
        if known is not None:
            return known
        # `draft_cost` without the setup, its parts taken once
        profile, c1, verify = self.profiles[d], self.plain_cost(), self.verify_cost
        step = self.step[d].get(profile.step_cost * c1)
        catch_up = max(offer.catch_up - 2, 0) * self.catch_up[d].get(profile.catch_up_cost * c1)
        times = [catch_up + n * step + verify(forced + n + 1) for n in range(1, limit + 1)]
        kept: list[tuple[int, float]] = []
        quickest_longer = math.inf  # of the lengths kept: ties do not chain, so none costs more than TIE
        for n in range(limit, 0, -1):
            t = times[n - 1]
            if quickest_longer > t * (1.0 + TIE):
                kept.append((n, t))
                quickest_longer = t
        self._lengths[key] = kept = kept[::-1]
        return kept

    def best_length(self, offer: Offer, room: int, forced: int = 0) -> tuple[float, int]:
        """(expected tokens/s, draft length) of the offer's best length, after ``forced`` tokens."""
        a = self.acceptance(offer.drafter, offer.bucket)
        setup = self.setup_cost(offer.drafter)
        key = (offer.drafter, offer.catch_up, forced, min(offer.max_len, room), a)
        known = self._best.get(key) if not setup else None
        if known is not None:
            return known
        best_rate, best_n = 0.0, 0
        for n, t in self.lengths(offer, room, forced):
            rate = (forced + expected_tokens(a, n)) / (setup + t)
            if rate > best_rate:  # not one peak: some batch sizes run faster kernels than smaller ones
                best_rate, best_n = rate, n
        if len(self._best) > MEMO_SIZE:
            self._best.clear()
        self._best[key] = best_rate, best_n
        return best_rate, best_n

    def _forget(self) -> None:
        """The weighed lengths go: a cost they were weighed with moved."""
        self._lengths.clear()
        self._best.clear()
        self._memo_plain = self.plain_cost()
        self._memo_depth_cost = self.depth_cost

    # -- choice --

    def choose(self, offers: Sequence[Offer], room: int, forced: int = 0) -> Plan:
        self.rounds += 1
        if self.plain.value is None or room < 1 or not offers:
            return PLAIN  # the first step measures a plain step
        best_rate = (forced + 1) / self.verify_cost(forced + 1)  # forced tokens: drafts that cannot be rejected
        best = PLAIN
        rated: list[tuple[Offer, float, int]] = []
        for offer in offers:
            rate, n = self.best_length(offer, room, forced)
            rated.append((offer, rate, n))
            if n and rate > best_rate:
                best_rate, best = rate, Plan(offer, n)
        budget = self.explore_share * self.elapsed - self.explored  # what a probe may still lose
        for offer, _rate, best_n in rated:
            if budget < 0.0:  # a probe loses no less than nothing: none fits
                break
            if best.offer is not None and offer == best.offer:
                continue
            key = (offer.drafter, offer.bucket)
            if self.rounds - self.last_used.get(key, -MAX_GAP) < self.gap.get(key, MIN_GAP) or not best_n:
                continue
            allowed = [n for n, _ in self.lengths(offer, room, forced)]
            short = [n for n in allowed if n <= min(best_n, PROBE_MAX)]
            n = short[-1] if short else allowed[0]  # short, unless a longer step is as quick
            cost = self.draft_cost(offer, n) + self.verify_cost(forced + n + 1)
            regret = max(cost - (forced + expected_tokens(self.acceptance(*key), n)) / best_rate, 0.0)
            if regret <= budget:
                self.gap[key] = min(self.gap.get(key, MIN_GAP) * 2, MAX_GAP)
                self.last_used[key] = self.rounds
                return Plan(offer, n, probe=True, best_rate=best_rate)
        if best.offer is not None:
            key = (best.offer.drafter, best.offer.bucket)
            self.last_used[key] = self.rounds
            self.gap[key] = MIN_GAP
        return Plan(best.offer, best.n, best_rate=best_rate)

    # -- measurements --

    def observe_plain(self, seconds: float) -> None:
        self.plain.add(seconds)
        self._line = None
        if abs(self.plain_cost() - self._memo_plain) > MEMO_SHIFT * self._memo_plain:
            self._forget()

    def observe_verify(self, rows: int, seconds: float) -> None:
        if rows > 1:
            self._forget()
            if self.curve is not None or not self.verify.empty:  # a step stalled by other work counts less
                seconds = min(seconds, SPIKE * self._expected_verify(rows))
            if self.curve is not None and self.plain.value is not None:
                self.curve_level.add(seconds / (self.plain.value * self.curve_point(rows)))
            self.verify.add(rows, seconds)
            self._line = None
            self.sizes.setdefault(rows, _Average()).add(seconds)

    def observe_draft(self, drafter: int, draft: Draft) -> None:
        if not self.ready[drafter]:
            self.ready[drafter] = True
            self._forget()
        n = len(draft.tokens)
        if not n:
            return
        before = self.step[drafter].value, self.catch_up[drafter].value
        if draft.n_sync > 2:  # a catch-up: its cost per token, apart from the drafting steps
            self.catch_up[drafter].add(draft.sync_s / draft.n_sync)
            if n > 1:
                self.step[drafter].add(draft.steps_s / (n - 1))
        else:
            self.step[drafter].add((draft.sync_s + draft.steps_s) / n)
        for old, now in zip(before, (self.step[drafter].value, self.catch_up[drafter].value), strict=True):
            if now is not None and (old is None or abs(now - old) > MEMO_SHIFT * old):
                self._forget()
                break

    def observe_batch(self, rows: int, seconds: float) -> None:
        """Costs as a verify batch of as many rows does. Until a plain step is
        measured, the batch's time over the curve's point for its rows stands
        for one (sequences decoding together take no step alone)."""
        if rows <= 1:
            self.observe_plain(seconds)
            return
        if self.plain.value is None:
            if self.curve is None:
                return
            self.observe_plain(seconds / self.curve_point(rows))
        self.observe_verify(rows, seconds)

    def observe_outcome(self, offer: Offer, proposed: int, accepted: int) -> None:
        key = (offer.drafter, offer.bucket)
        acc, tested, last = self.counts.get(key, (0.0, 0.0, self.rounds))
        fade = ACCEPT_MEMORY ** (1 + (self.rounds - last) / IDLE_FADE)
        tested_now = accepted + (1 if accepted < proposed else 0)
        self.counts[key] = (acc * fade + accepted, tested * fade + tested_now, self.rounds)

    def observe_round(self, plan: Plan, seconds: float, tokens: int) -> None:
        self.elapsed += seconds
        if plan.probe and plan.best_rate > 0:
            self.explored += max(seconds - tokens / plan.best_rate, 0.0)

    def wants_offers(self) -> bool:
        return self.payoff.wants_offers()

    def observe_step(self, seconds: float, tokens: int, asked_s: float, drafted: int) -> None:
        self.payoff.observe_step(seconds, tokens, asked_s, drafted)

    def observe_depth(self, tokens: int) -> None:
        if self.growth is None or self.pads:  # extra rows nearly free (a GPU): they share the step's reads
            return
        self.depth_cost = self.growth.at(tokens)
        if abs(self.depth_cost - self._memo_depth_cost) > GROWTH_SHIFT * self._memo_depth_cost:
            self._forget()


class Unobserving:
    """A controller's observations, ignored: for controllers whose way is fixed."""

    def observe_plain(self, seconds: float) -> None:
        pass

    def observe_verify(self, rows: int, seconds: float) -> None:
        pass

    def observe_draft(self, drafter: int, draft: Draft) -> None:
        pass

    def observe_outcome(self, offer: Offer, proposed: int, accepted: int) -> None:
        pass

    def observe_round(self, plan: Plan, seconds: float, tokens: int) -> None:
        pass

    def observe_batch(self, rows: int, seconds: float) -> None:
        pass

    def wants_offers(self) -> bool:
        return True

    def observe_step(self, seconds: float, tokens: int, asked_s: float, drafted: int) -> None:
        pass

    def observe_depth(self, tokens: int) -> None:
        pass


@dataclass
class FixedController(Unobserving):
    """Always the same drafter and draft length when it has something to
    offer, else a plain step: fixed settings, for comparison."""

    drafter: int
    n: int

    def choose(self, offers: Sequence[Offer], room: int, forced: int = 0) -> Plan:
        for offer in offers:
            if offer.drafter == self.drafter and room >= 1:
                return Plan(offer, min(self.n, offer.max_len, room))
        return PLAIN
