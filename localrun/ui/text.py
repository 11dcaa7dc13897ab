"""One-line summaries of a generation, its drafting and a chat session."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localrun.events import DraftStats, Stats
    from localrun.runtime.chat import SessionTotals

from localrun.units import count


def oldest_turns(n: int) -> str:
    """What chat dropped to fit the context: "the oldest turn", "the 3 oldest turns"."""
    return "the oldest turn" if n == 1 else f"the {n} oldest turns"


def draft_line(draft: DraftStats) -> str:
    if not draft.proposed:
        return "no drafts (plain decoding paid best)"
    return (
        f"draft {draft.drafter}: {draft.acceptance:.0%} of {count(draft.proposed, 'drafted token')} kept, "
        f"{draft.mean_accepted:.1f} per step"
    )


def stats_line(stats: Stats) -> str:
    return (
        f"{count(stats.generated_tokens, 'token')}"
        f"{f' ({stats.reasoning_tokens} thinking)' if stats.reasoning_tokens else ''}"
        f", {stats.decode_tokens_per_s:.1f} tok/s, "
        f"prompt {count(stats.prompt_tokens, 'token')} at {stats.prompt_tokens_per_s:.1f} tok/s"
        f"{f' ({stats.cached_tokens} cached)' if stats.cached_tokens else ''}"
        f"{f', prompt cache {stats.prompt_cache}' if stats.prompt_cache else ''}, "
        f"ttft {stats.ttft_s:.2f}s, {stats.elapsed_s:.2f}s total, stop: {stats.stop_reason}"
        f"{f', {draft_line(stats.draft)}' if stats.draft else ''}"
    )


def session_line(totals: SessionTotals) -> str:
    # no rate where no turn decoded long enough to time one (a reply of a token or two)
    rate = f" at {totals.decode_rate:.1f} tok/s" if totals.decode_rate else ""
    return (
        f"{count(totals.turns, 'turn')}, {count(totals.generated_tokens, 'token')} generated{rate}, "
        f"prompt tokens evaluated {totals.evaluated_tokens}, reused from the cache {totals.cached_tokens}"
    )
