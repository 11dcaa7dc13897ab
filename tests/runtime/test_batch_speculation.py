"""Prompt lookup inside the continuous batch: a request decoding alone
drafts, its draft is verified in the step's batch, and its text is the one
it would have had without drafting."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from localrun.events import SequenceDone
from localrun.runtime.batch.scheduler import BatchRequest, ContinuousBatch
from localrun.runtime.engine import Engine
from localrun.runtime.generate import generate
from localrun.runtime.sampling import SamplingParams
from localrun.speculative import Speculation, lookup_drafters
from localrun.speculative.base import Draft, Offer
from localrun.speculative.control import PAD_SIZES, FixedController, Plan
from localrun.speculative.lookup import PromptLookupDrafter
from tests.helpers import collect, engine_config
from tests.tinymodel import write_tiny_model

SEQ_CTX = 512


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    model = write_tiny_model(tmp_path_factory.mktemp("lookup") / "bigram.gguf", bigram=True, n_ctx_train=4096)
    with Engine(engine_config(model, n_ctx=2 * SEQ_CTX, n_seq_max=2, n_threads=2)) as eng:
        yield eng


def _run(engine: Engine, requests: list[BatchRequest]) -> dict[int, SequenceDone]:
    speculation = Speculation(lookup_drafters(engine), FixedController(0, 4))  # always draft when lookup can
    run = ContinuousBatch(engine, 2, SEQ_CTX, speculation=speculation)
    for request in requests:
        run.submit(request)
    return {ev.index: ev for ev in run.events() if isinstance(ev, SequenceDone)}


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=5)])
def test_a_request_alone_drafts_and_keeps_its_text(engine: Engine, sampling: SamplingParams) -> None:
    prompt = engine.tokenize("one two three one two three one two")
    plain, _ = collect(generate(engine, prompt, sampling, max_tokens=200))
    done = _run(engine, [BatchRequest(0, prompt, sampling, max_tokens=200)])[0]
    assert done.text == plain  # deterministic drafts: a seeded sample per row, as plain decoding draws them
    draft = done.stats.draft
    assert draft is not None and draft.proposed > 20 and draft.accepted > 10


@dataclass
class Recording(FixedController):
    """Prompt lookup's fixed way, and every call the loop makes to the
    controller, without the seconds (which differ from run to run)."""

    calls: list[tuple[object, ...]] = field(default_factory=list)

    def choose(self, offers: Sequence[Offer], room: int, forced: int = 0) -> Plan:
        plan = super().choose(offers, room, forced)
        self.calls.append(("choose", tuple(offers), room, forced, plan))
        return plan

    def observe_plain(self, seconds: float) -> None:
        self.calls.append(("plain",))

    def observe_verify(self, rows: int, seconds: float) -> None:
        self.calls.append(("verify", rows))

    def observe_draft(self, drafter: int, draft: Draft) -> None:
        self.calls.append(("draft", drafter, tuple(draft.tokens)))

    def observe_outcome(self, offer: Offer, proposed: int, accepted: int) -> None:
        self.calls.append(("outcome", offer, proposed, accepted))

    def observe_round(self, plan: Plan, seconds: float, tokens: int) -> None:
        self.calls.append(("round", plan, tokens))


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=5)])
def test_alone_in_a_batch_the_controller_sees_what_the_single_loop_shows_it(
    engine: Engine, sampling: SamplingParams
) -> None:
    """One stepper for both loops: a request decoding alone in the batch
    gives the controller the same calls, in the same order, with the same
    figures, and the same tally as the single-sequence loop on its prompt."""
    prompt = engine.tokenize("one two three four one two three four one two")
    single = Recording(0, 4)
    text, stats = collect(
        Speculation([PromptLookupDrafter()], single).generate(engine, prompt, sampling, max_tokens=120)
    )
    batched = Recording(0, 4)
    run = ContinuousBatch(engine, 2, SEQ_CTX, speculation=Speculation([PromptLookupDrafter()], batched))
    run.submit(BatchRequest(0, prompt, sampling, max_tokens=120))
    done = next(ev for ev in run.events() if isinstance(ev, SequenceDone))
    assert done.text == text
    assert batched.calls == single.calls
    assert done.stats.draft == stats.draft
    kinds = [call[0] for call in single.calls]
    # every step is a round; a step while the drafters rest (`stepper.QUIET`) asks the controller nothing
    assert {"plain", "verify", "outcome"} <= set(kinds) and kinds.count("round") >= kinds.count("choose") > 10
    outcomes = [call for call in single.calls if call[0] == "outcome"]
    rejected = any(proposed != accepted for _, _, proposed, accepted in outcomes)  # and rolled back
    assert rejected != sampling.greedy  # greedy, this model keeps every draft; sampled, it rejects some


def test_requests_decoding_together_do_not_draft(engine: Engine) -> None:
    greedy = SamplingParams(temperature=0.0)
    prompts = [engine.tokenize("one two three one two"), engine.tokenize("four five six four five")]
    done = _run(engine, [BatchRequest(i, p, greedy, max_tokens=60, ignore_eos=True) for i, p in enumerate(prompts)])
    for i, prompt in enumerate(prompts):
        assert done[i].text == collect(generate(engine, prompt, greedy, max_tokens=60, ignore_eos=True))[0]
        assert done[i].stats.draft is None  # never alone: both end at the same step


@pytest.mark.parametrize("unified", [False, True])
def test_a_prefix_another_slot_holds_is_copied_not_evaluated(tmp_path: Path, unified: bool) -> None:
    """A long system prompt one slot holds (its request still running) is
    copied into the slot a new request takes: only the new request's own
    tokens are evaluated, and its text is what it gives alone."""
    model = write_tiny_model(tmp_path / "tiny.gguf", n_ctx_train=4096)
    greedy = SamplingParams(temperature=0.0)
    config = engine_config(model, n_ctx=2 * SEQ_CTX, n_seq_max=2, n_threads=2, kv_unified=unified)
    with Engine(config) as engine:
        system = engine.tokenize(" ".join(f"rule {i} is to be brief" for i in range(12)))
        first = [*system, *engine.tokenize(" first question", add_special=False)]
        second = [*system, *engine.tokenize(" another one entirely", add_special=False)]
        expected = collect(generate(engine, second, greedy, max_tokens=20))[0]
        run = ContinuousBatch(engine, 2, SEQ_CTX, reuse_prefix=True)
        run.submit(BatchRequest(0, first, greedy, max_tokens=40, ignore_eos=True))
        run.step()  # the first request's prompt is evaluated in slot 0, which stays busy
        run.submit(BatchRequest(1, second, greedy, max_tokens=20))
        done: dict[int, SequenceDone] = {}
        while run.busy:
            done |= {ev.index: ev for ev in run.step()[1] if isinstance(ev, SequenceDone)}
        run.close()
    assert len(system) >= 32
    assert done[1].stats.cached_tokens >= len(system)
    assert done[1].text == expected


FLAT = tuple(1.0 + 0.3 * (r - 1) / 63 for r in range(1, 65))  # a GPU's verify curve: extra rows nearly free
STEEP = tuple(1.0 + 0.8 * (r - 1) for r in range(1, 17))  # a CPU's


@dataclass
class Batches(FixedController):
    """Prompt lookup's fixed way; records what each choice was weighed
    against (the other sequences' rows) and each shared batch's rows."""

    company: list[int] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    verified: list[int] = field(default_factory=list)  # the rows of each verify batch of one sequence

    def observe_verify(self, rows: int, seconds: float) -> None:
        self.verified.append(rows)

    def choose(self, offers: Sequence[Offer], room: int, forced: int = 0) -> Plan:
        self.company.append(forced)
        return super().choose(offers, room, forced)

    def observe_batch(self, rows: int, seconds: float) -> None:
        self.batches.append(rows)


def _together(
    engine: Engine, prompts: list[str], sampling: SamplingParams, curve: Sequence[float] | None, slots: int
) -> tuple[dict[int, SequenceDone], Batches]:
    control = Batches(0, 4)
    run = ContinuousBatch(
        engine, slots, SEQ_CTX, speculation=Speculation(lookup_drafters(engine), control, verify_curve=curve)
    )
    for i, prompt in enumerate(prompts):
        run.submit(BatchRequest(i, engine.tokenize(prompt), sampling, max_tokens=80, ignore_eos=True))
    return {ev.index: ev for ev in run.events() if isinstance(ev, SequenceDone)}, control


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    model = write_tiny_model(tmp_path_factory.mktemp("four") / "bigram.gguf", bigram=True, n_ctx_train=4096)
    with Engine(engine_config(model, n_ctx=4 * SEQ_CTX, n_seq_max=4, n_threads=2)) as eng:
        yield eng


PROMPTS = [
    "one two three one two",
    "four five six four five",
    "the cat sat on the mat the cat",
    "seven eight seven eight seven",
    "a b c a b c a",
]


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=5)])
def test_on_a_flat_curve_sequences_decoding_together_draft_and_keep_their_text(
    four: Engine, sampling: SamplingParams
) -> None:
    """Four slots, five requests (the fifth's prompt joins midway): where
    extra rows are nearly free, each sequence drafts in the shared batch,
    and every text is the one it has alone without drafting."""
    done, control = _together(four, PROMPTS, sampling, FLAT, 4)
    for i, prompt in enumerate(PROMPTS):
        expected = collect(generate(four, four.tokenize(prompt), sampling, max_tokens=80, ignore_eos=True))[0]
        assert done[i].text == expected, i
        draft = done[i].stats.draft
        assert draft is not None and draft.proposed > 4 and draft.accepted > 0  # (fewer while drafts lose: rests)
    assert 3 in control.company  # weighed beside three other sequences' rows
    assert any(rows >= 4 + 2 * 4 for rows in control.batches)  # several sequences drafted in one batch
    if sampling.greedy:
        assert all(d.stats.draft is not None and d.stats.draft.accepted > 20 for d in done.values())


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=5)])
def test_a_shared_batch_is_padded_where_the_curve_favours_it(four: Engine, sampling: SamplingParams) -> None:
    """On a curve where every size up to 64 costs the same, each shared batch
    is padded to a power of two (the padding in the last sequence's cells,
    forgotten after the step), and every text is the one it has alone."""
    level = tuple(1.0 + 0.01 * (r - 1) / 63 for r in range(1, 65))
    done, control = _together(four, PROMPTS, sampling, level, 4)
    for i, prompt in enumerate(PROMPTS):
        expected = collect(generate(four, four.tokenize(prompt), sampling, max_tokens=80, ignore_eos=True))[0]
        assert done[i].text == expected, i
    assert control.batches and set(control.batches) <= set(PAD_SIZES)
    assert 16 in control.batches or 32 in control.batches  # drafts of several sequences, padded


@pytest.mark.parametrize("curve", [None, STEEP])
def test_on_a_cpus_curve_sequences_decoding_together_do_not_draft(four: Engine, curve: Sequence[float] | None) -> None:
    done, control = _together(four, PROMPTS[:4], SamplingParams(temperature=0.0), curve, 4)
    assert control.batches == [] and control.company == []  # never weighed: the batch took plain steps
    assert all(d.stats.draft is None for d in done.values())


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=5)])
def test_alone_on_a_flat_curve_its_verify_batches_are_padded(four: Engine, sampling: SamplingParams) -> None:
    done, control = _together(four, PROMPTS[2:3], sampling, FLAT, 4)
    expected = collect(generate(four, four.tokenize(PROMPTS[2]), sampling, max_tokens=80, ignore_eos=True))[0]
    assert done[0].text == expected
    assert 8 in control.verified and all(rows in (2, 4, 8) for rows in control.verified)  # 1 + 4 drafted: 8
