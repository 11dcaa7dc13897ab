"""`generate --batch`: continuous batching in the core, the input format, the CLI."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localrun.errors import ContextOverflowError
from localrun.events import BatchProgress, SequenceDone, SequenceText, Stats
from localrun.gguf.info import describe
from localrun.gguf.reader import read_gguf
from localrun.runtime.batch.input import finished_ids, read_lines
from localrun.runtime.batch.scheduler import BatchRequest, ContinuousBatch, run_batch, shared_prefix
from localrun.runtime.engine import Engine
from localrun.runtime.generate import generate
from localrun.runtime.llama import DecodeStatus
from localrun.runtime.placement import LLAMA_PARALLEL, default_parallel, parallel_that_fits, slot_context
from localrun.runtime.prompt import build_prompt, prompt_tokens
from localrun.runtime.promptcache import AUTO_MIN_TOKENS, PromptCache
from localrun.runtime.sampling import SamplingParams
from localrun.ui.batch import JsonlWriter
from tests.helpers import Result, cli, collect, engine_config, on_terminal

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = ["hello there", "the cat sat on the mat", "x", "in the beginning was", "on the", "a b c d e f", "what now"]


@pytest.fixture(scope="module")
def single(tiny_model: Path) -> Iterator[Engine]:
    """One sequence: the reference every batched result is compared with."""
    with Engine(engine_config(tiny_model, n_ctx=256, n_threads=2)) as eng:
        yield eng


def alone(engine: Engine, tokens: list[int], sampling: SamplingParams = GREEDY, **kw: object) -> tuple[str, Stats]:
    return collect(generate(engine, tokens, sampling, **kw))  # type: ignore[arg-type]


def batched(
    engine: Engine, requests: list[BatchRequest], **kw: bool
) -> tuple[dict[int, SequenceDone], list[BatchProgress]]:
    done: dict[int, SequenceDone] = {}
    progress: list[BatchProgress] = []
    for ev in run_batch(engine, requests, **kw):
        if isinstance(ev, SequenceDone):
            assert ev.index not in done
            done[ev.index] = ev
        else:
            progress.append(ev)
    assert progress[-1].final and not any(p.final for p in progress[:-1])
    return done, progress


def batch_engine(model: Path, parallel: int, seq_ctx: int = 256, *, kv_unified: bool = False) -> Engine:
    config = engine_config(model, n_ctx=parallel * seq_ctx, n_seq_max=parallel, kv_unified=kv_unified)
    return Engine(config)


# ------------------------------------------------------------------ core --


def test_shared_prefix_leaves_each_prompt_a_token() -> None:
    assert shared_prefix([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]]) == 2
    assert shared_prefix([[1, 2, 3], [1, 2, 3]]) == 2  # the last token is evaluated by each
    assert shared_prefix([[4, 2], [1, 2]]) == 0
    assert shared_prefix([[7]]) == 0


def test_sizing_of_a_run(tiny_model: Path) -> None:
    assert (slot_context(10, 512), slot_context(300, 512), slot_context(5000, 4096)) == (256, 512, 4096)
    assert default_parallel(40, None) == LLAMA_PARALLEL
    assert (default_parallel(40, None, 12), default_parallel(40, 5, 12), default_parallel(3, None, 12)) == (12, 5, 3)
    assert (default_parallel(3, 100), default_parallel(40, 2), default_parallel(0, 5)) == (3, 2, 1)
    shape = describe(read_gguf(tiny_model))
    per_sequence = 512 * shape.kv_bytes_per_token("f16")
    budget = shape.weights_bytes + shape.compute_bytes() + 3 * per_sequence + per_sequence // 2
    assert parallel_that_fits(shape, 512, "f16", "f16", budget) == 3


@pytest.mark.parametrize("unified", [False, True])
def test_greedy_batch_matches_each_prompt_alone(tiny_model: Path, single: Engine, unified: bool) -> None:
    """More prompts than slots, different lengths and limits: every text is what
    the prompt gives when run alone (sequences do not leak into each other)."""
    with batch_engine(tiny_model, 3, kv_unified=unified) as engine:
        tokens = [prompt_tokens(engine, p, system="be brief") for p in PROMPTS]
        requests = [BatchRequest(i, t, GREEDY, max_tokens=6 + 3 * i) for i, t in enumerate(tokens)]
        done, progress = batched(engine, requests)
    assert sorted(done) == list(range(len(PROMPTS)))
    for i, t in enumerate(tokens):
        text, stats = alone(single, t, max_tokens=6 + 3 * i)
        assert done[i].text == text, f"prompt {i}"
        assert done[i].stats.generated_tokens == stats.generated_tokens == 6 + 3 * i
        assert done[i].stats.prompt_tokens == len(t) and done[i].stats.stop_reason == "length"
    final = progress[-1]
    assert (final.done, final.total, final.interrupted) == (len(PROMPTS), len(PROMPTS), False)
    assert final.generated_tokens == sum(6 + 3 * i for i in range(len(PROMPTS)))


def test_shared_prefix_is_evaluated_once(tiny_model: Path) -> None:
    system = "You answer in one short sentence, always in English, never in code."
    with batch_engine(tiny_model, 3) as engine:
        tokens = [prompt_tokens(engine, p, system=system) for p in PROMPTS]
        requests = [BatchRequest(i, t, GREEDY, max_tokens=8) for i, t in enumerate(tokens)]
        shared, shared_progress = batched(engine, requests)
        separate, separate_progress = batched(engine, requests, share_prefix=False)
        system_tokens = len(engine.tokenize(system))
    prefix = shared_prefix(tokens)
    assert prefix > system_tokens  # the system turn and the user turn's opening
    assert shared_progress[-1].shared_prefix == prefix
    assert shared_progress[-1].evaluated_tokens == prefix + sum(len(t) - prefix for t in tokens)
    assert separate_progress[-1].evaluated_tokens == sum(len(t) for t in tokens)
    assert {i: d.text for i, d in shared.items()} == {i: d.text for i, d in separate.items()}


def test_finished_slot_is_refilled_at_once(tiny_model: Path) -> None:
    """Two slots; A (2 tokens) and B (10) start; C (8) takes A's slot the decode
    after A ends, its prompt evaluated beside B's next token: 10 decodes in all
    (waiting for B to end before starting C would take 18)."""
    with batch_engine(tiny_model, 2) as engine:
        requests = [
            BatchRequest(i, engine.tokenize(p), GREEDY, max_tokens=n)
            for i, (p, n) in enumerate([("first", 2), ("second one", 10), ("third", 8)])
        ]
        done, progress = batched(engine, requests, share_prefix=False)
    assert [done[i].stats.generated_tokens for i in range(3)] == [2, 10, 8]
    assert len(progress) - 1 == 10  # one progress event per shared decode, then the final one
    assert [p.done for p in progress[:-1]] == [0] + [1] * 8 + [3]  # A ends at decode 2; B and C at decode 10


def test_each_sequence_samples_with_its_own_settings(tiny_model: Path, single: Engine) -> None:
    hot = [SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=s) for s in (1, 2, 3)]
    with batch_engine(tiny_model, 4) as engine:
        tokens = engine.tokenize("in the")
        requests = [BatchRequest(i, tokens, s, max_tokens=16) for i, s in enumerate(hot)]
        requests.append(BatchRequest(3, tokens, GREEDY, max_tokens=16))
        done, _ = batched(engine, requests)
    texts = [alone(single, tokens, s, max_tokens=16)[0] for s in [*hot, GREEDY]]
    assert [done[i].text for i in range(4)] == texts
    assert len(set(texts)) == 4


def test_slots_sample_in_the_graph_unless_their_rows_are_read(tiny_model: Path, single: Engine) -> None:
    """With the engine sampling on the device, each plain slot's chain runs in
    llama.cpp's graph and gives the text the host gives; a slot asking for
    log-probabilities samples on the host in the same batches. Each chain is
    detached when its slot ends: a later batch reads every sequence's logits."""
    from dataclasses import replace

    seeded = SamplingParams(temperature=0.8, seed=7)
    config = engine_config(tiny_model, n_ctx=3 * 256, n_seq_max=3, sample_on="device")
    with Engine(config) as engine:
        tokens = [engine.tokenize(p) for p in PROMPTS[:5]]
        requests = [BatchRequest(i, t, GREEDY if i % 2 else seeded, max_tokens=12) for i, t in enumerate(tokens)]
        requests[2] = replace(requests[2], logprobs=2)
        run = ContinuousBatch(engine, 3, 256)
        on_device: dict[int, bool] = {}
        done: dict[int, SequenceDone] = {}
        for request in requests:
            run.submit(request)
        while run.busy:
            status, events = run.step()
            assert status == DecodeStatus.OK
            on_device.update({s.request.index: s.sampler.on_device for s in run.slots if s is not None})
            done.update({ev.index: ev for ev in events if isinstance(ev, SequenceDone)})
        run.close()
        later, _ = batched(engine, [replace(r, logprobs=1) for r in requests], share_prefix=False)
    assert on_device == {0: True, 1: True, 2: False, 3: True, 4: True}
    for i, t in enumerate(tokens):
        text, stats = alone(single, t, requests[i].sampling, max_tokens=12)
        assert done[i].text == later[i].text == text, f"prompt {i}"
        assert done[i].stats.generated_tokens == stats.generated_tokens
        assert len(later[i].logprobs) == stats.generated_tokens  # its rows came back to the host
    assert len(done[2].logprobs) == done[2].stats.generated_tokens


