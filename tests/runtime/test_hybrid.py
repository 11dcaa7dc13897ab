"""Recurrent and hybrid models (`tests.hybridmodels`: Qwen3.5's gated
delta-net, LFM2's short convolutions, Mamba 2, ...) are correct by default.

Their memory keeps one state per sequence, not one per token, so llama.cpp
refuses most cuts (`localrun.runtime.memory`). Every path that takes a
sequence back (a rejected draft, a chat's next turn, a batch slot reused, a
served conversation continued, tune's timed batches) must give the text a
fresh evaluation gives, and never decode after a refused cut."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from localrun.errors import UsageError
from localrun.events import SequenceDone
from localrun.gguf.reader import read_gguf
from localrun.runtime.batch.scheduler import BatchRequest, run_batch
from localrun.runtime.chat import ChatSession, Turn
from localrun.runtime.decoder import Decoder
from localrun.runtime.engine import Engine, Weights
from localrun.runtime.generate import generate
from localrun.runtime.llama import DecodeStatus
from localrun.runtime.memory import ROLLBACK_DEPTH
from localrun.runtime.sampling import SamplingParams
from localrun.speculative import Speculation, lookup_drafters, open_speculation
from localrun.speculative.control import FixedController
from localrun.speculative.draftmodel import DraftModelDrafter
from tests.helpers import cli, collect, engine_config
from tests.hybridmodels import BY_NAME, HYBRIDS, write_hybrid_model
from tests.serve.conftest import Server, start

GREEDY = SamplingParams(temperature=0.0)
ROLLBACK = [h.name for h in HYBRIDS if h.rollback]
NO_ROLLBACK = [h.name for h in HYBRIDS if not h.rollback]
PROMPTS = (
    "one two three four one two three four one two",
    "the cat sat on the mat and the cat sat on the",
    "def f(x): return x + 1\ndef g(x): return f(x) + 1\ndef h(x): return",
    "a b c d e f g a b c d e f g a b c",
    "hello the world",
)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("hybrids")
    return {h.name: write_hybrid_model(h, directory / f"{h.name}.gguf") for h in HYBRIDS}


@pytest.fixture(scope="module")
def other_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """qwen35 with other weights: a draft model of the same vocabulary whose drafts are mostly wrong."""
    return write_hybrid_model(BY_NAME["qwen35"], tmp_path_factory.mktemp("draft") / "qwen35-other.gguf", seed=1)


def hybrid_engine(path: Path, *, n_ctx: int = 1024, **fields: Any) -> Engine:
    return Engine(engine_config(path, n_ctx=n_ctx, n_rs_seq=ROLLBACK_DEPTH, **fields))


def next_logits(engine: Engine, decoder: Decoder) -> Any:
    return np.array(decoder.logits(-1), copy=True)


# -- the memory and its cuts --


@pytest.mark.parametrize("name", [h.name for h in HYBRIDS])
def test_the_memory_and_its_snapshots_are_known(name: str, models: dict[str, Path]) -> None:
    with hybrid_engine(models[name]) as engine:
        assert engine.cuts.kind in ("hybrid", "recurrent") and engine.cuts.recurrent
        assert engine.cuts.depth == (ROLLBACK_DEPTH if BY_NAME[name].rollback else 0)  # llama.cpp's clamp, read back


def test_a_cut_within_the_last_batch_gives_what_a_fresh_evaluation_gives(models: dict[str, Path]) -> None:
    with hybrid_engine(models["qwen35"]) as engine:
        prompt = engine.tokenize(PROMPTS[0])
        decoder = Decoder(engine)
        assert decoder.evaluate(prompt) == DecodeStatus.OK
        assert decoder.evaluate_rows([11, 12, 13, 14]) == DecodeStatus.OK
        assert engine.cuts.cut(0, len(prompt) + 2)  # two of the batch's four taken back: a snapshot
        assert not engine.cuts.cut(0, len(prompt) + 1)  # a snapshot is taken once, before the next decode
        assert engine.cuts.held(0) == len(prompt) + 2  # ... and the refusal changed nothing
        del decoder.tokens[len(prompt) + 2 :]
        decoder.evaluate([15])
        cut = next_logits(engine, decoder)
        fresh = Decoder(engine)
        fresh.rollback(0)
        fresh.evaluate([*prompt, 11, 12, 15])
        np.testing.assert_allclose(cut, next_logits(engine, fresh), rtol=1e-4, atol=1e-4)


def test_a_cut_past_what_the_last_decode_wrote_is_refused_then_evaluated_again(models: dict[str, Path]) -> None:
    """After two single-token steps, going back two tokens would read a snapshot
    no decode wrote (llama.cpp would take it): the cut is refused, and the
    decoder's rollback evaluates the sequence again instead."""
    with hybrid_engine(models["qwen35"]) as engine:
        prompt = engine.tokenize(PROMPTS[1])
        decoder = Decoder(engine)
        decoder.evaluate(prompt)
        decoder.evaluate([21])
        decoder.evaluate([22])
        assert not engine.cuts.cut(0, len(prompt))
        assert engine.cuts.held(0) == len(prompt) + 2
        assert decoder.rollback(len(prompt)) == DecodeStatus.OK
        assert decoder.tokens == prompt and engine.cuts.held(0) == len(prompt)
        decoder.evaluate([23])
        after = next_logits(engine, decoder)
        fresh = Decoder(engine)
        fresh.rollback(0)
        fresh.evaluate([*prompt, 23])
        np.testing.assert_allclose(after, next_logits(engine, fresh), rtol=1e-4, atol=1e-4)


