"""MTP drafting (`localrun.speculative.mtp`) on `tests.mtpmodel`'s Qwen3.5
with one MTP block: a wired head whose drafts are often right, a random one
whose drafts are nearly always rejected (a rollback at every step). Either
way the text is plain decoding's."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from localrun.errors import LocalrunError, MTPUnavailableError, UsageError
from localrun.events import DraftStats
from localrun.runtime.decoder import Decoder
from localrun.runtime.engine import Engine
from localrun.runtime.generate import generate
from localrun.runtime.llama import DecodeStatus
from localrun.runtime.memory import ROLLBACK_DEPTH
from localrun.runtime.sampling import SamplingParams
from localrun.speculative import Speculation, open_speculation
from localrun.speculative import nextn as nextn_module
from localrun.speculative.base import Offer
from localrun.speculative.control import PLAIN, FixedController, Plan
from localrun.speculative.mtp import CATCH_UP_MAX, ROWS_KEPT, MTPDrafter, _Held, mtp_bytes
from tests.helpers import cli, collect, engine_config
from tests.hybridmodels import BY_NAME, write_hybrid_model
from tests.mtpmodel import write_mtp_model

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = (
    "Once upon a time, in a land far away, there lived",
    "the cat sat on the mat and the cat sat on the",
    "def f(x): return x + 1\ndef g(x): return f(x) + 1\ndef h(x): return",
)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("mtp")
    return {
        "wired": write_mtp_model(d / "qwen35-mtp.gguf"),
        "random": write_mtp_model(d / "qwen35-mtp-random.gguf", wired=False),
        "plain": write_hybrid_model(BY_NAME["qwen35"], d / "qwen35.gguf"),  # the same trunk, no MTP block
    }


def mtp_engine(path: Path, *, n_ctx: int = 1024, mtp: bool = True) -> Engine:
    # one thread: two spin-wait against each other on a shared two-core machine
    return Engine(engine_config(path, n_ctx=n_ctx, n_rs_seq=ROLLBACK_DEPTH, mtp=mtp, n_threads=1))


@pytest.fixture(scope="module")
def wired(models: dict[str, Path]) -> Iterator[Engine]:
    with mtp_engine(models["wired"]) as engine:
        yield engine


def drafted(
    engine: Engine, prompt: list[int], n: int, k: int, sampling: SamplingParams = GREEDY
) -> tuple[str, DraftStats]:
    with Speculation([MTPDrafter(engine)], FixedController(0, k)) as spec:
        text, stats = collect(spec.generate(engine, prompt, sampling, max_tokens=n))
    assert stats.draft is not None and stats.generated_tokens == n
    return text, stats.draft


# -- the text is plain decoding's --


@pytest.mark.parametrize("head", ["wired", "random"])
def test_greedy_mtp_writes_plain_decodings_text(head: str, models: dict[str, Path]) -> None:
    proposed = accepted = rounds = 0
    with mtp_engine(models[head]) as engine:
        assert engine.mtp_layers == 1
        for text in PROMPTS:
            prompt = engine.tokenize(text)
            for n in (9, 64):
                plain, _ = collect(generate(engine, prompt, GREEDY, max_tokens=n))
                for k in (1, 3, ROLLBACK_DEPTH):
                    got, stats = drafted(engine, prompt, n, k)
                    assert got == plain, (text, n, k)
                    assert stats.drafter == "mtp"
                    proposed, accepted = proposed + stats.proposed, accepted + stats.accepted
                    rounds += stats.rounds
    if head == "wired":
        assert proposed > accepted > proposed // 2  # mostly kept, some rolled back
    else:
        assert accepted < rounds // 10  # nearly every step rolls its draft back


def test_seeded_sampling_with_mtp_drafts_is_plain_sampling(wired: Engine) -> None:
    """The head's drafts are deterministic: each row is sampled as plain decoding
    samples it, so a seeded run writes plain decoding's text, drafts kept or not."""
    prompt = wired.tokenize(PROMPTS[1])
    kept = 0
    for seed in range(3):
        sampled = SamplingParams(temperature=0.8, seed=seed)
        plain, _ = collect(generate(wired, prompt, sampled, max_tokens=40))
        got, stats = drafted(wired, prompt, 40, 4, sampled)
        assert got == plain, seed
        kept += stats.accepted
    assert kept > 0


