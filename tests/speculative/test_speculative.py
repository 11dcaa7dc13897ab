from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from localrun.errors import IncompatibleDraftError
from localrun.events import DraftStats, TokenEvent
from localrun.gguf.reader import read_gguf, read_strings
from localrun.runtime.decoder import Decoder
from localrun.runtime.engine import Engine
from localrun.runtime.generate import generate
from localrun.runtime.sampling import SamplingParams
from localrun.speculative import Speculation, open_speculation
from localrun.speculative.base import LOOKUP_MAX, MODEL_MAX, Draft, Offer, Profile
from localrun.speculative.control import PLAIN, AdaptiveController, FixedController, Plan, StepGrowth
from localrun.speculative.draftmodel import DraftModelDrafter, check_draft_compatible
from localrun.speculative.lookup import RESUME_BUCKET, PromptLookupDrafter, match_bucket
from localrun.speculative.sampling import check_draft, target_probs
from localrun.speculative.stepper import MAX_REST, QUIET
from tests.helpers import cli, collect, engine_config, on_terminal
from tests.tinymodel import MERGES, SPECIALS, vocabulary, write_tiny_model

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("spec")
    return {
        "target": write_tiny_model(d / "target.gguf", n_ctx_train=4096),
        "other": write_tiny_model(d / "other.gguf", seed=7, n_ctx_train=4096),  # same vocabulary, unrelated
        "bigram": write_tiny_model(d / "bigram.gguf", bigram=True, n_ctx_train=4096),  # greedy text loops
        "foreign": write_tiny_model(d / "foreign.gguf", merges=MERGES[::-1]),  # same size, other token texts
    }


@pytest.fixture(scope="module")
def engine(models: dict[str, Path]) -> Iterator[Engine]:
    with Engine(engine_config(models["target"], n_ctx=1024, n_threads=2)) as eng:
        yield eng


@pytest.fixture(scope="module")
def bigram(models: dict[str, Path]) -> Iterator[Engine]:
    with Engine(engine_config(models["bigram"], n_ctx=1024, n_threads=2)) as eng:
        yield eng


def plain(engine: Engine, prompt: Sequence[int], sampling: SamplingParams = GREEDY, n: int = 300) -> str:
    return collect(generate(engine, prompt, sampling, max_tokens=n))[0]


def speculative(
    engine: Engine, prompt: Sequence[int], spec: Speculation, sampling: SamplingParams = GREEDY, n: int = 300
) -> tuple[str, DraftStats]:
    text, stats = collect(spec.generate(engine, prompt, sampling, max_tokens=n))
    assert stats.draft is not None and stats.generated_tokens == n
    return text, stats.draft


# -- greedy: the same text, token for token --


class SteadyMachine(AdaptiveController):
    """The adaptive controller, fed fixed costs instead of the clock (a plain
    step 1 s, a verify batch 1 s + 0.2 s per extra row, a draft step 0.3 s,
    asking free), so what it decides depends on acceptance alone, not on the
    test machine's load."""

    verify_s = draft_s = 0.0  # the last verify batch's and draft's fixed costs

    def observe_plain(self, seconds: float) -> None:
        super().observe_plain(1.0)

    def observe_verify(self, rows: int, seconds: float) -> None:
        self.verify_s = 1.0 + 0.2 * (rows - 1)
        super().observe_verify(rows, self.verify_s)

    def observe_draft(self, drafter: int, draft: Draft) -> None:
        self.draft_s = 0.3 * len(draft.tokens)
        super().observe_draft(drafter, Draft(draft.tokens, n_sync=1, steps_s=self.draft_s))

    def observe_round(self, plan: Plan, seconds: float, tokens: int) -> None:
        super().observe_round(plan, 1.0, tokens)

    def observe_step(self, seconds: float, tokens: int, asked_s: float, drafted: int) -> None:
        super().observe_step(self.draft_s + self.verify_s if drafted else 1.0, tokens, 0.0, drafted)


