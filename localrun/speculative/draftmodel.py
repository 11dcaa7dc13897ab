"""A draft model: a smaller model with the same vocabulary, with its own
engine and KV cache kept in step with the target's accepted tokens (rolled
back past rejected drafts). Loaded on first use unless asked for eagerly; its
vocabulary is checked against the target's before it is loaded."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from localrun.errors import IncompatibleDraftError
from localrun.gguf.reader import ArrayInfo, GGUFInfo, read_gguf, read_strings, string_span
from localrun.runtime.decoder import Decoder, common_prefix
from localrun.runtime.engine import Engine, EngineConfig
from localrun.runtime.llama import DecodeStatus
from localrun.runtime.sampling import SamplingParams
from localrun.speculative.base import MODEL_MAX, Draft, Mask, Offer, Profile
from localrun.speculative.sampling import Probs, sample, target_probs

SPEC_VOCAB_MAX_DIFF = 128  # llama.cpp's rule for a usable draft
SPEC_VOCAB_CHECK_FROM = 5


def check_draft_compatible(target: GGUFInfo, draft: GGUFInfo) -> None:
    """The rule llama.cpp applies, from the two files' tokenizer metadata:
    same vocabulary type, the same BOS/EOS, sizes within 128 tokens, and the
    same token text for every id past the first few. Raises naming what differs."""

    def fail(what: str) -> IncompatibleDraftError:
        return IncompatibleDraftError(
            f"{draft.path.name} cannot draft for {target.path.name}: {what}",
            hint="use a draft model from the same family (same tokenizer), or --spec lookup",
        )

    t, d = target.metadata, draft.metadata
    for key, label in (
        ("tokenizer.ggml.model", "vocabulary type"),
        ("tokenizer.ggml.add_bos_token", "add-BOS flag"),
        ("tokenizer.ggml.add_eos_token", "add-EOS flag"),
        ("tokenizer.ggml.bos_token_id", "BOS token"),
        ("tokenizer.ggml.eos_token_id", "EOS token"),
    ):
        if t.get(key) != d.get(key):
            raise fail(f"{label} differs (target {t.get(key)!r}, draft {d.get(key)!r})")
    t_tokens, d_tokens = t.get("tokenizer.ggml.tokens"), d.get("tokenizer.ggml.tokens")
    if not isinstance(t_tokens, ArrayInfo) or not isinstance(d_tokens, ArrayInfo):
        raise fail("a vocabulary is missing from the file")
    if abs(t_tokens.length - d_tokens.length) > SPEC_VOCAB_MAX_DIFF:
        raise fail(
            f"vocabulary sizes differ by more than {SPEC_VOCAB_MAX_DIFF} ({t_tokens.length} vs {d_tokens.length})"
        )
    stop = min(t_tokens.length, d_tokens.length)
    if string_span(target.path, t_tokens, SPEC_VOCAB_CHECK_FROM, stop) == string_span(
        draft.path, d_tokens, SPEC_VOCAB_CHECK_FROM, stop
    ):
        return
    ours = read_strings(target.path, t_tokens, SPEC_VOCAB_CHECK_FROM, stop)
    theirs = read_strings(draft.path, d_tokens, SPEC_VOCAB_CHECK_FROM, stop)
    i = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b)
    raise fail(
        f"token {i + SPEC_VOCAB_CHECK_FROM} differs (target {ours[i].decode(errors='replace')!r}, "
        f"draft {theirs[i].decode(errors='replace')!r})"
    )


DRAFT_PRIOR = (0.7,)
_LOAD_BYTES_PER_S = 2e9  # a rough guess at loading speed, until the first load is measured
# a token of catch-up (evaluated in a batch) as a share of a plain step, until
# measured live, where `localrun tune` measured no batch costs on this machine:
# the middle of the range it can take (a whole step, down to next to nothing)
CATCH_UP_GUESS = 0.5
CATCH_UP_ROWS = 8  # the batch size whose per-token cost stands for a catch-up's


@dataclass
class DraftModelDrafter:
    """A draft model kept in step with the target's accepted tokens.

    ``p_min``: stop drafting when the draft's own top probability falls below
    it (a draft it is unsure of is seldom accepted)."""

    path: Path
    target: Engine
    eager: bool = False
    p_min: float = 0.4
    verify_curve: Sequence[float] | None = None  # the target's batch costs measured here (see `Speculation`)
    profile: Profile = field(init=False)

    def __post_init__(self) -> None:
        self.info = read_gguf(self.path)
        check_draft_compatible(self.target.info, self.info)
        size = sum(t.n_bytes for t in self.info.tensors)
        target_size = sum(t.n_bytes for t in self.target.info.tensors) or 1
        ratio = size / target_size  # a decode step reads every weight once: its cost follows the size
        curve = self.verify_curve
        per_token = (
            curve[min(CATCH_UP_ROWS, len(curve)) - 1] / min(CATCH_UP_ROWS, len(curve)) if curve else CATCH_UP_GUESS
        )
        self.profile = Profile(
            name=self.info.name,
            step_cost=ratio,
            catch_up_cost=ratio * per_token,
            setup_s=size / _LOAD_BYTES_PER_S,
            acceptance=DRAFT_PRIOR,
            free=False,
        )
        self.engine: Engine | None = None
        self.decoder: Decoder | None = None
        self._known = 0  # leading tokens of the draft's cache known to match the context
        self._n_prompt = 0
        if self.eager:
            self._load()

    def _load(self) -> Decoder:
        if self.decoder is None:
            config = self.target.config
            self.engine = Engine(
                EngineConfig(
                    model_path=self.path,
                    n_ctx=self.target.n_ctx,
                    placement=self.target.placement.for_draft(),  # the draft's share of the target's plan
                    n_threads=self.target.threads,  # the count the target decodes with now (it may adapt)
                    max_threads=self.target.max_threads,
                    adapt_threads=False,  # its steps are not timed: it follows the target's governor
                    n_batch=min(config.n_batch, 512),
                    flash_attn=config.flash_attn,
                    verbose=config.verbose,
                ),
                self.info,
            )
            self.decoder = Decoder(self.engine)
        return self.decoder

    @property
    def loaded(self) -> bool:
        return self.decoder is not None

    def begin(self, context: Sequence[int]) -> None:
        self._known = 0
        self._n_prompt = len(context)
        if self.decoder is not None:
            self._known = self._common(context)
            if self.eager and len(context) > 1:
                self._sync(context[:-1])  # the prompt now, so the first draft waits only for its last token

    def _common(self, context: Sequence[int]) -> int:
        assert self.decoder is not None
        held = self.decoder.tokens
        known = self._known  # what was checked before: compare only past it
        return known + common_prefix(held[known:], context[known:])

    def _sync(self, context: Sequence[int]) -> int:
        """Make the draft's cache hold ``context``, evaluating at least its
        last token (whose logits the next draft step reads). Returns how many
        tokens were evaluated, or -1 when the draft's context could not take them."""
        decoder = self._load()
        if self.engine is not None and self.engine.threads != self.target.threads:
            self.engine.set_threads(self.target.threads)  # the target's governor speaks for both
        keep = min(self._common(context), len(context) - 1)
        decoder.rollback(keep)
        status = decoder.evaluate(context[keep:])
        decoder.rollback(decoder.n_past)  # a batch that failed midway leaves no cells behind
        self._known = decoder.n_past
        if status != DecodeStatus.OK:
            return -1
        if decoder.cuts.recurrent:  # a recurrent draft's drafted tokens are taken back from here, not from scratch
            decoder.checkpoints.save(0, decoder.tokens)
        return len(context) - keep

    def offer(self, context: Sequence[int], index: int) -> Offer | None:
        if self.decoder is None:
            return Offer(index, 0, MODEL_MAX, catch_up=len(context))
        return Offer(index, 0, MODEL_MAX, catch_up=max(len(context) - self._common(context), 1))

    def draft(
        self,
        context: Sequence[int],
        n: int,
        sampling: SamplingParams,
        rng: np.random.Generator,
        mask: Mask | None = None,
    ) -> Draft:
        """Up to ``n`` tokens, each the draft's choice among what ``mask`` allows
        (when its vocabulary is the target's size, as the mask is)."""
        t0 = time.perf_counter()
        n_sync = self._sync(context)
        decoder = self.decoder
        assert decoder is not None and self.engine is not None
        t1 = time.perf_counter()
        if n_sync < 0:
            return Draft([], None, 0, t1 - t0)
        if mask is not None and mask.n_vocab != self.engine.n_vocab:
            mask = None  # the loop cuts the draft where the grammar rejects it
        tokens: list[int] = []
        probs: list[Probs] | None = None if sampling.greedy else []
        recent = [] if sampling.greedy else list(context[self._n_prompt :])  # the penalty window: generated tokens
        for i in range(n):
            logits: Any = decoder.logits(-1)
            if mask is not None:
                if mask.stopped:
                    break
                mask.apply(logits)  # the draft engine's own buffer: nothing else reads it
            token, q = _pick(logits, sampling, rng, recent)
            confidence = 1.0 / float(np.exp(logits - logits[token]).sum()) if q is None else float(q.max())
            if confidence < self.p_min and i > 0:
                break
            tokens.append(token)
            if probs is not None:
                probs.append(q)
                recent.append(token)
            if mask is not None:
                mask.consume(token)
            if i + 1 < n and decoder.evaluate((token,)) != DecodeStatus.OK:
                break
        self._known = decoder.n_past
        return Draft(tokens, probs, n_sync, t1 - t0, time.perf_counter() - t1)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        self.engine = self.decoder = None


def _pick(logits: Any, sampling: SamplingParams, rng: np.random.Generator, recent: list[int]) -> tuple[int, Probs]:
    """The draft's token for one row: its argmax when greedy (no distribution),
    else a sample and the distribution it was drawn from."""
    if sampling.greedy:
        return int(np.argmax(logits)), None
    q = target_probs(logits, sampling, recent)
    return sample(q, rng), q