def test_stop_strings_and_end_of_generation(tiny_model: Path, eos_model: Path, single: Engine) -> None:
    full, _ = alone(single, single.tokenize("on the"), max_tokens=40)
    stop = full[10:13]
    with batch_engine(tiny_model, 2) as engine:
        requests = [
            BatchRequest(0, engine.tokenize("on the"), GREEDY, max_tokens=40, stop=(stop,)),
            BatchRequest(1, engine.tokenize("on the"), GREEDY, max_tokens=40),
        ]
        done, _ = batched(engine, requests)
    assert (done[0].text, done[0].stats.stop_reason) == (full[: full.index(stop)], "stop")
    assert (done[1].text, done[1].stats.stop_reason) == (full, "length")
    with batch_engine(eos_model, 2) as engine:
        done, _ = batched(engine, [BatchRequest(i, engine.tokenize(p), GREEDY) for i, p in enumerate("ab")])
    assert [(d.text, d.stats.stop_reason, d.stats.generated_tokens) for d in done.values()] == [("", "eos", 0)] * 2


def test_abort_reports_only_finished_sequences(tiny_model: Path) -> None:
    with batch_engine(tiny_model, 2) as engine:
        requests = [BatchRequest(i, engine.tokenize(p), GREEDY, max_tokens=n) for i, (p, n) in enumerate(
            [("short", 2), ("long", 200), ("never started", 5)]
        )]  # fmt: skip
        events = run_batch(engine, requests, share_prefix=False)
        seen: list[int] = []
        final = None
        for ev in events:
            if isinstance(ev, SequenceDone):
                seen.append(ev.index)
                engine.abort_requested = True  # like a Ctrl-C right after the first result
            elif ev.final:
                final = ev
        engine.abort_requested = False
    assert seen == [0]
    assert final is not None and final.interrupted and final.done == 1 and final.total == 3