def test_lookup_on_a_loop_is_lossless_and_accepts_long_drafts(bigram: Engine) -> None:
    prompt = bigram.tokenize("the cat sat on the mat")
    lookup = PromptLookupDrafter()
    with Speculation([lookup], SteadyMachine([lookup.profile])) as spec:
        text, draft = speculative(bigram, prompt, spec)
    assert text == plain(bigram, prompt)
    assert draft.accepted > 200 and draft.mean_accepted > 4  # the controller drafts long on a loop
    with Speculation([PromptLookupDrafter()]) as timed:  # on the real clock: the same text, whatever it decides
        assert speculative(bigram, prompt, timed)[0] == text


class Asked(PromptLookupDrafter):
    """Prompt lookup that says nothing until the context reaches ``silent``
    tokens, and notes the context's length each time it is asked."""

    def __init__(self, silent: int) -> None:
        super().__init__()
        self.silent = silent
        self.asked: list[int] = []

    def offer(self, context: Sequence[int], index: int) -> Offer | None:
        self.asked.append(len(context))
        found = super().offer(context, index)  # it follows the text either way
        return found if len(context) >= self.silent else None


def test_drafters_that_draft_nothing_rest_and_a_copy_wakes_them(bigram: Engine) -> None:
    """Asked at every step at first; after `QUIET` steps with nothing
    drafted, at most once in `MAX_REST` + 1 steps; once they offer again, the
    first draft comes at most `MAX_REST` steps late, and then they are asked
    at every step. The text is plain decoding's throughout."""
    prompt = bigram.tokenize("the cat sat on the mat")
    wake = len(prompt) + 150
    drafter = Asked(silent=wake)
    with Speculation([drafter], SteadyMachine([drafter.profile])) as spec:
        text, draft = speculative(bigram, prompt, spec)
    assert text == plain(bigram, prompt)
    quiet = [n for n in drafter.asked if n < wake]
    assert quiet[:QUIET] == list(range(len(prompt) + 1, len(prompt) + 1 + QUIET))  # every step at first
    assert len(quiet) <= QUIET + 150 // (MAX_REST + 1) + MAX_REST  # then about one step in eight
    assert draft.accepted > 50  # the copy was found, and drafted
    woken = [n for n in drafter.asked if n >= wake]
    assert woken[0] - wake <= MAX_REST
    assert draft.rounds >= len(woken) - 2  # awake, each asking drafted: nothing to rest for
    steps = list(itertools.pairwise(woken[:20]))
    assert all(b - a <= LOOKUP_MAX + 1 for a, b in steps)  # asked at every step: a step decides a draft's tokens


def test_draft_copy_of_the_target_accepts_everything(engine: Engine, models: dict[str, Path]) -> None:
    prompt = engine.tokenize("hello there, general")
    with Speculation([DraftModelDrafter(models["target"], engine, eager=True)], FixedController(0, 4)) as spec:
        text, draft = speculative(engine, prompt, spec)
    assert text == plain(engine, prompt)
    assert draft.proposed > 50 and draft.accepted == draft.proposed


def test_unrelated_draft_is_lossless_across_many_rollbacks(engine: Engine, models: dict[str, Path]) -> None:
    prompt = engine.tokenize("once upon a time")
    drafter = DraftModelDrafter(models["other"], engine, eager=True, p_min=0.0)
    target = Decoder(engine)
    with Speculation([drafter], FixedController(0, 3)) as spec:
        text, stats = collect(spec.generate(engine, prompt, GREEDY, max_tokens=400, decoder=target))
        assert text == plain(engine, prompt, n=400)
        draft = stats.draft
        assert draft is not None and draft.rounds > 100 and draft.acceptance < 0.2  # nearly every step rolls back
        # the draft's cache is in step: it holds decided tokens only, and drafts what a fresh copy drafts
        held = list(drafter.decoder.tokens) if drafter.decoder else []
        context = list(target.tokens)
        assert len(context) >= len(prompt) + 390
        assert held and held == context[: len(held)] and len(held) > len(context) - 5
        rng = np.random.default_rng(0)
        again = drafter.draft(context[:-5], MODEL_MAX, GREEDY, rng).tokens
        assert drafter.decoder is not None
        kept = np.array(drafter.decoder.logits(-1))
    fresh = DraftModelDrafter(models["other"], engine, eager=True, p_min=0.0)
    try:
        assert fresh.draft(context[:-5], MODEL_MAX, GREEDY, rng).tokens == again
        assert fresh.decoder is not None
        assert np.allclose(np.array(fresh.decoder.logits(-1)), kept, rtol=0, atol=0.05)  # batch vs step rounding only
    finally:
        fresh.close()


