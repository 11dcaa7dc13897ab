"""Speculative sampling's arithmetic, in numpy.

`target_probs` turns one row of logits into the distribution llama.cpp's
native chain (decode.Sampler) samples from: repeat penalty, top-k, top-p,
min-p, temperature, in that order and with the same rules. Differences: the
arithmetic is float64 here and float32 there, and ties at a top-k or top-p
boundary may keep a different one of two equal logits.

`check_draft` is the accept/resample rule of speculative sampling (Leviathan
et al.; Chen et al., 2023): a token ``x`` drafted from ``q`` is kept with
probability min(1, p(x)/q(x)); otherwise a replacement is drawn from the
residual max(0, p - q), renormalised. Whatever q is, the token that comes out
is distributed exactly as p. A deterministic draft (prompt lookup, a greedy
draft) is q = one-hot(x): x is kept with probability p(x), else the
replacement comes from p without x. For such drafts the speculative loop uses
the equivalent form "sample from p with the native chain and keep x when the
sample is x" (P(keep) = p(x), and a rejected row's sample is distributed as p
without x), which also keeps a seeded run's text identical to plain decoding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from localrun.runtime.sampling import SamplingParams

Probs = Any  # a 1-D float64 numpy array over the vocabulary, summing to 1


def target_probs(logits: Any, params: SamplingParams, recent: Sequence[int] = ()) -> Probs:
    """The distribution the native chain samples from, for one row of
    ``logits``; ``recent`` are the tokens generated so far (the penalty's window)."""
    values = np.array(logits, dtype=np.float64)
    n = values.shape[0]
    if params.repeat_penalty != 1.0 and recent:
        window = recent if params.repeat_last_n < 0 else recent[len(recent) - params.repeat_last_n :]
        if window:
            seen = np.unique(np.asarray(window, dtype=np.int64))
            v = values[seen]
            values[seen] = np.where(v <= 0, v * params.repeat_penalty, v / params.repeat_penalty)
    out = np.zeros(n, dtype=np.float64)
    if params.greedy:
        out[int(np.argmax(values))] = 1.0
        return out
    ids = np.arange(n)
    if 0 < params.top_k < n:
        ids = np.argpartition(values, n - params.top_k)[n - params.top_k :]
    kept = values[ids]
    if params.top_p < 1.0:
        order = np.argsort(-kept, kind="stable")
        ids, kept = ids[order], kept[order]
        p = np.exp(kept - kept[0])
        cum = np.cumsum(p / p.sum())
        keep = min(int(np.searchsorted(cum, params.top_p, side="left")) + 1, len(ids))
        ids, kept = ids[:keep], kept[:keep]
    if params.min_p > 0.0:
        mask = kept >= kept.max() + math.log(params.min_p)
        ids, kept = ids[mask], kept[mask]
    e = np.exp((kept - kept.max()) / params.temperature)
    out[ids] = e / e.sum()
    return out


def sample(probs: Probs, rng: np.random.Generator) -> int:
    """One token drawn from ``probs`` (any non-negative weights)."""
    cum = np.cumsum(probs)
    i = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    return min(i, len(cum) - 1)


def check_draft(p: Probs, token: int, q: Probs | None, rng: np.random.Generator) -> int | None:
    """Speculative sampling's test of one drafted ``token``: None when it is
    kept, else the token to emit instead. ``q`` is the distribution the draft
    was drawn from; None for a deterministic draft (q = one-hot)."""
    q_token = 1.0 if q is None else float(q[token])
    if rng.random() * q_token < p[token]:  # probability min(1, p/q)
        return None
    if q is None:
        residual = p.copy()
        residual[token] = 0.0
    else:
        residual = np.maximum(p - q, 0.0)
    if residual.sum() <= 0.0:  # p == q up to rounding: nothing to prefer
        residual = p
    return sample(residual, rng)
