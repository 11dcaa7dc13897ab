from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from localrun.events import Stats
from localrun.runtime.engine import Engine
from localrun.runtime.generate import generate
from localrun.runtime.prompt import build_prompt
from localrun.runtime.promptcache import AUTO_MIN_TOKENS, Checkpoint, PromptCache, checkpoint_for
from localrun.runtime.sampling import SamplingParams
from tests.helpers import cli, collect, engine_config
from tests.tinymodel import write_tiny_model

GREEDY = SamplingParams(temperature=0.0)
MATERIAL = "\n".join(f"line {i}: the cat sat on the mat near the door" for i in range(12))


@pytest.fixture
def engine(tiny_model: Path) -> Iterator[Engine]:
    with Engine(engine_config(tiny_model, n_ctx=512, n_threads=2)) as eng:
        yield eng


def run(engine: Engine, tokens: list[int], checkpoint: Checkpoint | None) -> tuple[str, Stats]:
    return collect(generate(engine, tokens, GREEDY, max_tokens=12, checkpoint=checkpoint))


def test_shared_prefix_covers_the_material(engine: Engine) -> None:
    a = build_prompt(engine, "Summarize it.", MATERIAL, system="Be brief.")
    b = build_prompt(engine, "What is on line 3?", MATERIAL, system="Be brief.")
    assert a.shared > len(engine.tokenize(MATERIAL, add_special=False))
    assert a.shared == b.shared and a.tokens[: a.shared] == b.tokens[: b.shared]
    assert a.tokens[a.shared :] != b.tokens[b.shared :]
    # no material: the system prompt is what is shared
    c = build_prompt(engine, "hi", None, system="You are terse. " * 10)
    assert 0 < c.shared < len(c.tokens)


def test_hit_restores_the_prefix_and_changes_nothing(engine: Engine, tmp_path: Path) -> None:
    cache = PromptCache(tmp_path / "pc")
    first = build_prompt(engine, "Summarize it.", MATERIAL)
    cp1 = cache.checkpoint(engine, first.tokens[: first.shared])
    text1, stats1 = run(engine, first.tokens, cp1)
    assert cp1.outcome == "miss" and stats1.prompt_cache == "miss" and stats1.cached_tokens == 0
    assert len(cache.entries()) == 1

    second = build_prompt(engine, "What is on line 3?", MATERIAL)
    engine_fresh_text, _ = run(engine, second.tokens, None)  # the reference: no cache at all
    cp2 = cache.checkpoint(engine, second.tokens[: second.shared])
    text2, stats2 = run(engine, second.tokens, cp2)
    assert cp2.outcome == "hit" and stats2.prompt_cache == "hit" and not cp2.warnings
    assert stats2.cached_tokens == second.shared
    assert text2 == engine_fresh_text

    cp3 = cache.checkpoint(engine, first.tokens[: first.shared])
    assert run(engine, first.tokens, cp3)[0] == text1


def test_another_prefix_is_a_miss(engine: Engine, tmp_path: Path) -> None:
    cache = PromptCache(tmp_path / "pc")
    a = build_prompt(engine, "q", MATERIAL)
    run(engine, a.tokens, cache.checkpoint(engine, a.tokens[: a.shared]))
    b = build_prompt(engine, "q", MATERIAL.replace("cat", "dog"))
    cp = cache.checkpoint(engine, b.tokens[: b.shared])
    run(engine, b.tokens, cp)
    assert cp.outcome == "miss" and not cp.warnings and len(cache.entries()) == 2


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: data[:-100], "is truncated"),
        (lambda data: data[:-50] + bytes([data[-50] ^ 0xFF]) + data[-49:], "fails its checksum"),
        (lambda data: b"garbage" + data, "is not a prompt cache file"),
        (lambda data: data.replace(b'"n_tokens"', b'"n_tokenz"', 1), "another prompt"),
        (lambda data: b"", "is not a prompt cache file"),
    ],
)
def test_damaged_file_is_ignored_and_rebuilt(engine: Engine, tmp_path: Path, damage: object, message: str) -> None:
    cache = PromptCache(tmp_path / "pc")
    p = build_prompt(engine, "Summarize it.", MATERIAL)
    reference, _ = run(engine, p.tokens, cache.checkpoint(engine, p.tokens[: p.shared]))
    (entry,) = cache.entries()
    entry.write_bytes(damage(entry.read_bytes()))  # type: ignore[operator]
    cp = cache.checkpoint(engine, p.tokens[: p.shared])
    text, stats = run(engine, p.tokens, cp)
    assert cp.outcome == "miss" and stats.cached_tokens == 0
    assert len(cp.warnings) == 1 and message in cp.warnings[0] and "rebuilding" in cp.warnings[0]
    assert text == reference
    again = cache.checkpoint(engine, p.tokens[: p.shared])
    run(engine, p.tokens, again)
    assert again.outcome == "hit"  # rebuilt