def test_prompt_longer_than_a_sequence_context(tiny_model: Path) -> None:
    with batch_engine(tiny_model, 2) as engine, pytest.raises(ContextOverflowError, match="holds 256"):
        run_batch(engine, [BatchRequest(0, engine.tokenize("word " * 300))])


def drain(
    run: ContinuousBatch, steps: int | None = None, streamed: dict[int, str] | None = None
) -> tuple[dict[int, str], dict[int, SequenceDone]]:
    """Step ``run`` until it is idle (or ``steps`` times): each request's streamed text, and its end."""
    streamed = {} if streamed is None else streamed
    done: dict[int, SequenceDone] = {}
    while run.busy and (steps is None or steps > 0):
        steps = None if steps is None else steps - 1
        status, events = run.step()
        assert status == DecodeStatus.OK
        for ev in events:
            if isinstance(ev, SequenceText):
                streamed[ev.index] = streamed.get(ev.index, "") + ev.text
            elif isinstance(ev, SequenceDone):
                done[ev.index] = ev
    return streamed, done


def test_requests_join_a_running_batch_and_stream(tiny_model: Path, single: Engine) -> None:
    """A request submitted while others decode joins at the next step; the
    streamed pieces add up to the final text, which is what it gives alone."""
    with batch_engine(tiny_model, 2) as engine:
        run = ContinuousBatch(engine, 2, 256, stream=True)
        tokens = [prompt_tokens(engine, p) for p in PROMPTS[:3]]
        run.submit(BatchRequest(0, tokens[0], GREEDY, max_tokens=12))
        streamed, _ = drain(run, steps=3)
        run.submit(BatchRequest(1, tokens[1], GREEDY, max_tokens=9))
        run.submit(BatchRequest(2, tokens[2], GREEDY, max_tokens=5, stop=("e",)))
        _, done = drain(run, streamed=streamed)
        run.close()
    for i, limit in enumerate((12, 9, 5)):
        text, _ = alone(single, tokens[i], max_tokens=limit, stop=("e",) if i == 2 else ())
        assert done[i].text == streamed.get(i, "") == text, f"request {i}"
    assert (run.done, run.total) == (3, 3)


