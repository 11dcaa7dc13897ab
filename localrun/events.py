"""What the core reports and the renderers consume: the decode loop's events,
and the callback type for byte transfers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

StopReason = Literal["eos", "length", "stop", "interrupted", "error"]  # error: a remote's stream was cut
TransferProgress = Callable[[str, int, int | None], None]  # (what, bytes done, bytes in all if known)


@dataclass(frozen=True)
class DraftStats:
    """Speculative decoding so far: who drafts, how many drafted tokens the
    target checked (``proposed``) and kept (``accepted``) over ``rounds``
    verify steps that carried a draft."""

    drafter: str
    proposed: int = 0
    accepted: int = 0
    rounds: int = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accepted(self) -> float:
        return self.accepted / self.rounds if self.rounds else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"drafter": self.drafter, "proposed": self.proposed, "accepted": self.accepted}


@dataclass(frozen=True)
class TokenEvent:
    """New text, with the running figures a live display shows."""

    text: str
    generated_tokens: int
    ttft_s: float
    elapsed_s: float
    decode_tokens_per_s: float
    draft: DraftStats | None = None  # set by the speculative loop
    threads: int | None = None  # CPU threads decoding (they adapt to other processes' load)


@dataclass(frozen=True)
class ReasoningEvent:
    """New thinking text of a reasoning model (apart from the answer's `TokenEvent`s),
    with the running figures: ``reasoning_tokens`` of the ``generated_tokens`` were thinking."""

    text: str
    generated_tokens: int
    reasoning_tokens: int
    ttft_s: float
    elapsed_s: float
    decode_tokens_per_s: float
    draft: DraftStats | None = None
    threads: int | None = None


@dataclass(frozen=True)
class Stats:
    prompt_tokens: int
    generated_tokens: int
    ttft_s: float
    decode_tokens_per_s: float
    elapsed_s: float
    stop_reason: StopReason
    prompt_tokens_per_s: float = 0.0
    cached_tokens: int = 0  # prompt tokens found in the KV cache, not evaluated
    prompt_cache: str | None = None  # "hit" or "miss" when a prompt cache was used
    draft: DraftStats | None = None  # speculative decoding's figures, when it ran
    valid: bool | None = None  # structured output: the text follows the schema or grammar (None: none given)
    invalid: str | None = None  # ... and why not
    forced_tokens: int | None = None  # tokens of the text the grammar left no choice about
    threads: int | None = None  # CPU threads decoding when the run ended
    thread_shares: dict[int, float] | None = None  # the share of decode steps run at each thread count
    reasoning_tokens: int = 0  # of generated_tokens, those of the thinking (its markers among them)


@dataclass(frozen=True)
class DoneEvent:
    stats: Stats


Event = TokenEvent | ReasoningEvent | DoneEvent


@dataclass(frozen=True)
class ToolStepDone:
    """A tool loop's step ended in calls (its figures); the reply goes on after their results."""

    stats: Stats


@dataclass(frozen=True)
class ToolCallEvent:
    """The model called a tool (``name``, the arguments checked against its schema); ``id`` pairs it with its result."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolResultEvent:
    """A call's result as the model is given it. ``status``: ok, error, timeout or refused (not allowed to run)."""

    id: str
    name: str
    text: str
    status: str
    seconds: float = 0.0


ToolEvent = ToolStepDone | ToolCallEvent | ToolResultEvent


@dataclass(frozen=True)
class TokenChoice:
    """A token sampled and its log-probability under the model, with the most
    likely tokens there (`top`, each (token, logprob)): OpenAI's `logprobs`."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class SequenceDone:
    """One prompt of a batch has finished: its text and figures (times from when it got a slot)."""

    index: int
    text: str
    stats: Stats
    reasoning: str = ""  # a reasoning model's thinking (``text`` is the answer)
    logprobs: tuple[TokenChoice, ...] = ()  # each token's, when the request asked for them


@dataclass(frozen=True)
class SequenceText:
    """New text of one prompt of a batch, as it is produced (when the run streams)."""

    index: int
    text: str
    generated: int = 0  # the prompt's tokens generated so far, this text's among them
    logprobs: tuple[TokenChoice, ...] = ()  # the tokens' since the last text, when the request asked for them


@dataclass(frozen=True)
class SequenceReasoning:
    """New thinking text of one prompt of a batch (a reasoning model's), apart from its `SequenceText`."""

    index: int
    text: str
    generated: int = 0


@dataclass(frozen=True)
class BatchProgress:
    """Where a batch run stands, after each shared decode and once at the end."""

    done: int  # prompts finished
    total: int
    generated_tokens: int  # over all sequences
    evaluated_tokens: int  # prompt tokens decoded; a shared prefix counts once
    shared_prefix: int  # prompt tokens every sequence shares, evaluated once
    elapsed_s: float
    parallel: int = 0  # sequences decoded together, at most
    final: bool = False
    interrupted: bool = False

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0


BatchEvent = SequenceDone | BatchProgress
