"""Chat formats: one entry per model family holding all localrun knows of
it (how its template is recognised, how a conversation is prepared for it,
its thinking markers, its tool-call syntax), and `of`, which tells a
template's format once."""

from localrun.chatformat.format import ChatFormat
from localrun.chatformat.registry import FORMATS, HERMES, named, of
from localrun.chatformat.thinking import ReasoningFormat

__all__ = ["FORMATS", "HERMES", "ChatFormat", "ReasoningFormat", "named", "of"]