def test_cancel_frees_the_slot_for_the_next_request(tiny_model: Path) -> None:
    with batch_engine(tiny_model, 1) as engine:
        run = ContinuousBatch(engine, 1, 256)
        run.submit(BatchRequest(0, engine.tokenize("long one"), GREEDY, max_tokens=200))
        run.submit(BatchRequest(1, engine.tokenize("queued"), GREEDY, max_tokens=3))
        run.submit(BatchRequest(2, engine.tokenize("next"), GREEDY, max_tokens=3))
        run.step()
        assert run.active == 1 and len(run.queue) == 2
        assert run.cancel(1) and run.cancel(0)  # one waiting, one decoding
        assert run.active == 0 and not run.cancel(0)
        _, done = drain(run)
        run.close()
    assert list(done) == [2] and done[2].stats.generated_tokens == 3
    assert (run.cancelled, run.done) == (2, 1)


def test_reuse_prefix_picks_the_slot_holding_the_longest_prefix(tiny_model: Path, single: Engine) -> None:
    """A chat client re-sends its history: the new request goes to the free
    slot holding its start and only its new tokens are evaluated; the text is
    what it gives alone."""
    with batch_engine(tiny_model, 2) as engine:
        run = ContinuousBatch(engine, 2, 256, reuse_prefix=True)
        first = prompt_tokens(engine, "the cat sat on the mat and then")
        other = prompt_tokens(engine, "x y z")
        run.submit(BatchRequest(0, first, GREEDY, max_tokens=12))
        run.submit(BatchRequest(1, other, GREEDY, max_tokens=3))  # ends first: its slot is the least recently used
        _, done = drain(run)
        follow = [*first, *single.tokenize(done[0].text, add_special=False), *single.tokenize(" and more")]
        run.submit(BatchRequest(2, follow, GREEDY, max_tokens=8))
        _, again = drain(run)
        run.close()
    held = len(first) + len(single.tokenize(done[0].text, add_special=False)) - 1  # the last sample is not decoded
    assert again[2].stats.cached_tokens >= len(first)
    assert again[2].stats.cached_tokens <= held
    assert again[2].text == alone(single, follow, max_tokens=8)[0]


def test_requests_that_come_together_evaluate_their_shared_start_once(tiny_model: Path, single: Engine) -> None:
    """Three requests with one system prompt, queued at once: the first
    evaluates it, the others wait for its cells and copy them; each text is
    what it is alone."""
    system = "you are a terse assistant who answers in one short line."
    with batch_engine(tiny_model, 3) as engine:
        prompts = [build_prompt(engine, q, system=system) for q in ("the cat", "a dog ran", "and then")]
        run = ContinuousBatch(engine, 3, 256, reuse_prefix=True)
        for i, prompt in enumerate(prompts):
            run.submit(BatchRequest(i, prompt.tokens, GREEDY, max_tokens=8))
        _, done = drain(run)
        run.close()
    shared = shared_prefix([p.tokens for p in prompts])
    assert shared >= 16
    cached = sorted(done[i].stats.cached_tokens for i in range(3))
    assert cached[0] == 0 and cached[1] >= shared and cached[2] >= shared
    assert run.evaluated == sum(len(p.tokens) for p in prompts) - sum(cached)
    for i, prompt in enumerate(prompts):
        assert done[i].text == alone(single, prompt.tokens, max_tokens=8)[0]


def long_system(engine: Engine) -> str:
    """A system prompt just long enough for the prompt cache to keep."""
    system = "answer briefly."
    while len(engine.tokenize(system, add_special=False)) < AUTO_MIN_TOKENS + 16:
        system += " the cat sat on the mat."
    return system


