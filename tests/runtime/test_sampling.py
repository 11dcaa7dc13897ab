"""The sampler chain's top-k shortcut: the candidates it gives llama.cpp's
chain hold the k largest logits, and the chain draws from them what it draws
from the whole vocabulary."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import localrun.runtime.sampling as sampling_module
from localrun.runtime.engine import Engine
from localrun.runtime.generate import generate
from localrun.runtime.sampling import Sampler, SamplingParams, top_candidates
from tests.helpers import collect, engine_config
from tests.tinymodel import write_tiny_model


def largest(row: np.ndarray, k: int) -> set[int]:
    """The indices of ``row``'s k largest values, and of every value tied with the k-th."""
    kth = np.sort(row)[-k]
    return set(np.flatnonzero(row >= kth).tolist())


ROWS: dict[str, Callable[[np.random.Generator, int], np.ndarray]] = {
    "normal": lambda rng, n: rng.standard_normal(n),
    "peaked": lambda rng, n: np.where(rng.random(n) < 0.001, 12.0, 0.0) + rng.standard_normal(n),
    "ties": lambda rng, n: rng.integers(0, 6, n).astype(np.float64),  # thousands tied at the k-th value
    "rising": lambda rng, n: np.arange(n, dtype=np.float64),  # the largest all in the last block
}


@pytest.mark.parametrize("n", [151_936, 49_152, 32_000 + 77, 262_145])
@pytest.mark.parametrize("kind", sorted(ROWS))
@pytest.mark.parametrize("k", [1, 40, 100])
def test_the_candidates_hold_the_k_largest(n: int, kind: str, k: int) -> None:
    rng = np.random.default_rng(n + k)
    row = ROWS[kind](rng, n).astype(np.float32)
    keep = top_candidates(row, k)
    assert keep is not None
    assert largest(row, k) <= set(keep.tolist())
    assert len(set(keep.tolist())) == len(keep) and keep.min() >= 0 and keep.max() < n
    if kind in ("normal", "peaked"):
        assert len(keep) < 4 * k  # a shortcut: a handful of the row, not most of it


def test_masked_tokens_are_never_candidates() -> None:
    rng = np.random.default_rng(5)
    row = rng.standard_normal(151_936).astype(np.float32)
    allowed = rng.choice(151_936, 300, replace=False)
    masked = np.full_like(row, -np.inf)
    masked[allowed] = row[allowed]  # a grammar's mask: 300 tokens left
    keep = top_candidates(masked, 40)
    assert keep is not None
    assert largest(masked, 40) <= set(keep.tolist()) <= set(allowed.tolist())


def test_it_declines_where_it_cannot_help() -> None:
    rng = np.random.default_rng(6)
    assert top_candidates(rng.standard_normal(5_000).astype(np.float32), 40) is None  # under 40 blocks
    assert top_candidates(rng.standard_normal(151_936).astype(np.float32), 0) is None
    few = np.full(151_936, -np.inf, dtype=np.float32)
    few[:10] = 1.0  # every finite value in a few blocks: the k-th block's maximum is -inf
    assert top_candidates(few, 40) is None


def test_which_chains_take_the_shortcut() -> None:
    n = 151_936
    assert Sampler(SamplingParams(temperature=0.8, top_k=40), n).top_k == 40
    assert Sampler(SamplingParams(temperature=0.8, top_k=0), n).top_k == 0  # no top-k: the whole vocabulary
    assert Sampler(SamplingParams(temperature=0.0), n).top_k == 0  # greedy: the argmax path
    assert Sampler(SamplingParams(temperature=0.8, repeat_penalty=1.1), n).top_k == 0  # penalties come first
    assert Sampler(SamplingParams(temperature=0.8, logit_bias=((3, 5.0),)), n).top_k == 0  # so does a bias


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(seed=3),
        SamplingParams(temperature=1.3, top_k=100, top_p=0.8, min_p=0.0, seed=4),
        SamplingParams(temperature=0.5, top_k=5, top_p=1.0, min_p=0.2, seed=5),
    ],
)
def test_the_shortcut_draws_what_the_whole_vocabulary_draws(params: SamplingParams) -> None:
    n = 151_936
    rng = np.random.default_rng(7)
    short, whole = Sampler(params, n), Sampler(params, n)
    everything = np.arange(n, dtype=np.int32)
    drawn = []
    for i in range(120):
        row = (rng.standard_normal(n) * (0.5 + i % 4)).astype(np.float32)  # flat to peaked; no ties
        keep = top_candidates(row, params.top_k)
        token = short.draw(row, keep)
        assert token == whole.draw(row, everything)
        drawn.append(token)
    assert len(set(drawn)) > 100  # sampled, not a fixed pick
    short.close()
    whole.close()


@pytest.fixture(scope="module")
def wide_vocab_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """A tiny model with 9,000 tokens: enough blocks for the shortcut at top-k 40."""
    letters = [chr(c) for c in range(ord("!"), ord("~") + 1)]
    merges = [f"{a} {b}" for a in letters for b in letters]
    path: Path = write_tiny_model(tmp_path_factory.mktemp("wide-vocab") / "wide-vocab.gguf", merges=merges)
    with Engine(engine_config(path, n_ctx=256, n_threads=2)) as engine:
        yield engine


def test_a_generation_samples_the_text_llama_cpp_samples(
    wide_vocab_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = wide_vocab_engine
    assert engine.n_vocab > 40 * 128
    prompt = engine.tokenize("the cat sat on")
    texts = []
    for seed in (1, 2):
        params = SamplingParams(temperature=1.0, seed=seed)
        shortcut, stats = collect(generate(engine, prompt, params, max_tokens=48, ignore_eos=True))
        with monkeypatch.context() as patch:
            patch.setattr(sampling_module, "top_candidates", lambda row, k: None)  # llama.cpp's own path
            native, _ = collect(generate(engine, prompt, params, max_tokens=48, ignore_eos=True))
        assert shortcut == native and stats.generated_tokens == 48
        texts.append(shortcut)
    assert texts[0] != texts[1]