def test_adaptive_mix_is_lossless_and_a_chat_reuses_the_cache(engine: Engine, models: dict[str, Path]) -> None:
    first = engine.tokenize("the cat sat on the mat. the cat sat on the mat. the cat")
    opened = open_speculation(engine, "auto", models["other"])
    assert opened is not None
    with opened as spec:
        decoder = Decoder(engine)
        text, _ = collect(spec.generate(engine, first, GREEDY, max_tokens=120, decoder=decoder))
        assert text == plain(engine, first, n=120)
        second = [*decoder.tokens, *engine.tokenize(" and then", add_special=False)]
        events = list(spec.generate(engine, second, GREEDY, max_tokens=80, decoder=decoder))
        again, stats = collect(iter(events))
    assert again == plain(engine, second, n=80)
    assert stats.cached_tokens >= len(first) + 115  # the first reply's tokens stayed in the cache


# -- temperature > 0: the target's distribution --


def _chi_square_p(observed: Sequence[float], expected: Sequence[float]) -> float:
    """p-value of Pearson's chi-square (Wilson-Hilferty approximation)."""
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    k = len(expected) - 1
    z = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


def _binned(counts: Counter[int], probs: np.ndarray, n: int) -> tuple[list[float], list[float]]:
    """Observed and expected counts, with cells expected under 5 pooled."""
    obs, exp, rest_o, rest_e = [], [], 0.0, 0.0
    for token in np.flatnonzero(probs > 0):
        e = probs[token] * n
        if e >= 5:
            obs.append(float(counts[int(token)]))
            exp.append(e)
        else:
            rest_o += counts[int(token)]
            rest_e += e
    outside = n - sum(counts[int(t)] for t in np.flatnonzero(probs > 0))
    assert outside == 0, "a token the distribution gives no chance to was drawn"
    if rest_e:
        obs.append(rest_o)
        exp.append(rest_e)
    return obs, exp


@pytest.mark.parametrize("deterministic", [False, True], ids=["sampled-q", "one-hot-q"])
def test_accept_resample_rule_keeps_the_target_distribution(deterministic: bool) -> None:
    rng = np.random.default_rng(1)
    p = np.array([0.5, 0.2, 0.15, 0.1, 0.05, 0.0])
    q = np.array([0.05, 0.05, 0.1, 0.2, 0.3, 0.3])  # far from p, and drafting a token p never picks
    n = 20000
    counts: Counter[int] = Counter()
    for _ in range(n):
        token = 4 if deterministic else int(rng.choice(len(q), p=q))
        replacement = check_draft(p, token, None if deterministic else q, rng)
        counts[token if replacement is None else replacement] += 1
    assert _chi_square_p(*_binned(counts, p, n)) > 0.001