# -- speculation --


@pytest.mark.parametrize("name", ROLLBACK)
def test_speculation_is_lossless_greedy(name: str, models: dict[str, Path]) -> None:
    """Prompt lookup (alone and as auto takes it) writes plain greedy decoding's
    text on every prompt, its drafts kept and rejected through the snapshots."""
    proposed = accepted = 0
    with hybrid_engine(models[name]) as engine:
        for text in PROMPTS:
            prompt = engine.tokenize(text)
            plain, _ = collect(generate(engine, prompt, GREEDY, max_tokens=48))
            for controller in (FixedController(0, 4), None):
                with Speculation(lookup_drafters(engine), controller) as spec:
                    drafted, stats = collect(spec.generate(engine, prompt, GREEDY, max_tokens=48))
                assert drafted == plain, (text, controller)
                assert stats.draft is not None
                proposed, accepted = proposed + stats.draft.proposed, accepted + stats.draft.accepted
    assert proposed > accepted > 0  # drafts kept and drafts rejected: both paths ran


def test_a_draft_model_on_a_hybrid_is_lossless(models: dict[str, Path], other_weights: Path) -> None:
    """A hybrid draft model, its own copy (every draft kept) and one with other
    weights (its drafts rejected, its own sequence taken back by evaluating again)."""
    with hybrid_engine(models["qwen35"]) as engine:
        prompt = engine.tokenize(PROMPTS[2])
        plain, _ = collect(generate(engine, prompt, GREEDY, max_tokens=32))
        for draft in (models["qwen35"], other_weights):
            drafter = DraftModelDrafter(draft, engine, eager=True, p_min=0.0)
            with Speculation([drafter], FixedController(0, 3)) as spec:
                text, stats = collect(spec.generate(engine, prompt, GREEDY, max_tokens=32))
            assert text == plain
            assert stats.draft is not None and stats.draft.proposed > 0


@pytest.mark.parametrize("name", ROLLBACK)
def test_sampled_speculation_with_a_seed_runs_to_its_end(name: str, models: dict[str, Path]) -> None:
    with hybrid_engine(models[name]) as engine:
        prompt = engine.tokenize(PROMPTS[3])
        for seed in range(4):
            sampled = SamplingParams(temperature=0.8, seed=seed)
            with Speculation(lookup_drafters(engine), FixedController(0, 4)) as spec:
                _, stats = collect(spec.generate(engine, prompt, sampled, max_tokens=40))
            assert stats.generated_tokens == 40 and stats.stop_reason == "length"