def test_a_long_shared_prefix_is_stored_and_then_loaded_from_the_prompt_cache(long_model: Path, tmp_path: Path) -> None:
    """A system prompt of AUTO_MIN_TOKENS or more no slot holds is stored once
    evaluated; a fresh scheduler (a restarted server) loads it into the slot
    and evaluates only the rest, and the text is what it is without a cache."""
    cache = PromptCache(tmp_path / "prompts")
    with batch_engine(long_model, 2, seq_ctx=2048) as engine:
        system = long_system(engine)
        first = build_prompt(engine, "what is a cat", system=system)
        second = build_prompt(engine, "and a dog", system=system)
        assert first.shared >= AUTO_MIN_TOKENS and first.shared == second.shared
        run = ContinuousBatch(engine, 2, 2048, reuse_prefix=True, prompt_cache=cache)
        run.submit(BatchRequest(0, first.tokens, GREEDY, max_tokens=6, shared=first.shared))
        _, done = drain(run)
        run.close()
        assert done[0].stats.cached_tokens == 0
        assert len(cache.entries()) == 1
    with batch_engine(long_model, 2, seq_ctx=2048) as engine:
        run = ContinuousBatch(engine, 2, 2048, reuse_prefix=True, prompt_cache=cache)
        run.submit(BatchRequest(1, second.tokens, GREEDY, max_tokens=6, shared=second.shared))
        _, done = drain(run)
        run.close()
    assert done[1].stats.cached_tokens == second.shared
    with Engine(engine_config(long_model, n_ctx=2048)) as reference:
        assert done[1].text == alone(reference, second.tokens, max_tokens=6)[0]
    (entry,) = cache.entries()
    whole = entry.read_bytes()
    entry.write_bytes(whole[:-100])  # damaged: not trusted, said so, and stored again
    with batch_engine(long_model, 2, seq_ctx=2048) as engine:
        run = ContinuousBatch(engine, 2, 2048, reuse_prefix=True, prompt_cache=cache)
        run.submit(BatchRequest(2, second.tokens, GREEDY, max_tokens=6, shared=second.shared))
        _, done = drain(run)
        run.close()
    assert done[2].stats.cached_tokens == 0
    assert any("truncated" in warning for warning in run.warnings), run.warnings
    assert cache.entries() == [entry] and entry.stat().st_size == len(whole)