def test_target_probs_follow_the_native_chain(engine: Engine) -> None:
    logits = np.linspace(-3.0, 3.0, engine.n_vocab)
    params = SamplingParams(temperature=0.5, top_k=10, top_p=0.9, min_p=0.0)
    p = target_probs(logits, params)
    kept = np.flatnonzero(p)
    assert set(kept) <= set(range(engine.n_vocab - 10, engine.n_vocab))  # top-k
    assert abs(p.sum() - 1) < 1e-9 and p[-1] == p.max()
    top = np.exp(logits[-10:] - logits[-1])[::-1]
    cum = np.cumsum(top / top.sum())
    assert len(kept) == int(np.searchsorted(cum, 0.9)) + 1  # top-p at temperature 1, then temperature
    assert p[-1] / p[-2] == pytest.approx(math.exp((logits[-1] - logits[-2]) / 0.5))
    minp = target_probs(logits, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.5))
    assert np.all(logits[np.flatnonzero(minp)] >= logits[-1] + math.log(0.5))
    penalized = target_probs(logits, SamplingParams(temperature=1.0, top_k=3, repeat_penalty=1e9), [engine.n_vocab - 1])
    assert penalized[-1] == 0.0 and penalized[-4] > 0  # the repeated token drops out of the top 3


def test_sampled_draft_model_keeps_the_next_token_distribution(bigram: Engine, models: dict[str, Path]) -> None:
    """With a bigram target, the token after t1 has the known distribution
    p(. | t1); the draft model's sampled drafts must not change it."""
    sampling = SamplingParams(temperature=1.0, top_k=4, top_p=1.0, min_p=0.0)
    prompt = bigram.tokenize("the cat")
    decoder = Decoder(bigram)

    def next_probs(token: int) -> np.ndarray:
        decoder.prefill([*prompt, token])
        return target_probs(decoder.logits(-1), sampling)  # type: ignore[no-any-return]

    decoder.prefill(prompt)
    first = target_probs(decoder.logits(-1), sampling)
    after = {int(t): next_probs(int(t)) for t in np.flatnonzero(first)}
    n = 400
    pairs: Counter[int] = Counter()
    drafter = DraftModelDrafter(models["other"], bigram, eager=True, p_min=0.0)
    with Speculation([drafter], FixedController(0, 2)) as spec:
        for seed in range(n):
            s = SamplingParams(temperature=1.0, top_k=4, top_p=1.0, min_p=0.0, seed=seed)
            # t2 is decided by checking a draft, and evaluated (so in the cache) before 4 tokens are out
            _, stats = collect(spec.generate(bigram, prompt, s, max_tokens=4, decoder=decoder))
            assert stats.draft is not None and stats.draft.proposed > 0
            t1, t2 = decoder.tokens[len(prompt) : len(prompt) + 2]
            pairs[t1 * bigram.n_vocab + t2] += 1
    joint = np.zeros(bigram.n_vocab * bigram.n_vocab)
    for t1, probs in after.items():
        joint[t1 * bigram.n_vocab : (t1 + 1) * bigram.n_vocab] = first[t1] * probs
    assert _chi_square_p(*_binned(pairs, joint / joint.sum(), n)) > 0.001


def test_seeded_lookup_sampling_is_plain_sampling(bigram: Engine) -> None:
    sampling = SamplingParams(temperature=0.7, top_k=5, top_p=1.0, min_p=0.0, seed=3)
    prompt = bigram.tokenize("the cat sat")
    with Speculation([PromptLookupDrafter()], FixedController(0, 4)) as spec:
        text, draft = speculative(bigram, prompt, spec, sampling, n=200)
    assert draft.accepted > 0
    assert text == plain(bigram, prompt, sampling, n=200)


# -- the draft model's vocabulary --


def test_token_texts_read_from_the_header(models: dict[str, Path]) -> None:
    info = read_gguf(models["target"])
    tokens = info.metadata["tokenizer.ggml.tokens"]
    assert [t.decode() for t in read_strings(models["target"], tokens)] == vocabulary()[0]
    assert read_strings(models["target"], tokens, 1, 3) == [s.encode() for s in SPECIALS[1:3]]