@pytest.mark.parametrize("name", NO_ROLLBACK)
def test_no_snapshots_no_speculation(name: str, models: dict[str, Path]) -> None:
    """Where llama.cpp keeps no snapshots, auto decodes plainly and an explicit
    choice is a clear error, not a failed decode."""
    with hybrid_engine(models[name]) as engine:
        assert open_speculation(engine, "auto") is None
        with pytest.raises(UsageError, match="recurrent state"):
            open_speculation(engine, "lookup")
    res = cli("generate", "-m", str(models[name]), "--spec", "lookup", "-n", "4", "hi")
    assert res.returncode == 2 and "--spec none" in res.stderr
    res = cli("generate", "-m", str(models[name]), "-n", "4", "-t", "0", "hi")
    assert res.returncode == 0 and "speculative decoding is off" in res.stderr


@pytest.mark.parametrize("name", ROLLBACK)
def test_generate_with_every_spec_writes_the_same_text(name: str, models: dict[str, Path]) -> None:
    texts = set()
    for spec in ("none", "lookup", "auto"):
        res = cli(
            "generate", "-m", str(models[name]), "--spec", spec, "-n", "40", "-t", "0", "--think", "show", PROMPTS[0]
        )
        assert res.returncode == 0, res.stderr
        texts.add(res.stdout)
    assert len(texts) == 1


# -- prefix reuse: chat turns, batch slots --


def test_chat_turns_equal_a_fresh_session_and_evaluate_only_the_new_tokens(models: dict[str, Path]) -> None:
    """Qwen3.5's template drops an earlier turn's thinking, so each next prompt
    parts from the cache where the last reply began: the turn restores the
    checkpoint taken there and evaluates only what follows; each reply is what
    a fresh session (a context of its own on the same weights) given the same
    history writes."""
    path = models["qwen35"]
    template = read_gguf(path).chat_template
    assert template is not None
    config = engine_config(path, n_ctx=2048, n_rs_seq=ROLLBACK_DEPTH)
    with Weights(path, config.placement) as weights, Engine(config, weights=weights) as engine:
        session = ChatSession(engine, template, GREEDY, max_tokens=12)
        mark = 0
        for k, user in enumerate(["hello the world", "and then what", "one more time"]):
            plan = session.plan(user)
            assert plan.marks and plan.marks[0] < len(plan.tokens), "the history's end is marked for a checkpoint"
            _, stats = collect(session.reply(plan))
            if k:
                assert stats.cached_tokens == mark > 0  # all before the last reply's start, reused
            mark = plan.marks[0]
            turn = session.turns[-1]
            assert turn.reasoning  # the template opened the thinking: the next turn drops it
            with Engine(config, weights=weights) as other:
                fresh = ChatSession(other, template, GREEDY, max_tokens=12)
                fresh.turns = [Turn(t.user, t.reply, reasoning=t.reasoning) for t in session.turns[:-1]]
                _, fresh_stats = collect(fresh.reply(fresh.plan(user)))
            assert (fresh.turns[-1].reply, fresh.turns[-1].reasoning) == (turn.reply, turn.reasoning)
            assert fresh_stats.cached_tokens == 0


@pytest.mark.parametrize("parallel", [1, 2])
def test_a_batch_sharing_a_prefix_equals_each_prompt_alone(parallel: int, models: dict[str, Path]) -> None:
    path = models["qwen35"]
    prefix = "You are terse. Answer in one line. " * 3
    prompts = [prefix + p for p in PROMPTS]
    with hybrid_engine(path) as single:
        tokens = [single.tokenize(p) for p in prompts]
        expected = [collect(generate(single, t, GREEDY, max_tokens=16))[0] for t in tokens]
    with hybrid_engine(path, n_ctx=512 * parallel, n_seq_max=parallel) as engine:
        requests = [BatchRequest(i, t, GREEDY, max_tokens=16) for i, t in enumerate(tokens)]
        done = {ev.index: ev.text for ev in run_batch(engine, requests) if isinstance(ev, SequenceDone)}
    assert [done[i] for i in range(len(prompts))] == expected


