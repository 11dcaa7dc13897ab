"""Who proposes the tokens that speculative decoding verifies.

- `PromptLookupDrafter`: n-gram lookup over the prompt and the text generated
  so far. Finds where the last two tokens occurred before (preferring the
  occurrence that agrees with the most preceding tokens) and proposes what
  followed; costs microseconds and no model. When a long run of the input is
  being copied the agreement is long, and so the controller drafts long.
- `TextLookupDrafter` (textlookup.py): lookup over the text with its
  whitespace set aside, for answers that copy their input respaced.
- `DraftModelDrafter`: a smaller model with the same vocabulary, with its own
  engine and KV cache kept in step with the target's accepted tokens (rolled
  back past rejected drafts). Loaded on first use unless asked for eagerly;
  its vocabulary is checked against the target's before it is loaded.

A drafter first makes an `Offer` (cheap: how long a draft it could make, a
bucket that predicts how good it will be, how many tokens it must catch up
on); the controller picks, and `draft` makes the tokens.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from localrun.errors import IncompatibleDraftError
from localrun.gguf.reader import ArrayInfo, GGUFInfo, read_gguf, read_strings, string_span
from localrun.runtime.decoder import Decoder, common_prefix
from localrun.runtime.engine import Engine, EngineConfig
from localrun.runtime.llama import DecodeStatus
from localrun.runtime.sampling import SamplingParams
from localrun.speculative.sampling import Probs, sample, target_probs

LOOKUP_MAX = 32  # the longest draft prompt lookup offers
MODEL_MAX = 8  # the longest draft a draft model offers


@dataclass(frozen=True)
class Profile:
    """What the controller assumes about a drafter before it has measured it."""

    name: str
    step_cost: float  # one drafted token, as a fraction of a plain target step
    catch_up_cost: float  # one token of catch-up evaluation, as a fraction of a plain step
    setup_s: float  # a one-time cost before the first draft (loading), seconds
    acceptance: tuple[float, ...]  # prior acceptance per bucket
    free: bool  # drafting costs next to nothing (no model runs)


@dataclass(frozen=True)
class Offer:
    """What a drafter could do at this step."""

    drafter: int  # its index in the speculation's drafters
    bucket: int = 0  # a class of situation with its own acceptance estimate
    max_len: int = 1
    catch_up: int = 0  # tokens it must evaluate before it can draft


@dataclass
class Draft:
    tokens: list[int]
    probs: list[Probs] | None = None  # the distribution each token was drawn from; None: deterministic
    n_sync: int = 0  # tokens evaluated to catch up before drafting
    sync_s: float = 0.0
    steps_s: float = 0.0  # the rest of the drafting time


class Drafter(Protocol):
    profile: Profile

    def begin(self, context: Sequence[int]) -> None:
        """A new generation starts after ``context`` (its prompt)."""

    def offer(self, context: Sequence[int], index: int) -> Offer | None:
        """What it could draft after ``context`` now, cheaply; None: nothing."""

    def draft(self, context: Sequence[int], n: int, sampling: SamplingParams, rng: np.random.Generator) -> Draft:
        """Up to ``n`` tokens to follow ``context``."""

    def close(self) -> None: ...


# ---------------------------------------------------------------- lookup --

_WINDOW = 32  # how far back a source and the cursor are compared
_CANDIDATES = 16  # the latest occurrences of the last two tokens that are compared
# buckets by how many of the last 32 tokens agree with the source's: <3, 3, 4-5, 6-8, 9-15, 16-23, 24+;
# and one for resuming a source right after a token that differs from it (an edit)
_BUCKET_EDGES = (3, 4, 6, 9, 16, 24)
RESUME_BUCKET = len(_BUCKET_EDGES) + 1
_RESUME_MIN = 8  # agreeing tokens a source needs to be resumed past a difference
LOOKUP_PRIOR = (0.1, 0.2, 0.25, 0.5, 0.7, 0.8, 0.85, 0.5)  # a chance match of a few tokens seldom continues


def match_bucket(agreement: int) -> int:
    for i, edge in enumerate(_BUCKET_EDGES):
        if agreement < edge:
            return i
    return len(_BUCKET_EDGES)


class PromptLookupDrafter:
    """N-gram lookup over the prompt and the generated text.

    Candidates: the latest places where the last two tokens occurred before,
    and the place the source copied at the last step has advanced to (which
    survives an edit: a renamed variable, a fixed typo). The candidate whose
    preceding tokens agree most with the cursor's wins; how many agree is
    what the controller's acceptance estimate is keyed on."""

    def __init__(self) -> None:
        self.profile = Profile(
            name="lookup", step_cost=0.0, catch_up_cost=0.0, setup_s=0.0, acceptance=LOOKUP_PRIOR, free=True
        )
        self._index: dict[tuple[int, int], list[int]] = {}
        self._seen: list[int] = []
        self._source = 0  # where the chosen continuation starts
        self._cursor = 0  # the context length when it was chosen

    def begin(self, context: Sequence[int]) -> None:
        self._index, self._seen = {}, []
        self._source = self._cursor = 0
        self._update(context)

    def _update(self, context: Sequence[int]) -> None:
        n = len(self._seen)
        if len(context) < n or (n and context[n - 1] != self._seen[n - 1]):  # another text: start over
            self._index, self._seen = {}, []
            self._source = self._cursor = n = 0
        seen = self._seen
        index = self._index
        for i in range(n, len(context)):
            token = context[i]
            if i:
                index.setdefault((seen[i - 1], token), []).append(i + 1)
            seen.append(token)

    def _agreement(self, start: int, n: int) -> int:
        seen = self._seen
        limit = min(_WINDOW, start)
        return sum(1 for a, b in zip(seen[start - limit : start], seen[n - limit : n], strict=True) if a == b)

    def offer(self, context: Sequence[int], index: int) -> Offer | None:
        self._update(context)
        n = len(context)
        if n < 3:
            return None
        seen = self._seen
        best, best_score, bucket = -1, 0, 0
        for start in reversed(self._index.get((seen[-2], seen[-1]), [])[-_CANDIDATES - 1 :]):
            if start < n:  # not the cursor itself
                score = self._agreement(start, n)
                if score > best_score:
                    best, best_score = start, score
        if best >= 0:
            bucket = match_bucket(best_score)
        follow = self._source + n - self._cursor  # where the source copied last has got to
        if self._cursor and 2 <= follow < n and follow != best:
            score = self._agreement(follow, n)
            if score > best_score and score >= _RESUME_MIN:
                best, best_score = follow, score
                # the last token differs from the source's: the text copies it, with an edit just now
                bucket = match_bucket(score) if seen[follow - 1] == seen[n - 1] else RESUME_BUCKET
        if best < 0:
            return None
        self._source, self._cursor = best, n
        return Offer(index, bucket, LOOKUP_MAX)

    def draft(self, context: Sequence[int], n: int, sampling: SamplingParams, rng: np.random.Generator) -> Draft:
        t0 = time.perf_counter()
        seen, start, length = self._seen, self._source, len(self._seen)
        out: list[int] = []
        for i in range(n):  # a source that runs into the cursor continues with the draft itself (a loop)
            j = start + i
            out.append(seen[j] if j < length else out[j - length])
        return Draft(out, steps_s=time.perf_counter() - t0)

    def close(self) -> None:
        pass