def test_a_drafter_on_a_warm_cache_starts_after_the_gap(wired: Engine) -> None:
    """A drafter made after the target's cache was filled never saw its rows:
    its head starts at the first position it has rows for, and a second
    generation that reuses the cache drafts from there on, still lossless."""
    first = wired.tokenize(PROMPTS[0])
    decoder = Decoder(wired)
    collect(generate(wired, first, GREEDY, max_tokens=30, decoder=decoder))
    second = [*decoder.tokens, *wired.tokenize(" and then", add_special=False)]
    plain, _ = collect(generate(wired, second, GREEDY, max_tokens=40))
    decoder.rollback(0)
    collect(generate(wired, first, GREEDY, max_tokens=30, decoder=decoder))  # the cache as it was
    with Speculation([MTPDrafter(wired)], FixedController(0, 3)) as spec:
        text, stats = collect(spec.generate(wired, second, GREEDY, max_tokens=40, decoder=decoder))
        drafter = spec.drafters[0]
        assert isinstance(drafter, MTPDrafter) and drafter.fed_start > 0  # it started after the gap
    assert text == plain
    assert stats.cached_tokens > 0 and stats.draft is not None and stats.draft.accepted > 0


def test_the_head_catches_up_on_a_prompt_longer_than_the_rows_kept(models: dict[str, Path]) -> None:
    with mtp_engine(models["wired"], n_ctx=2048) as engine:
        prompt = engine.tokenize(" ".join(f"the cat sat on mat {i}." for i in range(150)))
        assert len(prompt) > ROWS_KEPT + 100
        plain, _ = collect(generate(engine, prompt, GREEDY, max_tokens=24))
        text, stats = drafted(engine, prompt, 24, 3)
    assert text == plain and stats.accepted > 0


def test_the_head_takes_the_prompt_when_a_generation_begins(wired: Engine) -> None:
    drafter = MTPDrafter(wired)
    try:
        prompt = wired.tokenize(PROMPTS[1])
        decoder = Decoder(wired)
        decoder.rollback(0)
        decoder.evaluate(prompt)
        behind = min(len(prompt), CATCH_UP_MAX)
        assert drafter.offer([*prompt, 5], 0) == Offer(0, 0, drafter.max_len, catch_up=behind + 1)
        drafter.begin(prompt)
        assert drafter.fed.tokens == prompt and drafter.fed_start == 0
        assert drafter.offer([*prompt, 5], 0) == Offer(0, 0, drafter.max_len, catch_up=1)  # the new token only
    finally:
        drafter.close()


class Behind(FixedController):
    """Plain steps until the head's offer says it is `CATCH_UP_MAX` or more
    tokens behind, then always a draft."""

    def __init__(self) -> None:
        super().__init__(0, 3)
        self.behind = False

    def choose(self, offers: Sequence[Offer], room: int, forced: int = 0) -> Plan:
        self.behind = self.behind or any(o.catch_up > CATCH_UP_MAX for o in offers)
        return super().choose(offers, room, forced) if self.behind else PLAIN


def test_a_head_left_far_behind_starts_over_close_to_the_text(wired: Engine) -> None:
    """After plain steps (the controller's choice) the head is behind: its
    offer says at most `CATCH_UP_MAX` tokens of catch-up, and it starts over
    that far back, after the prompt it took when the generation began."""
    prompt = wired.tokenize(PROMPTS[0])
    plain, _ = collect(generate(wired, prompt, GREEDY, max_tokens=120))
    drafter = MTPDrafter(wired)
    control = Behind()
    with Speculation([drafter], control) as spec:
        text, stats = collect(spec.generate(wired, prompt, GREEDY, max_tokens=120))
    assert text == plain
    assert control.behind and drafter.fed_start > len(prompt)
    assert stats.draft is not None and stats.draft.accepted > 0


