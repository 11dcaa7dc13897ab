"""llama.cpp's own llama-completion binary, for the benchmark columns that
run it: its timings read from its log, decode measured as localrun measures it."""

from __future__ import annotations

import re
from dataclasses import dataclass

_PERF = re.compile(r"(prompt eval|\beval) time\s*=\s*([\d.]+) ms /\s*(\d+)")
_SAMPLING = re.compile(r"sampling time\s*=\s*([\d.]+) ms")


@dataclass(frozen=True)
class Timings:
    """One llama-completion run's figures, from its log."""

    decode_per_s: float  # decode steps and their sampling (a grammar's work included), as localrun counts
    prompt_per_s: float
    sampling_share: float  # the part of the decode time its sampling took


def timings(log: str) -> Timings:
    """Read a run's timings. Its "eval" figure counts llama_decode alone;
    localrun's decode rate is the wall clock from the first sampled token to
    the last, sampling included, so the runs' share of the sampling time
    (runs + 1 samples) is added."""
    found = {m.group(1): (float(m.group(2)), int(m.group(3))) for m in _PERF.finditer(log)}
    sampling = _SAMPLING.search(log)
    if "eval" not in found or "prompt eval" not in found or sampling is None:
        raise RuntimeError("could not read llama-completion's timings:\n" + log[-2000:])
    (eval_ms, runs), (prompt_ms, prompt_n) = found["eval"], found["prompt eval"]
    sample_ms = float(sampling.group(1)) * runs / (runs + 1)
    return Timings(1000 * runs / (eval_ms + sample_ms), 1000 * prompt_n / prompt_ms, sample_ms / (eval_ms + sample_ms))
