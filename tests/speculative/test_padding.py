"""Verify batches padded to the sizes a flat (GPU-like) verify curve
favours: the step's shape repeats, and the text is the one without padding."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp
import pytest

from localrun.runtime.decoder import Decoder
from localrun.runtime.engine import Engine
from localrun.runtime.generate import generate
from localrun.runtime.sampling import SamplingParams
from localrun.speculative import Speculation
from localrun.speculative.control import PAD_SIZES, FixedController
from localrun.speculative.draftmodel import DraftModelDrafter
from localrun.speculative.lookup import PromptLookupDrafter
from tests.helpers import collect, engine_config
from tests.tinymodel import write_tiny_model

FLAT = tuple(1.0 + 0.3 * (r - 1) / 63 for r in range(1, 65))  # a GPU's verify curve
STEEP = tuple(1.0 + 0.8 * (r - 1) for r in range(1, 17))  # a CPU's
GREEDY = SamplingParams(temperature=0.0)
SEEDED = SamplingParams(temperature=0.8, top_k=20, top_p=0.95, seed=11)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pad")
    return {
        "bigram": write_tiny_model(d / "bigram.gguf", bigram=True, n_ctx_train=4096),  # greedy text loops
        "target": write_tiny_model(d / "target.gguf", n_ctx_train=4096),
        "other": write_tiny_model(d / "other.gguf", seed=7, n_ctx_train=4096),  # a draft that is often wrong
    }


@pytest.fixture(scope="module")
def bigram(models: dict[str, Path]) -> Iterator[Engine]:
    with Engine(engine_config(models["bigram"], n_ctx=1024, n_threads=2)) as eng:
        yield eng


@dataclass
class Rows(FixedController):
    """A fixed way, and the rows of every verify batch."""

    verified: list[int] = field(default_factory=list)

    def observe_verify(self, rows: int, seconds: float) -> None:
        self.verified.append(rows)


def _run(
    engine: Engine, spec: Speculation, prompt: Sequence[int], sampling: SamplingParams, n: int = 200
) -> tuple[str, Decoder]:
    decoder = Decoder(engine)
    with spec:
        text, stats = collect(spec.generate(engine, prompt, sampling, max_tokens=n, decoder=decoder))
    assert stats.draft is not None and stats.draft.proposed > 0
    return text, decoder


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED])
def test_lookup_padded_keeps_the_text_and_repeats_the_shape(bigram: Engine, sampling: SamplingParams) -> None:
    prompt = bigram.tokenize("the cat sat on the mat")
    plain = collect(generate(bigram, prompt, sampling, max_tokens=200))[0]
    unpadded, padded = Rows(0, 5), Rows(0, 5)
    text, _ = _run(bigram, Speculation([PromptLookupDrafter()], unpadded), prompt, sampling)
    assert text == plain
    text, decoder = _run(bigram, Speculation([PromptLookupDrafter()], padded, verify_curve=FLAT), prompt, sampling)
    assert text == plain
    assert 6 in unpadded.verified and 6 not in padded.verified  # 1 + 5 drafted rows, padded to 8
    assert set(padded.verified) <= {1, *PAD_SIZES} and padded.verified.count(8) > 10
    # the padding's cells are gone: the cache holds the decided tokens, no more
    assert llama_cpp.llama_memory_seq_pos_max(bigram.memory, 0) == decoder.n_past - 1 == len(decoder.tokens) - 1


def test_a_steep_curve_pads_nothing(bigram: Engine) -> None:
    prompt = bigram.tokenize("the cat sat on the mat")
    steep, none = Rows(0, 5), Rows(0, 5)
    _run(bigram, Speculation([PromptLookupDrafter()], steep, verify_curve=STEEP), prompt, GREEDY)
    _run(bigram, Speculation([PromptLookupDrafter()], none), prompt, GREEDY)
    assert steep.verified == none.verified and 6 in steep.verified


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED])
def test_a_draft_model_padded_keeps_the_text(models: dict[str, Path], sampling: SamplingParams) -> None:
    """A draft model that is often wrong (rollbacks past the padding every
    step); sampled, its drafts are checked by speculative sampling, which
    draws its own random numbers: with the same seed, padded or not, the
    same text."""
    with Engine(engine_config(models["target"], n_ctx=1024, n_threads=2)) as engine:
        prompt = engine.tokenize("once upon a time")
        texts = []
        for curve in (None, FLAT):
            drafter = DraftModelDrafter(models["other"], engine, eager=True, p_min=0.0)
            control = Rows(0, 4)  # 5 rows: padded to 8 on the flat curve
            text, decoder = _run(engine, Speculation([drafter], control, verify_curve=curve), prompt, sampling)
            texts.append(text)
            assert (8 in control.verified) == (curve is not None)
            assert llama_cpp.llama_memory_seq_pos_max(engine.memory, 0) == decoder.n_past - 1
        assert texts[0] == texts[1]
        if sampling.greedy:
            assert texts[0] == collect(generate(engine, prompt, sampling, max_tokens=200))[0]