# ----------------------------------------------------------- draft model --

SPEC_VOCAB_MAX_DIFF = 128  # llama.cpp's rule for a usable draft
SPEC_VOCAB_CHECK_FROM = 5


def check_draft_compatible(target: GGUFInfo, draft: GGUFInfo) -> None:
    """The rule llama.cpp applies, from the two files' tokenizer metadata:
    same vocabulary type, the same BOS/EOS, sizes within 128 tokens, and the
    same token text for every id past the first few. Raises naming what differs."""

    def fail(what: str) -> IncompatibleDraftError:
        return IncompatibleDraftError(
            f"{draft.path.name} cannot draft for {target.path.name}: {what}",
            hint="use a draft model from the same family (same tokenizer), or --draft lookup",
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


@dataclass
class DraftModelDrafter:
    """A draft model kept in step with the target's accepted tokens.

    ``p_min``: stop drafting when the draft's own top probability falls below
    it (a draft it is unsure of is seldom accepted)."""

    path: Path
    target: Engine
    eager: bool = False
    p_min: float = 0.4
    profile: Profile = field(init=False)

    def __post_init__(self) -> None:
        self.info = read_gguf(self.path)
        check_draft_compatible(self.target.info, self.info)
        size = sum(t.n_bytes for t in self.info.tensors)
        target_size = sum(t.n_bytes for t in self.target.info.tensors) or 1
        ratio = size / target_size  # a decode step reads every weight once: its cost follows the size
        self.profile = Profile(
            name=self.info.name,
            step_cost=ratio,
            catch_up_cost=ratio * 0.15,
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
                    n_threads=config.n_threads,
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
        keep = min(self._common(context), len(context) - 1)
        decoder.rollback(keep)
        status = decoder.evaluate(context[keep:])
        decoder.rollback(decoder.n_past)  # a batch that failed midway leaves no cells behind
        self._known = decoder.n_past
        return len(context) - keep if status == DecodeStatus.OK else -1

    def offer(self, context: Sequence[int], index: int) -> Offer | None:
        if self.decoder is None:
            return Offer(index, 0, MODEL_MAX, catch_up=len(context))
        return Offer(index, 0, MODEL_MAX, catch_up=max(len(context) - self._common(context), 1))

    def draft(self, context: Sequence[int], n: int, sampling: SamplingParams, rng: np.random.Generator) -> Draft:
        t0 = time.perf_counter()
        n_sync = self._sync(context)
        decoder = self.decoder
        assert decoder is not None
        t1 = time.perf_counter()
        if n_sync < 0:
            return Draft([], None, 0, t1 - t0)
        tokens: list[int] = []
        probs: list[Probs] | None = None if sampling.greedy else []
        recent: list[int] = []
        for i in range(n):
            logits: Any = decoder.logits(-1)
            if probs is None:
                token = int(np.argmax(logits))
                confidence = 1.0 / float(np.exp(logits - logits[token]).sum())
            else:
                if not recent:
                    recent = list(context[self._n_prompt :])  # the penalty window: generated tokens
                q = target_probs(logits, sampling, recent)
                token = sample(q, rng)
                confidence = float(q.max())
                probs.append(q)
                recent.append(token)
            if confidence < self.p_min and i > 0:
                if probs is not None:
                    probs.pop()
                break
            tokens.append(token)
            if i + 1 < n and decoder.evaluate((token,)) != DecodeStatus.OK:
                break
        self._known = decoder.n_past
        return Draft(tokens, probs, n_sync, t1 - t0, time.perf_counter() - t1)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        self.engine = self.decoder = None