def test_file_from_another_model_is_not_trusted(tiny_model: Path, models_dir: Path, tmp_path: Path) -> None:
    other = write_tiny_model(models_dir / "tiny-other.gguf", seed=7)
    cache = PromptCache(tmp_path / "pc")
    with Engine(engine_config(tiny_model, n_ctx=512)) as a:
        pa = build_prompt(a, "q", MATERIAL)
        run(a, pa.tokens, cache.checkpoint(a, pa.tokens[: pa.shared]))
        (entry,) = cache.entries()
    with Engine(engine_config(other, n_ctx=512)) as b:
        pb = build_prompt(b, "q", MATERIAL)
        assert pb.tokens == pa.tokens  # same tokenizer, same prompt
        reference, _ = run(b, pb.tokens, None)
        cp = cache.checkpoint(b, pb.tokens[: pb.shared])
        shutil.copy(entry, cp.path)  # as if the key had collided
        text, _ = run(b, pb.tokens, cp)
    assert cp.outcome == "miss" and "another model" in cp.warnings[0]
    assert text == reference


def test_kv_types_are_part_of_the_key(wide_model: Path, tmp_path: Path) -> None:
    cache = PromptCache(tmp_path / "pc")
    for kv in ("f16", "q8_0"):
        with Engine(engine_config(wide_model, n_ctx=512, type_k=kv, type_v=kv)) as eng:
            p = build_prompt(eng, "q", MATERIAL)
            cp = cache.checkpoint(eng, p.tokens[: p.shared])
            run(eng, p.tokens, cp)
            assert cp.outcome == "miss"
    assert len(cache.entries()) == 2


def test_cap_evicts_least_recently_used(engine: Engine, tmp_path: Path) -> None:
    cache = PromptCache(tmp_path / "pc")
    prompts = [build_prompt(engine, "q", MATERIAL.replace("cat", animal)) for animal in ("dog", "cow", "owl")]
    run(engine, prompts[0].tokens, cache.checkpoint(engine, prompts[0].tokens[: prompts[0].shared]))
    one = cache.size()
    cache.cap_bytes = int(one * 2.5)
    run(engine, prompts[1].tokens, cache.checkpoint(engine, prompts[1].tokens[: prompts[1].shared]))
    first = cache.checkpoint(engine, prompts[0].tokens[: prompts[0].shared])
    run(engine, prompts[0].tokens, first)  # a hit: now the most recently used
    assert first.outcome == "hit"
    run(engine, prompts[2].tokens, cache.checkpoint(engine, prompts[2].tokens[: prompts[2].shared]))
    names = {p.name for p in cache.entries()}
    assert len(names) == 2 and first.path.name in names
    assert cache.size() <= cache.cap_bytes


def test_auto_caches_only_long_shared_prefixes(long_model: Path, tmp_path: Path) -> None:
    with Engine(engine_config(long_model, n_ctx=4096)) as eng:
        short = build_prompt(eng, "q", MATERIAL)
        assert checkpoint_for(short, eng, None) is None
        assert checkpoint_for(short, eng, False) is None
        assert checkpoint_for(short, eng, True) is not None
        long = build_prompt(eng, "q", MATERIAL * 8)
        assert long.shared >= AUTO_MIN_TOKENS
        assert checkpoint_for(long, eng, None) is not None
        assert checkpoint_for(long, eng, False) is None


def test_cli_prompt_cache_and_cache_clear(tiny_model: Path) -> None:
    args = ("generate", "-m", str(tiny_model), "-n", "5", "-t", "0", "--json", "--prompt-cache", "Summarize.")
    first = json.loads(cli(*args, input=MATERIAL).stdout.splitlines()[-1])
    second = json.loads(cli(*args, input=MATERIAL).stdout.splitlines()[-1])
    assert first["prompt_cache"] == "miss" and second["prompt_cache"] == "hit"
    assert second["cached_tokens"] > 0 and first["cached_tokens"] == 0
    stats = cli("generate", "-m", str(tiny_model), "-n", "5", "--prompt-cache", "--stats", "Summarize.", input=MATERIAL)
    assert "prompt cache hit" in stats.stderr
    info = cli("cache", "info")
    assert info.returncode == 0 and "1 entry," in info.stdout
    cleared = cli("cache", "clear", "--yes")
    assert cleared.returncode == 0 and "removed 1 entry," in cleared.stdout
    assert "0 entries" in cli("cache", "info").stdout
    third = json.loads(cli(*args, input=MATERIAL).stdout.splitlines()[-1])
    assert third["prompt_cache"] == "miss"