def test_incompatible_draft_is_refused_naming_the_difference(models: dict[str, Path], tmp_path: Path) -> None:
    target = read_gguf(models["target"])
    check_draft_compatible(target, read_gguf(models["other"]))  # same vocabulary: fine
    with pytest.raises(IncompatibleDraftError, match=r"token \d+ differs"):
        check_draft_compatible(target, read_gguf(models["foreign"]))
    known = set(vocabulary()[0])  # a token twice is a broken file (read_gguf refuses it): only new ones
    extra = [f"{a} {b}" for a in "bcdfghjklmnp" for b in "aeiouyhlmnrstw" if a + b not in known]
    big = write_tiny_model(tmp_path / "big.gguf", merges=MERGES + extra)
    with pytest.raises(IncompatibleDraftError, match="vocabulary sizes differ"):
        check_draft_compatible(target, read_gguf(big))
    res = cli("generate", "-m", str(models["target"]), "-n", "4", "--draft-model", str(models["foreign"]), "hi")
    assert res.returncode == 2
    assert "cannot draft for" in res.stderr and "differs" in res.stderr and "Traceback" not in res.stderr


def test_none_means_no_speculation(engine: Engine, models: dict[str, Path]) -> None:
    assert open_speculation(engine, "none", models["other"]) is None
    auto = open_speculation(engine, "auto", models["other"])
    assert auto is not None
    drafter = auto.drafters[-1]
    assert isinstance(drafter, DraftModelDrafter) and not drafter.loaded  # auto loads it only when wanted
    assert isinstance(auto.controller, AdaptiveController) and auto.controller.curve is None
    auto.close()


def test_the_verify_curve_reaches_the_controller(engine: Engine) -> None:
    growth = StepGrowth(32, 10.0, 0.01)
    opened = open_speculation(engine, "lookup", verify_curve=[1.0, 1.5, 1.5], growth=growth)
    assert opened is not None
    with opened as spec:
        assert isinstance(spec.controller, AdaptiveController) and spec.controller.curve == (1.0, 1.5, 1.5)
        assert spec.controller.growth is growth
    fixed = FixedController(0, 2)
    assert Speculation([PromptLookupDrafter()], fixed, verify_curve=[1.0, 2.0]).controller is fixed


def test_the_controller_follows_the_contexts_depth(bigram: Engine) -> None:
    """The step tells the controller how long the context is, so that a
    verify batch's cost follows a step's growth with it (`StepGrowth`)."""
    prompt = bigram.tokenize("the cat sat on the mat")
    growth = StepGrowth(0, 10.0, 0.01)  # a step costs 1 + depth / 1000 of one on an empty context
    lookup = PromptLookupDrafter()
    control = SteadyMachine([lookup.profile], verify_curve=[1.0, 1.2, 1.4, 1.6], growth=growth)
    with Speculation([lookup], control) as spec:
        speculative(bigram, prompt, spec, n=100)
    assert growth.at(len(prompt) + 50) < control.depth_cost <= growth.at(len(prompt) + 100)


# -- prompt lookup --


def test_lookup_offers_the_continuation_of_the_best_agreeing_source() -> None:
    lookup = PromptLookupDrafter()
    rng = np.random.default_rng(0)
    context = [5, 1, 2, 3, 9, 9, 7, 0, 0, 2, 3, 8, 4, 1, 2, 3]
    lookup.begin(context[:4])
    offer = lookup.offer(context, 0)  # [2 3] ended twice before; before the first, [1 2 3] agrees
    assert offer is not None and offer.bucket == match_bucket(3)
    assert lookup.draft(context, 3, GREEDY, rng).tokens == [9, 9, 7]
    source = list(range(10, 30))
    copy = [*source, *source[:10]]
    lookup.begin(copy)
    offer = lookup.offer(copy, 0)
    assert offer is not None and offer.bucket == match_bucket(10)
    assert lookup.draft(copy, 2, GREEDY, rng).tokens == [20, 21]
    edited = [*copy, 99]  # the copy replaced 20: lookup resumes the source after it
    offer = lookup.offer(edited, 0)
    assert offer is not None and offer.bucket == RESUME_BUCKET
    assert lookup.draft(edited, 3, GREEDY, rng).tokens == [21, 22, 23]
    short = [*source, *source[:5]]
    assert lookup.offer(short, 0) is not None
    assert lookup.offer([*short, 99], 0) is None  # too little agrees to resume past a difference
    loop = [4, 6, 4, 6]
    lookup.begin(loop)
    assert lookup.offer(loop, 0) is not None
    assert lookup.draft(loop, 5, GREEDY, rng).tokens == [4, 6, 4, 6, 4]  # a loop continues past the cursor
    lookup.begin([1, 2, 3])
    assert lookup.offer([1, 2, 3], 0) is None