def test_a_head_decode_that_fails_costs_drafts_not_text(wired: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode of the head that finds no room (every third here) ends that
    draft, or empties the head's cache; the text is plain decoding's."""
    prompt = wired.tokenize(PROMPTS[0])
    plain, _ = collect(generate(wired, prompt, GREEDY, max_tokens=64))
    drafter = MTPDrafter(wired)
    calls = 0
    real = drafter.batch.decode

    def sometimes() -> DecodeStatus:
        nonlocal calls
        calls += 1
        return DecodeStatus.NO_SLOT if calls % 3 == 0 else real()

    monkeypatch.setattr(drafter.batch, "decode", sometimes)
    with Speculation([drafter], FixedController(0, 3)) as spec:
        text, stats = collect(spec.generate(wired, prompt, GREEDY, max_tokens=64))
    assert text == plain and calls > 10
    assert stats.draft is not None and stats.draft.accepted > 0


def test_chat_turns_reuse_the_cache_and_the_heads(wired: Engine) -> None:
    first = wired.tokenize(PROMPTS[2])
    with Speculation([MTPDrafter(wired)], FixedController(0, 4)) as spec:
        decoder = Decoder(wired)
        text, _ = collect(spec.generate(wired, first, GREEDY, max_tokens=50, decoder=decoder))
        assert text == collect(generate(wired, first, GREEDY, max_tokens=50))[0]
        second = [*decoder.tokens, *wired.tokenize(" and then", add_special=False)]
        again, stats = collect(spec.generate(wired, second, GREEDY, max_tokens=50, decoder=decoder))
    assert again == collect(generate(wired, second, GREEDY, max_tokens=50))[0]
    assert stats.cached_tokens >= len(first) + 45 and stats.draft is not None and stats.draft.accepted > 0


def test_mtp_under_a_schema_writes_plain_decodings_text(wired: Engine) -> None:
    """The head drafts under the grammar's mask; steps whose batch starts
    with forced tokens have no row before the draft, and are not drafted."""
    from localrun.structured.constraint import Constraint
    from localrun.structured.spec import concise_schema, schema_spec

    schema = schema_spec(concise_schema("name, size int, tags list[str]"), "test")
    prompt = wired.tokenize(PROMPTS[0])
    plain, plain_stats = collect(generate(wired, prompt, GREEDY, max_tokens=60, constraint=Constraint(wired, schema)))
    with Speculation([MTPDrafter(wired)], FixedController(0, 3)) as spec:
        events = spec.generate(wired, prompt, GREEDY, max_tokens=60, constraint=Constraint(wired, schema))
        text, stats = collect(events)
    assert text == plain and stats.valid is plain_stats.valid
    assert stats.draft is not None and stats.draft.proposed > 0


# -- what it needs --


def test_auto_adds_the_head_only_where_the_model_has_one(wired: Engine, models: dict[str, Path]) -> None:
    opened = open_speculation(wired, "auto")
    assert opened is not None
    with opened as spec:
        assert "mtp" in spec.label
    with mtp_engine(models["plain"]) as engine:
        assert engine.mtp_layers == 0
        opened = open_speculation(engine, "auto")
        assert opened is not None
        with opened as spec:
            assert "mtp" not in spec.label
        with pytest.raises(MTPUnavailableError, match="no MTP"):
            open_speculation(engine, "mtp")


def test_a_model_loaded_without_its_head_cannot_draft_with_it(models: dict[str, Path]) -> None:
    with mtp_engine(models["wired"], mtp=False) as engine:
        assert engine.mtp_layers == 0
        with pytest.raises(MTPUnavailableError, match="loaded without"):
            MTPDrafter(engine)
        opened = open_speculation(engine, "auto")
        assert opened is not None and "mtp" not in opened.label
        opened.close()


def test_a_build_without_the_staging_calls_leaves_mtp_unavailable(
    wired: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nextn_module, "_lookup", lambda: "_Z26llama_set_embeddings_nextnP13llama_contextbb")
    with pytest.raises(MTPUnavailableError, match="llama_set_embeddings_nextn") as raised:
        MTPDrafter(wired)
    assert isinstance(raised.value, UsageError)
    opened = open_speculation(wired, "auto")  # auto goes on without it
    assert opened is not None and "mtp" not in opened.label
    opened.close()
    assert wired.on_decode is None


def test_closing_the_drafter_unhooks_it(wired: Engine) -> None:
    drafter = MTPDrafter(wired)
    assert wired.on_decode is not None
    drafter.close()
    assert wired.on_decode is None


def test_the_step_cost_is_the_heads_share_of_the_weights(models: dict[str, Path]) -> None:
    from localrun.gguf.reader import read_gguf

    info = read_gguf(models["wired"])
    assert info.nextn_layers == 1 and read_gguf(models["plain"]).nextn_layers == 0
    head, rest = mtp_bytes(info)
    block = sum(t.n_bytes for t in info.tensors if t.name.startswith("blk.4."))
    output = next(t.n_bytes for t in info.tensors if t.name == "output.weight")
    assert head == block + output
    assert rest == sum(t.n_bytes for t in info.tensors) - block


def test_the_heads_cache_is_counted_as_llama_cpp_makes_it(wired: Engine, models: dict[str, Path]) -> None:
    """The MTP context's KV cache, as llama.cpp logs it, is the one the
    plan adds for a run that drafts with the head; a run that does not
    draft with it (another --spec, or --batch's slots) does not count it."""
    from localrun.assemble import assemble
    from localrun.gguf.info import describe
    from localrun.gguf.reader import read_gguf
    from localrun.runtime import llama_log
    from localrun.settings import Options, resolve

    shape = describe(read_gguf(models["wired"]))
    held = shape.with_mtp_cache(nextn_module.MTP_UBATCH)
    assert shape.mtp_kv_heads and describe(read_gguf(models["plain"])).mtp_kv_heads == ()
    head_per_token = held.kv_bytes_per_token("f16") - shape.kv_bytes_per_token("f16")
    assert head_per_token > 0 and held.compute_bytes() > shape.compute_bytes()
    llama_log.logged_buffers()  # forget what came before
    ctx = nextn_module.mtp_context(wired, n_batch=64)
    try:
        kv_bytes, cells, _ = llama_log.logged_buffers()
    finally:
        llama_cpp.llama_free(ctx)
    assert kv_bytes is not None and cells is not None and cells == wired.n_ctx
    assert kv_bytes == cells * head_per_token
    room = held.compute_bytes() + shape.recurrent_bytes(1, ROLLBACK_DEPTH) + 3 * 1024 * shape.kv_bytes_per_token("f16")
    budget = shape.weights_bytes + room
    planned = {
        spec: assemble(
            models["wired"], resolve(Options(ctx="auto", kv="f16", memory_budget=budget, draft=spec)), use_wisdom=False
        )
        for spec in ("mtp", "lookup")  # both speculate: the same snapshots to roll back
    }
    assert planned["mtp"].config.mtp and not planned["lookup"].config.mtp
    assert planned["mtp"].config.n_ctx < planned["lookup"].config.n_ctx  # the head's cache takes room from the context
    # a fixed context whose f16 cache fits beside the trunk alone, q8_0 beside the head's too: --kv auto picks q8_0
    n_ctx = 2048
    budget = held.memory_needed(n_ctx, "q8_0", snapshots=ROLLBACK_DEPTH)
    assert shape.memory_needed(n_ctx, "f16", snapshots=ROLLBACK_DEPTH) <= budget
    assert held.memory_needed(n_ctx, "f16", snapshots=ROLLBACK_DEPTH) > budget
    kv = {spec: assemble(models["wired"], resolve(Options(ctx=str(n_ctx), memory_budget=budget, draft=spec)),
                         use_wisdom=False).config.type_k
          for spec in ("mtp", "lookup")}  # fmt: skip
    assert kv == {"mtp": "q8_0", "lookup": "f16"}


def test_auto_on_a_build_without_the_heads_calls_holds_nothing_for_it(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from localrun.assemble import assemble
    from localrun.settings import Options, resolve

    monkeypatch.setattr(nextn_module, "_lookup", lambda: "llama_batch_ext_init")
    assert not assemble(models["wired"], resolve(Options(draft="auto")), use_wisdom=False).config.mtp
    assert assemble(models["wired"], resolve(Options(draft="mtp")), use_wisdom=False).config.mtp  # its error comes


def test_agreement_goes_on_from_where_it_stopped() -> None:
    held = _Held()
    held.tokens = [1, 2, 3, 4]
    assert held.agreement([1, 2, 9]) == 2
    assert held.agreement([1, 2, 3, 4, 5]) == 4  # the context went on: compared on from the agreement
    held.cut(3)
    assert held.agree == 3 and held.tokens == [1, 2, 3]
    assert held.agreement([1, 2, 7, 4]) == 2  # a context that differs at the last agreed token: from the start


# -- the command line --


def test_generate_with_spec_mtp_writes_spec_nones_text_and_reports_the_drafts(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller decides whether drafting pays (on this tiny model it
    seldom does): fixed here, so that the run drafts and its record counts it."""
    from localrun import speculative

    monkeypatch.setattr(speculative, "AdaptiveController", lambda profiles, **_: FixedController(0, 3))
    args = ("generate", "-m", str(models["wired"]), "-n", "48", "-t", "0", "--threads", "1", "--json")
    for prompt in PROMPTS[:2]:
        runs = {}
        for spec in ("none", "mtp", "auto"):  # auto: lookup (drafter 0 here) beside the head
            res = cli(*args, "--spec", spec, prompt)
            assert res.returncode == 0, res.stderr
            runs[spec] = [json.loads(line) for line in res.stdout.splitlines()]
        texts = {spec: "".join(e.get("text", "") for e in events) for spec, events in runs.items()}
        assert texts["mtp"] == texts["none"] == texts["auto"]
        draft = runs["mtp"][-1]["draft"]
        assert draft["drafter"] == "mtp" and 0 < draft["accepted"] <= draft["proposed"]


@pytest.mark.parametrize("model", ["plain", "tiny"])
def test_spec_mtp_without_mtp_layers_is_a_usage_error(model: str, models: dict[str, Path], tmp_path: Path) -> None:
    from tests.tinymodel import write_tiny_model

    path = models["plain"] if model == "plain" else write_tiny_model(tmp_path / "tiny.gguf")
    res = cli("generate", "-m", str(path), "--spec", "mtp", "-n", "4", "hi")
    assert res.returncode == 2
    assert "no MTP" in res.stderr and "--spec auto" in res.stderr


def test_spec_mtp_takes_no_draft_model(models: dict[str, Path]) -> None:
    res = cli("generate", "-m", str(models["wired"]), "--spec", "mtp", "--draft", "-n", "4", "hi")
    assert res.returncode == 2 and "--draft" in res.stderr


def test_the_heads_rows_follow_the_target(wired: Engine) -> None:
    """The rows kept are the target's own: those of a position decoded one
    token at a time equal a fresh batch's, to batch rounding."""
    drafter = MTPDrafter(wired)
    try:
        prompt = wired.tokenize(PROMPTS[0])
        decoder = Decoder(wired)
        decoder.rollback(0)
        decoder.evaluate(prompt)
        batch_rows = drafter.rows[[p % ROWS_KEPT for p in range(len(prompt))]].copy()
        decoder.rollback(0)
        for token in prompt:
            decoder.evaluate([token])
        step_rows = drafter.rows[[p % ROWS_KEPT for p in range(len(prompt))]]
        assert np.abs(batch_rows).max() > 0
        np.testing.assert_allclose(step_rows, batch_rows, rtol=1e-3, atol=1e-3)
    finally:
        drafter.close()


def test_the_heads_rows_follow_the_target_over_several_batches(models: dict[str, Path]) -> None:
    """A prompt longer than a batch and a micro-batch (the decoder's chunks,
    llama.cpp's split of each): every position's row is kept, as a token at
    a time gives it."""
    config = engine_config(models["wired"], n_ctx=1024, n_rs_seq=ROLLBACK_DEPTH, mtp=True, n_threads=1)
    with Engine(replace(config, n_batch=64, n_ubatch=32)) as engine:
        drafter = MTPDrafter(engine)
        try:
            prompt = engine.tokenize(" ".join(PROMPTS * 3))[:200]
            assert len(prompt) > 2 * engine.n_batch
            decoder = Decoder(engine)
            decoder.evaluate(prompt)
            batch_rows = drafter.rows[[p % ROWS_KEPT for p in range(len(prompt))]].copy()
            assert (drafter.row_pos[: len(prompt)] == np.arange(len(prompt))).all()
            decoder.rollback(0)
            drafter.rows[:] = 0  # what the step path keeps is its own
            for token in prompt:
                decoder.evaluate([token])
            step_rows = drafter.rows[[p % ROWS_KEPT for p in range(len(prompt))]]
            assert np.abs(batch_rows[-1]).max() > 0
            np.testing.assert_allclose(step_rows, batch_rows, rtol=1e-3, atol=1e-3)
        finally:
            drafter.close()


def test_show_counts_the_mtp_layers(models: dict[str, Path]) -> None:
    for name, expected in (("wired", 1), ("plain", 0)):
        res = cli("show", "--json", str(models[name]))
        assert res.returncode == 0, res.stderr
        shown = json.loads(res.stdout)
        assert shown["mtp_layers"] == expected
        head = shown["mtp_kv_bytes_per_token"]
        assert head is None if not expected else head["f16"] > 0 and head["q8_0"] < head["f16"]
    res = cli("show", str(models["wired"]))
    assert "MTP layers       1 (--spec mtp drafts with them; their own KV cache / token f16" in res.stdout


def test_auto_whose_draft_model_fails_leaves_nothing_hooked(wired: Engine, tmp_path: Path) -> None:
    """`open_draft` goes on with lookup alone where auto's draft model fails:
    the head auto would have added must not stay hooked to the engine."""
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf")
    with pytest.raises(LocalrunError):
        open_speculation(wired, "auto", draft_path=broken)
    assert wired.on_decode is None
