"""How a family marks its thinking: the markers that open and close it,
what a spent budget forces, and where the answer starts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningFormat:
    """One family's thinking markers: ``start`` opens it, ``end`` closes it.
    ``forced`` is what a spent budget forces (the closing marker, and for
    channels the header of the final answer); ``answer`` is what the answer
    starts after (``end`` itself, or the final channel's header).
    ``channels``: the reply is messages on named channels (gpt-oss's
    harmony), the thinking one of them. ``shown``: the markers a rendered
    prompt shows where the template writes a reasoning section."""

    name: str
    start: str
    end: str
    forced: str
    answer: str
    channels: bool = False
    split_on: tuple[str, ...] = ()
    shown: tuple[str, ...] = ()
    found_by: str = ""  # what a template holds where it writes these markers ("": each of its family's does)

    @property
    def markers(self) -> tuple[str, ...]:
        """The texts the splitter must see (rendered even where they are control tokens)."""
        return self.split_on or (self.start, self.end)


def _tags(name: str, start: str, end: str, *shown: str) -> ReasoningFormat:
    return ReasoningFormat(name, start, end, forced=end, answer=end, shown=shown or (start,), found_by=end)


HARMONY = ReasoningFormat(
    "harmony",
    "<|channel|>analysis<|message|>",
    "<|end|>",
    forced="<|end|><|start|>assistant<|channel|>final<|message|>",
    answer="<|channel|>final<|message|>",
    channels=True,
    split_on=("<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>"),
    found_by="analysis",
)
SEED = _tags("seed", "<seed:think>", "</seed:think>")
MAGISTRAL = _tags("magistral", "[THINK]", "[/THINK]")
COMMAND_R = _tags("command-r", "<|START_THINKING|>", "<|END_THINKING|>")
GEMMA4 = _tags("gemma4", "<|channel>thought", "<channel|>", "<|channel>", "<|think|>")
MINIMAX_M3 = _tags("minimax-m3", "<mm:think>", "</mm:think>")
# its template builds the tags, so they are not in its text: every Kimi K3 template thinks
KIMI_K3 = ReasoningFormat(
    "kimi-k3", "<|open|>think<|sep|>", "<|close|>think<|sep|>", "<|close|>think<|sep|>", "<|close|>think<|sep|>"
)
THINK = _tags("think", "<think>", "</think>", "<think>", "</think>")

# the order in which a template's markers are looked for: the most particular first
TAGGED: tuple[ReasoningFormat, ...] = (SEED, MAGISTRAL, COMMAND_R, GEMMA4, MINIMAX_M3, THINK)
FORMATS: tuple[ReasoningFormat, ...] = (HARMONY, *TAGGED, KIMI_K3)

# what a rendered prompt shows where its template writes a reasoning section
THINKING_MARKERS: tuple[str, ...] = tuple(m for fmt in TAGGED for m in fmt.shown)


def found(template: str, formats: tuple[ReasoningFormat, ...]) -> ReasoningFormat | None:
    """The first of ``formats`` whose markers ``template`` writes, if any."""
    return next((fmt for fmt in formats if fmt.found_by in template), None)
