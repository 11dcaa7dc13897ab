from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import pytest

from localrun.errors import ContextOverflowError
from localrun.events import DoneEvent, Stats, TokenEvent
from localrun.runtime.decoder import Decoder
from localrun.runtime.engine import Engine
from localrun.runtime.generate import generate
from localrun.runtime.output import StopMatcher
from localrun.runtime.prompt import prompt_tokens
from localrun.runtime.sampling import Sampler, SamplingParams
from tests.helpers import collect, engine_config

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> Iterator[Engine]:
    with Engine(engine_config(tiny_model, n_ctx=256, n_threads=2)) as eng:
        yield eng


def run(engine: Engine, prompt: str, sampling: SamplingParams = GREEDY, **kw: object) -> tuple[str, Stats]:
    return collect(generate(engine, engine.tokenize(prompt), sampling, **kw))  # type: ignore[arg-type]


def test_streams_until_max_tokens(engine: Engine) -> None:
    events = list(generate(engine, engine.tokenize("the cat"), GREEDY, max_tokens=12))
    assert isinstance(events[-1], DoneEvent)
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert tokens, "expected streamed text"
    counts = [e.generated_tokens for e in tokens]
    assert counts == sorted(counts) and counts[-1] <= 12
    stats = events[-1].stats
    assert stats.stop_reason == "length"
    assert stats.generated_tokens == 12
    assert stats.prompt_tokens == len(engine.tokenize("the cat"))
    assert stats.ttft_s > 0 and stats.elapsed_s >= stats.ttft_s and stats.decode_tokens_per_s > 0


def test_greedy_is_deterministic(engine: Engine) -> None:
    assert run(engine, "hello there", max_tokens=20)[0] == run(engine, "hello there", max_tokens=20)[0]


def test_seeded_sampling_is_repeatable_and_seed_dependent(engine: Engine) -> None:
    hot = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    first, _ = run(engine, "in the", hot, max_tokens=24)
    assert run(engine, "in the", hot, max_tokens=24)[0] == first
    others = {run(engine, "in the", SamplingParams(1.5, 0, 1.0, 0.0, seed=s), max_tokens=24)[0] for s in (1, 2, 3)}
    assert first not in others  # no other seed gives seed 7's text


def test_stop_string_cuts_output(engine: Engine) -> None:
    full, _ = run(engine, "on the", max_tokens=40)
    stop = full[10:13]
    assert stop.strip(), "the fixture's greedy output should be printable text"
    cut, stats = run(engine, "on the", max_tokens=40, stop=[stop])
    assert stats.stop_reason == "stop"
    assert cut == full[: full.index(stop)]


def test_eos_stops(eos_model: Path) -> None:
    with Engine(engine_config(eos_model, n_ctx=128)) as eng:
        text, stats = run(eng, "anything", max_tokens=10)
    assert (text, stats.stop_reason, stats.generated_tokens) == ("", "eos", 0)


def test_context_full_ends_with_length(tiny_model: Path) -> None:
    with Engine(engine_config(tiny_model, n_ctx=64)) as eng:
        prompt = eng.tokenize("the the the")
        _, stats = run(eng, "the the the")
        n_ctx = eng.n_ctx
    assert stats.stop_reason == "length"
    assert stats.generated_tokens == n_ctx - len(prompt)


def test_prompt_longer_than_context(engine: Engine) -> None:
    with pytest.raises(ContextOverflowError, match="context holds 256"):
        list(generate(engine, engine.tokenize("word " * 400), GREEDY))


def test_greedy_matches_llama_cpp_python(tiny_model: Path, engine: Engine) -> None:
    prompt = engine.tokenize("there is an answer")
    ours, _ = run(engine, "there is an answer", max_tokens=30)
    stock = llama_cpp.Llama(model_path=str(tiny_model), n_ctx=256, n_threads=2, verbose=False)
    try:
        out: list[int] = []
        for tok in stock.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0):
            if stock.token_eos() == tok or len(out) == 30:
                break
            out.append(tok)
        assert ours == stock.detokenize(out).decode("utf-8", errors="replace")
    finally:
        stock.close()


def test_rollback_replays_the_same_tokens(engine: Engine) -> None:
    dec = Decoder(engine)
    dec.rollback(0)
    prompt = engine.tokenize("a sentence")
    assert dec.evaluate(prompt) == 0
    sampler = Sampler(GREEDY, engine.n_vocab)

    def continue_for(n: int) -> list[int]:
        out = []
        for _ in range(n):
            tok = dec.sample(sampler)
            out.append(tok)
            dec.evaluate([tok])
        return out

    first = continue_for(8)
    assert dec.n_past == len(prompt) + 8
    dec.rollback(len(prompt) + 2)
    assert dec.n_past == len(prompt) + 2
    dec.evaluate([first[2]])  # recompute the logits that predicted first[3]
    assert continue_for(5) == first[3:8]
    sampler.close()


