"""Prompt lookup: n-gram lookup over the prompt and the text generated so
far. It finds where the last two tokens occurred before (preferring the
occurrence that agrees with the most preceding tokens) and proposes what
followed; it costs microseconds and no model. When a long run of the input is
being copied the agreement is long, and so the controller drafts long."""

from __future__ import annotations

import time
from collections.abc import Sequence
from operator import eq

import numpy as np

from localrun.runtime.sampling import SamplingParams
from localrun.speculative.base import LOOKUP_MAX, Draft, Mask, Offer, Profile

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
        return sum(map(eq, seen[start - limit : start], seen[n - limit : n]))  # the slices are as long

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

    def draft(
        self,
        context: Sequence[int],
        n: int,
        sampling: SamplingParams,
        rng: np.random.Generator,
        mask: Mask | None = None,
    ) -> Draft:
        t0 = time.perf_counter()
        seen, start, length = self._seen, self._source, len(self._seen)
        out: list[int] = []
        for i in range(n):  # a source that runs into the cursor continues with the draft itself (a loop)
            j = start + i
            out.append(seen[j] if j < length else out[j - length])
        return Draft(out, steps_s=time.perf_counter() - t0)

    def close(self) -> None:
        pass