# -- the controller --


def _controller(slope: float, draft_step: float, *, explore: float = 0.02) -> AdaptiveController:
    lookup = PromptLookupDrafter().profile
    draft = Profile(name="draft", step_cost=0.4, catch_up_cost=0.05, setup_s=0.0, acceptance=(0.7,), free=False)
    control = AdaptiveController([lookup, draft], explore_share=explore)
    control.observe_plain(0.1)
    for rows in (2, 5, 9, 2, 5, 9):
        control.observe_verify(rows, 0.1 + (rows - 1) * slope * 0.1)

    control.observe_draft(1, Draft([1, 2], n_sync=1, sync_s=draft_step * 0.1, steps_s=draft_step * 0.1))
    return control


def _teach(control: AdaptiveController, offer: Offer, acceptance: float, rounds: int = 40) -> None:
    """Outcomes of drafts of 8 tokens, each kept with probability ``acceptance``."""
    rng = np.random.default_rng(0)
    for _ in range(rounds):
        accepted = 0
        while accepted < 8 and rng.random() < acceptance:
            accepted += 1
        control.observe_outcome(offer, 8, accepted)


def test_controller_picks_the_fastest_way_from_measurements() -> None:
    lookup, model = Offer(0, 6, 32), Offer(1, 0, 8, catch_up=1)
    control = _controller(slope=0.33, draft_step=0.43)  # a costly draft, costly verify rows (a CPU)
    _teach(control, model, 0.6)
    assert control.choose([model], 32).offer is None  # 60% accepted loses to plain decoding
    _teach(control, model, 0.84)
    assert control.choose([model], 32).n <= 2  # 84% pays a little, with short drafts only
    _teach(control, lookup, 0.97)
    plan = control.choose([lookup, model], 32)
    assert plan.offer == lookup and 4 <= plan.n <= 16  # copying: long lookup drafts, not the longest
    _teach(control, lookup, 0.1)
    assert control.choose([lookup], 32).offer is None
    cheap = _controller(slope=0.02, draft_step=0.05)  # a flat verify cost, a cheap draft (a GPU)
    _teach(cheap, model, 0.8)
    plan = cheap.choose([model], 32)
    assert plan.offer == model and plan.n >= 4
    assert cheap.choose([model], 1).n == 1  # never past the room left


def _simulate(control: AdaptiveController, acceptance: Sequence[float], rng: np.random.Generator) -> list[int]:
    """Run the controller on a synthetic machine: a plain step 0.1 s, a verify
    row 0.033 s more, lookup free; returns the draft length used per round."""
    offer_for = {b: Offer(0, b, 32) for b in range(7)}
    used = []
    for a in acceptance:
        plan = control.choose([offer_for[2]], 64)
        if plan.offer is None:
            control.observe_plain(0.1)
            control.observe_round(plan, 0.1, 1)
            used.append(0)
            continue
        accepted = 0
        while accepted < plan.n and rng.random() < a:
            accepted += 1
        seconds = 0.1 + 0.033 * plan.n
        control.observe_verify(plan.n + 1, seconds)
        control.observe_outcome(plan.offer, plan.n, accepted)
        control.observe_round(plan, seconds, accepted + 1)
        used.append(plan.n)
    return used