def test_chat_template_is_applied(engine: Engine) -> None:
    templated = prompt_tokens(engine, "hi", system="be brief")
    raw = prompt_tokens(engine, "hi", raw=True)
    text = engine.detokenize(templated)
    # control tokens render to nothing, so what is left is the template's text
    assert "system\nbe brief" in text and "user\nhi" in text and text.endswith("assistant\n")
    assert engine.detokenize(raw) == "hi"


@pytest.mark.parametrize(
    ("chunks", "stops", "expected", "hit"),
    [
        (["hello wor", "ld and more"], ["world"], "hello ", True),
        (["abc", "d"], ["cde"], "abcd", False),
        (["a<", "|e", "nd|>b"], ["<|end|>"], "a", True),
        (["plain text"], [], "plain text", False),
    ],
)
def test_stop_matcher(chunks: list[str], stops: list[str], expected: str, hit: bool) -> None:
    matcher = StopMatcher(stops)
    out, reached = "", False
    for chunk in chunks:
        text, reached = matcher.feed(chunk)
        out += text
        if reached:
            break
    if not reached:
        out += matcher.flush()
    assert (out, reached) == (expected, hit)


def test_rows_logits_match_one_token_at_a_time(engine: Engine) -> None:
    """evaluate_rows gives each row the logits that stepping token by token gives."""
    import numpy as np

    tokens = engine.tokenize("the other one")
    dec = Decoder(engine)
    dec.rollback(0)
    stepwise = []
    for tok in tokens:
        dec.evaluate([tok])
        stepwise.append(np.array(dec.logits(-1)))
    dec.rollback(0)
    assert dec.evaluate_rows(tokens) == 0 and dec.n_past == len(tokens)
    for i, expected in enumerate(stepwise):
        assert np.allclose(dec.logits(i), expected, atol=1e-3)


def test_argmax_path_agrees_with_the_native_greedy_chain(engine: Engine) -> None:
    n = engine.n_vocab
    fast, chain = Sampler(SamplingParams(temperature=0), n), Sampler(SamplingParams(temperature=0), n)
    chain.argmax = False  # the same greedy chain, sampled by llama.cpp
    assert fast.argmax and not Sampler(SamplingParams(temperature=0, repeat_penalty=1.1), n).argmax
    assert not Sampler(SamplingParams(temperature=0.5), n).argmax
    decoder = Decoder(engine)
    tokens = engine.tokenize("there is an answer to every")
    decoder.rollback(0)
    assert decoder.evaluate_rows(tokens) == 0
    picks = [decoder.sample(fast, row) for row in range(len(tokens))]
    assert picks == [decoder.sample(chain, row) for row in range(len(tokens))]
    assert len(set(picks)) > 1  # rows with different maxima, read from the right places
    for _ in range(24):  # and step by step, on single-token batches
        token = decoder.sample(fast)
        assert token == decoder.sample(chain)
        assert decoder.evaluate((token,)) == 0
    fast.close()
    chain.close()


def test_repeat_penalty_changes_greedy_output(engine: Engine) -> None:
    plain, _ = run(engine, "on the", max_tokens=40)
    penalized, stats = run(engine, "on the", SamplingParams(temperature=0, repeat_penalty=1.5), max_tokens=40)
    assert stats.generated_tokens == 40 and penalized != plain


# -- sampling in llama.cpp's graph (--sample-on device), on the CPU backend --


@pytest.fixture(scope="module")
def device_engine(tiny_model: Path) -> Iterator[Engine]:
    with Engine(engine_config(tiny_model, n_ctx=256, n_threads=2, sample_on="device")) as eng:
        yield eng


def test_device_sampling_gives_the_host_text(engine: Engine, device_engine: Engine) -> None:
    seeded = SamplingParams(temperature=0.8, seed=11)
    for sampling in (GREEDY, seeded):
        host, _ = run(engine, "the cat", sampling, max_tokens=24)
        device, stats = run(device_engine, "the cat", sampling, max_tokens=24)
        assert device == host and stats.generated_tokens == 24


def test_a_device_sampler_leaves_the_context_as_it_found_it(device_engine: Engine) -> None:
    tokens = device_engine.tokenize("the dog")
    sampler = Sampler(GREEDY, device_engine.n_vocab, device_engine)
    assert sampler.on_device
    decoder = Decoder(device_engine)
    decoder.prefill(tokens)
    drawn = decoder.sample(sampler)
    sampler.close()  # detached: the logits come back to the host
    decoder.rollback(0)
    decoder.prefill(tokens)
    assert int(decoder.logits(-1).argmax()) == drawn


def test_a_grammar_keeps_sampling_on_the_host(device_engine: Engine) -> None:
    from localrun.runtime.generate import Generation
    from localrun.structured.constraint import Constraint

    tokens = device_engine.tokenize("a")
    with Generation(device_engine, tokens, GREEDY, sample_on_device=True) as free:
        assert free.sampler.on_device
    constraint = Constraint.__new__(Constraint)  # never used: the generation only asks whether there is one
    with Generation(device_engine, tokens, GREEDY, sample_on_device=True, constraint=constraint) as bound:
        assert not bound.sampler.on_device