# -- serve --


@pytest.fixture(scope="module")
def hybrid_server(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from start(tmp_path_factory.mktemp("home"), "-m", str(models["qwen35"]), "--ctx", "2048", "--parallel", "1")


def test_serve_answers_every_endpoint_and_reuses_a_conversation(hybrid_server: Server) -> None:
    client = hybrid_server.client()
    model = "qwen35"
    messages: list[Any] = [{"role": "user", "content": "hello the world"}]
    first = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
    reply = first.choices[0].message
    messages += [{"role": "assistant", "content": reply.content or ""}, {"role": "user", "content": "and then"}]
    second = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    assert (second.usage.prompt_tokens_details.cached_tokens or 0) > 0
    text = client.completions.create(model=model, prompt=PROMPTS[0] * 4, max_tokens=24, temperature=0)
    assert text.choices[0].text and text.usage is not None and text.usage.completion_tokens == 24
    response = client.responses.create(model=model, input="hello the world", max_output_tokens=8)
    assert response.status in ("completed", "incomplete")


# -- tune --


def test_tune_measures_a_hybrid(models: dict[str, Path]) -> None:
    from localrun.tune.measure import Context

    path = models["qwen35"]
    config = engine_config(path, n_ctx=1024, n_seq_max=4)
    with Weights(path, config.placement) as weights:
        context = Context(weights, config)
        try:
            assert context.step_s(3) > 0 and context.rows_s(4) > 0 and context.parallel_s(4) > 0
            context.share_prompt(4)
            assert context.parallel_s(4) > 0 and context.prompt_s(64) > 0
            assert context.engine.cuts.held(0) == context.depth  # each timed batch was taken back
        finally:
            context.close()


def test_the_prompt_cache_keeps_the_recurrent_state(models: dict[str, Path]) -> None:
    """Piped material of over 1,024 tokens is cached on disk with the recurrent
    state beside the KV: the second run evaluates only the instruction, and
    writes what an uncached run writes."""
    material = " ".join(f"line{i % 97} says the tide rose" for i in range(300))
    args = ("generate", "-m", str(models["qwen35"]), "-n", "12", "-t", "0", "--think", "show", "--json", "Sum up")
    runs = [cli(*args, input=material) for _ in range(2)]
    uncached = cli(*args, "--no-prompt-cache", input=material)
    for res in (*runs, uncached):
        assert res.returncode == 0, res.stderr
    done = [json.loads(res.stdout.splitlines()[-1]) for res in (*runs, uncached)]
    assert done[0]["cached_tokens"] == 0 and done[1]["cached_tokens"] > 1000 and done[2]["cached_tokens"] == 0
    texts = {"".join(json.loads(line).get("text", "") for line in res.stdout.splitlines()) for res in (*runs, uncached)}
    assert len(texts) == 1


def test_a_hybrid_draft_model_takes_its_drafts_back_from_a_checkpoint(
    models: dict[str, Path], other_weights: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its drafts are single-token decodes, which no snapshot can take back:
    each drafting step starts from a checkpoint, so the draft evaluates each
    token of the context about once, not the whole context per step."""
    evaluated = {"draft": 0}
    evaluate = Decoder.evaluate

    def counted(self: Decoder, tokens: Any) -> DecodeStatus:
        if self.engine.config.model_path == other_weights:
            evaluated["draft"] += len(tokens)
        return evaluate(self, tokens)

    monkeypatch.setattr(Decoder, "evaluate", counted)
    with hybrid_engine(models["qwen35"], n_ctx=2048) as engine:
        prompt = engine.tokenize(PROMPTS[0] * 8)
        drafter = DraftModelDrafter(other_weights, engine, eager=True, p_min=0.0)
        with Speculation([drafter], FixedController(0, 3)) as spec:
            _, stats = collect(spec.generate(engine, prompt, GREEDY, max_tokens=120))
    assert stats.draft is not None and stats.draft.proposed > 100
    assert evaluated["draft"] < 3 * (len(prompt) + 120)