def test_a_prompt_cache_that_cannot_be_written_costs_a_warning(long_model: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "prompts"
    blocker.write_text("a file where the cache's folder should be")
    with batch_engine(long_model, 1, seq_ctx=2048) as engine:
        system = long_system(engine)
        prompt = build_prompt(engine, "what is a cat", system=system)
        run = ContinuousBatch(engine, 1, 2048, reuse_prefix=True, prompt_cache=PromptCache(blocker))
        run.submit(BatchRequest(0, prompt.tokens, GREEDY, max_tokens=4, shared=prompt.shared))
        _, done = drain(run)
        run.close()
    assert done[0].stats.generated_tokens == 4
    assert any("could not write the prompt cache" in warning for warning in run.warnings), run.warnings


# ----------------------------------------------------------------- input --


def test_plain_lines_are_prompts_numbered_by_line() -> None:
    lines = read_lines(["first prompt\n", "\n", "{not json: the format is set by line 1}\n", "last"])
    assert [(x.id, x.prompt, x.error) for x in lines] == [
        (1, "first prompt", None),
        (3, "{not json: the format is set by line 1}", None),
        (4, "last", None),
    ]


def test_jsonl_lines_with_settings_and_errors() -> None:
    lines = read_lines(
        [
            '{"id": "a", "prompt": "hi", "max_tokens": 5, "temperature": 0, "stop": "x", "seed": 3}',
            '{"messages": [{"role": "user", "content": "yo"}], "system": "terse", "stop": ["a", "b"]}',
            "not json",
            '{"id": "c", "prompt": "  "}',
            '{"id": "d", "prompt": "p", "temprature": 1}',
            '{"id": "e", "prompt": "p", "top_k": 1.5}',
            '{"id": "f"}',
            '{"id": "a", "prompt": "again"}',
            '{"id": "g", "prompt": "p", "max_tokens": 0}',
            "[1, 2]",
        ]
    )
    a, b, *bad = lines
    assert (a.id, a.prompt, a.settings, a.stop) == ("a", "hi", {"max_tokens": 5, "temperature": 0, "seed": 3}, ("x",))
    assert (b.id, b.messages, b.settings, b.stop) == (
        2,
        [{"role": "user", "content": "yo"}],
        {"system": "terse"},
        ("a", "b"),
    )
    errors = {x.id: x.error for x in bad}
    assert all(errors.values())
    assert "invalid JSON" in str(errors[3]) and "empty" in str(errors["c"]) and "'temprature'" in str(errors["d"])
    assert "integer" in str(errors["e"]) and "either 'prompt' or 'messages'" in str(errors["f"])
    assert "duplicate" in str(errors["a"]) and "at least 1" in str(errors["g"]) and "object" in str(errors[10])


def test_finished_ids_skip_a_line_cut_short(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    assert finished_ids(out) == set()
    out.write_text('{"id": 1, "text": "a"}\n{"id": "b", "error": "bad"}\n{"id": 3, "te')
    assert finished_ids(out) == {1, "b"}


def test_writer_keeps_input_order_and_flushes_what_finished() -> None:
    lines: list[str] = []
    writer = JsonlWriter(lines.append, ordered=True)
    writer.add(1, {"id": "b"})
    writer.add(3, {"id": "d"})
    assert lines == []
    writer.add(0, {"id": "a"})
    assert [json.loads(x)["id"] for x in lines] == ["a", "b"]
    writer.flush_finished()  # the run stopped: position 2 never finished
    assert [json.loads(x)["id"] for x in lines] == ["a", "b", "d"]
    unordered: list[str] = []
    writer = JsonlWriter(unordered.append, ordered=False)
    writer.add(2, {"id": "c"})
    assert unordered == ['{"id": "c"}\n']


# ------------------------------------------------------------------- CLI --


def records(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


def run_cli(model: Path, source: str, *args: str, input: str | None = None) -> Result:
    return cli("generate", "-m", str(model), "-t", "0", "--batch", source, *args, input=input)


def test_cli_ordered_and_unordered_output(tiny_model: Path, tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(
        '{"id": "slow", "prompt": "one", "max_tokens": 40}\n{"id": "fast", "prompt": "two", "max_tokens": 2}\n'
    )
    ordered = run_cli(tiny_model, str(src))
    assert ordered.returncode == 0, ordered.stderr
    assert [r["id"] for r in records(ordered.stdout)] == ["slow", "fast"]
    unordered = run_cli(tiny_model, str(src), "--unordered")
    assert [r["id"] for r in records(unordered.stdout)] == ["fast", "slow"]
    slow = records(ordered.stdout)[0]
    assert set(slow) == {"id", "text", "stop_reason", "prompt_tokens", "generated_tokens", "ttft_s", "elapsed_s"}
    assert (slow["generated_tokens"], slow["stop_reason"]) == (40, "length")
    assert ordered.stderr == "" and "\x1b" not in ordered.stdout


@pytest.mark.parametrize("sample_on", ["auto", "device"])
def test_cli_greedy_matches_single_generate(tiny_model: Path, sample_on: str) -> None:
    """The batch's texts are each prompt's alone, sampled on the host (auto)
    or in llama.cpp's graph (its log, with --verbose, says a chain was
    attached to each sequence)."""
    prompts = ["hello there", "the cat sat on the mat", "x"]
    args = ("-n", "12", "--parallel", "2", "--sample-on", sample_on, "--verbose")
    res = run_cli(tiny_model, "-", *args, input="\n".join(prompts) + "\n")
    assert res.returncode == 0, res.stderr
    attached = {int(seq) for seq in re.findall(r"set_sampler: seq_id = (\d+), sampler = 0x0*[1-9a-f]", res.stderr)}
    assert attached == ({0, 1} if sample_on == "device" else set())
    for prompt, record in zip(prompts, records(res.stdout), strict=True):
        one = cli("generate", "-m", str(tiny_model), "-t", "0", "-n", "12", "--json", prompt)
        text = "".join(e["text"] for e in records(one.stdout) if e["type"] == "token")
        assert record["text"] == text


def test_cli_line_settings_override_the_command_line(tiny_model: Path, tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(
        '{"id": 1, "prompt": "on the"}\n'
        '{"id": 2, "prompt": "on the", "max_tokens": 3}\n'
        '{"id": 3, "prompt": "on the", "temperature": 0}\n'
        '{"id": 4, "prompt": "on the", "system": "be brief"}\n'
    )
    res = cli(
        "generate", "-m", str(tiny_model), "-t", "1.5", "--seed", "5", "--top-k", "0", "-n", "20", "--batch", str(src)
    )
    assert res.returncode == 0, res.stderr
    out = {r["id"]: r for r in records(res.stdout)}
    greedy = records(run_cli(tiny_model, str(src), "-n", "20").stdout)[0]
    assert out[2]["generated_tokens"] == 3 and out[1]["generated_tokens"] == 20
    assert out[3]["text"] == greedy["text"] != out[1]["text"]
    assert out[4]["prompt_tokens"] > out[1]["prompt_tokens"]  # its own system prompt


def test_cli_bad_lines_are_reported_and_the_run_goes_on(tiny_model: Path, tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(
        '{"id": "ok", "prompt": "hi"}\n'
        "{broken\n"
        '{"id": "empty", "prompt": ""}\n'
        f'{{"id": "long", "prompt": "{"word " * 300}"}}\n'
        '{"id": "ok2", "prompt": "there"}\n'
    )
    res = run_cli(tiny_model, str(src), "-n", "4", "--ctx", "256")
    assert res.returncode == 8
    out = records(res.stdout)
    assert [r["id"] for r in out] == ["ok", 2, "empty", "long", "ok2"]  # input order
    errors = {r["id"]: r["error"] for r in out if "error" in r}
    assert set(errors) == {2, "empty", "long"}
    assert "invalid JSON" in errors[2] and "empty" in errors["empty"] and "context holds 256" in errors["long"]
    assert all(r["generated_tokens"] == 4 for r in out if "error" not in r)
    assert "3 of 5 lines failed" in res.stderr and "Traceback" not in res.stderr


def test_cli_a_line_that_is_not_utf8_fails_alone(tiny_model: Path, tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_bytes(b"alpha\nbe\xfftween\ngamma\n")
    res = run_cli(tiny_model, str(src), "-n", "3")
    assert res.returncode == 8, res.stderr
    out = {r["id"]: r for r in records(res.stdout)}
    assert "not UTF-8" in out[2]["error"]
    assert out[1]["generated_tokens"] == out[3]["generated_tokens"] == 3
    assert "Traceback" not in res.stderr


def test_cli_a_line_that_is_not_utf8_on_stdin_fails_alone(tiny_model: Path) -> None:
    cmd = [sys.executable, "-m", "localrun", "generate", "-m", str(tiny_model), "-t", "0", "-n", "3", "--batch", "-"]
    strict = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}  # stdin as under a UTF-8 locale
    data = b"alpha\nbe\xfftween\ngamma\n"
    res = subprocess.run(cmd, input=data, capture_output=True, timeout=120, check=False, env=strict)
    assert res.returncode == 8, res.stderr
    out = {r["id"]: r for r in records(res.stdout.decode())}
    assert "not UTF-8" in out[2]["error"] and out[3]["generated_tokens"] == 3


def test_cli_resume_skips_what_is_done(tiny_model: Path, tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("alpha\nbeta\ngamma\ndelta\n")
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": 2, "text": "done before"}\n{"id": 3, "te')  # the last run was killed mid-line
    res = run_cli(tiny_model, str(src), "-n", "3", "--resume", str(out))
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""
    lines = out.read_text().splitlines()
    assert lines[:2] == ['{"id": 2, "text": "done before"}', '{"id": 3, "te']
    assert [json.loads(x)["id"] for x in lines[2:]] == [1, 3, 4]
    again = run_cli(tiny_model, str(src), "-n", "3", "--resume", str(out))
    assert again.returncode == 0 and out.read_text().splitlines() == lines  # nothing left to do
    assert f"nothing to run: every line of {src} has a record in {out} already" in again.stderr


def test_cli_an_empty_batch_says_so(tiny_model: Path) -> None:
    res = run_cli(tiny_model, "-", "-n", "3", input="\n\n")
    assert res.returncode == 0 and res.stdout == ""
    assert "nothing to run: stdin holds no prompts" in res.stderr


def test_cli_openai_batch_records_name_the_model_not_its_path(tiny_model: Path) -> None:
    line = {"custom_id": "a", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "hi"}]}}
    res = run_cli(tiny_model, "-", "-n", "2", input=json.dumps(line) + "\n")
    assert res.returncode == 0, res.stderr
    (record,) = records(res.stdout)
    assert record["response"]["body"]["model"] == "tiny" and str(tiny_model) not in res.stdout


def test_cli_instruction_from_the_argument_is_a_shared_prefix(tiny_model: Path) -> None:
    lines = "first line\nsecond line\n"
    plain = run_cli(tiny_model, "-", "-n", "2", "--stats", input=lines)
    instructed = run_cli(tiny_model, "-", "-n", "2", "--stats", "Translate to French:", input=lines)
    assert plain.returncode == instructed.returncode == 0, plain.stderr + instructed.stderr

    def prefix(stderr: str) -> int:
        return int(stderr.split("shared prefix ")[1].split(maxsplit=1)[0])

    assert prefix(instructed.stderr) >= prefix(plain.stderr) + len("Translate to French:") // 2
    assert all(
        r["prompt_tokens"] > p["prompt_tokens"]
        for r, p in zip(records(instructed.stdout), records(plain.stdout), strict=True)
    )


def test_cli_ctrl_c_writes_finished_results_and_exits_130(long_model: Path, tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(
        '{"id": "quick", "prompt": "a", "max_tokens": 2}\n'
        '{"id": "endless", "prompt": "b"}\n'  # runs until its context is full: thousands of tokens
        '{"id": "endless too", "prompt": "c"}\n'
    )
    cmd = [sys.executable, "-m", "localrun", "generate", "-m", str(long_model), "-t", "0", "--batch", str(src)]
    proc = subprocess.Popen(
        [*cmd, "--unordered"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()  # the quick one is done; the others are running
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert [r["id"] for r in records((first + rest).decode())] == ["quick"]
    assert b"interrupted" in err and b"Traceback" not in err


@pytest.mark.pty
def test_cli_progress_on_a_terminal(tiny_model: Path, tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("one\ntwo\nthree\n")
    status, screen = on_terminal("generate", "-m", str(tiny_model), "-n", "8", "--batch", str(src))
    assert status == 0
    assert "tok/s" in screen and "3/3" in screen  # the bar
    assert "batch done: 3/3 prompts" in screen  # the summary
    assert screen.count('"generated_tokens": 8') == 3


def test_cli_loads_the_weights_once(tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from localrun.runtime import engine as engine_module

    loads: list[Path] = []
    real = engine_module._load_model

    def counting(info: Any, placed: Any, *, mtp: bool = False) -> Any:
        loads.append(info.path)
        return real(info, placed, mtp=mtp)

    monkeypatch.setattr(engine_module, "_load_model", counting)
    res = run_cli(tiny_model, "-", "-n", "3", input="one\ntwo\nthree\n")
    assert res.returncode == 0 and len(res.stdout.splitlines()) == 3
    assert loads == [tiny_model]


def test_plan_sizes_sequences_and_caps_them(tiny_model: Path) -> None:
    from dataclasses import replace

    from localrun.assemble import Prompts, assemble
    from localrun.runtime.batch.plan import BatchSettings, batch_plan, jobs_for, tokenize_jobs
    from localrun.runtime.engine import Vocabulary
    from localrun.settings import Options, resolve

    jobs = jobs_for(read_lines(["hello there\n", "x\n"]))
    with Vocabulary(tiny_model) as vocabulary:
        needs = tokenize_jobs(jobs, BatchSettings(max_tokens=300), vocabulary)
    assert len(needs) == 2 and all(need > 300 for need in needs)

    def plan(options: Options, **changes: Any) -> tuple[int, int]:
        settings = replace(resolve(replace(options, memory_budget=10**9)), **changes)
        run = assemble(tiny_model, settings, workload=Prompts(needs), devices=(), use_wisdom=False)
        batch = batch_plan(jobs, run.config)
        assert not batch.failed and batch.parallel == run.parallel
        return batch.seq_ctx, batch.parallel

    sized = plan(Options())
    model_default = resolve(Options())
    capped = plan(Options(), n_ctx=256, sources={**model_default.sources, "ctx": "model"})  # the model's default
    fixed = plan(Options(ctx="300"))
    assert (sized[0], capped[0], fixed[0]) == (512, 256, 512)  # steps of 256, at most trained 512
    assert sized[1] == capped[1] == 2


def test_a_prompt_cache_that_fails_leaves_the_request_running(
    long_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model file gone from under a server (the cache keys on it): the
    request runs without the cache, and the server says why."""

    def gone(*args: object) -> None:
        raise FileNotFoundError(2, "No such file or directory", str(long_model))

    monkeypatch.setattr(PromptCache, "checkpoint", gone)
    with batch_engine(long_model, 1, seq_ctx=2048) as engine:
        system = long_system(engine)
        prompt = build_prompt(engine, "what is a cat", system=system)
        run = ContinuousBatch(engine, 1, 2048, reuse_prefix=True, prompt_cache=PromptCache(tmp_path / "prompts"))
        run.submit(BatchRequest(0, prompt.tokens, GREEDY, max_tokens=4, shared=prompt.shared))
        _, done = drain(run)
        run.close()
    assert done[0].stats.generated_tokens == 4
    assert any("prompt cache not used" in warning for warning in run.warnings), run.warnings