def test_controller_probes_cheaply_and_changes_its_mind() -> None:
    control = _controller(slope=0.33, draft_step=0.43)
    rng = np.random.default_rng(0)
    used = _simulate(control, [0.02] * 1500 + [0.95] * 300 + [0.02] * 600, rng)
    prose, copying, back = used[:1500], used[1500:1800], used[1800:]
    assert 3 <= sum(1 for n in prose if n) <= 100  # it keeps probing, rarely
    assert control.explored <= 0.02 * control.elapsed + 0.1  # within its probing budget
    assert sum(1 for n in copying[100:] if n >= 4) > 150  # it noticed the copying, and drafts long
    assert sum(1 for n in back[100:] if n) < 30  # and went back to plain decoding


def test_fixed_controller_always_drafts_when_offered() -> None:
    fixed = FixedController(1, 3)
    assert fixed.choose([Offer(0, 0, 32), Offer(1, 0, 8)], 64).n == 3
    assert fixed.choose([Offer(0, 0, 32)], 64) == PLAIN


# -- what the user sees --


def test_json_done_event_reports_the_drafts(models: dict[str, Path]) -> None:
    args = ("generate", "-m", str(models["bigram"]), "-n", "120", "--temperature", "0", "--json")
    res = cli(*args, "--spec", "lookup", "the cat sat")
    assert res.returncode == 0, res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines()]
    draft = events[-1]["draft"]
    assert draft["drafter"] == "lookup" and 0 < draft["accepted"] <= draft["proposed"]
    none = [json.loads(line) for line in cli(*args, "--spec", "none", "the cat sat").stdout.splitlines()]
    assert "draft" not in none[-1]
    assert "".join(e.get("text", "") for e in none) == "".join(e.get("text", "") for e in events)


def test_running_figures_name_the_drafter_that_drafted(bigram: Engine) -> None:
    """Every token event's draft figures are those of the drafters that drafted
    so far; plain decoding is never named as a drafter with an acceptance."""
    prompt = bigram.tokenize("the cat sat")
    with Speculation([PromptLookupDrafter()]) as spec:
        events = list(spec.generate(bigram, prompt, GREEDY, max_tokens=120))
    drafts = [ev.draft for ev in events if isinstance(ev, TokenEvent) and ev.draft is not None]
    assert any(d.proposed for d in drafts)
    for d in drafts:
        assert (d.drafter == "plain") == (d.proposed == 0), d


@pytest.mark.pty
def test_panel_footer_shows_acceptance(models: dict[str, Path]) -> None:
    status, screen = on_terminal(
        "generate", "-m", str(models["bigram"]), "-n", "150", "-t", "0", "--spec", "lookup", "the cat sat"
    )
    assert status == 0
    assert "lookup" in screen and "accepted" in screen and "/step" in screen


def test_a_named_draft_model_that_drafted_nothing_is_said(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the controller keeps to plain decoding, the user who named a draft model hears why it did nothing."""
    from localrun import speculative

    monkeypatch.setattr(speculative, "AdaptiveController", lambda profiles, **_: FixedController(len(profiles), 1))
    res = cli("generate", "-m", str(models["target"]), "-n", "8", "--draft-model", str(models["other"]), "hi")
    assert res.returncode == 0, res.stderr
    assert "other.gguf drafted nothing" in res.stderr


def test_the_draft_model_decodes_with_the_targets_thread_count(models: dict[str, Path]) -> None:
    """The thread governor speaks for the target: when it drops a thread, the
    draft model's context drops it too (else the draft would collapse under load)."""
    with Engine(engine_config(models["target"], n_ctx=256, n_threads=2)) as target:
        drafter = DraftModelDrafter(models["other"], target, eager=True, p_min=0.0)
        try:
            assert drafter.engine is not None and drafter.engine.threads == 2
            assert not drafter.engine.config.adapt_threads  # its own steps are never timed
            target.set_threads(1)
            drafter.draft(target.tokenize("once upon a time"), 3, GREEDY, np.random.default_rng(0))
            assert drafter.engine.threads == 1
            target.set_threads(2)
            drafter.draft(target.tokenize("once upon a time"), 3, GREEDY, np.random.default_rng(0))
            assert drafter.engine.threads == 2
        finally:
            drafter.close()
