"""Each model family's way of writing tool calls, told from its chat
template in one place (`family`): the syntax its replies are read with, the
grammar that constrains a call once its marker begins (where one can), and
the markers the reply must show as text for the calls to be read (special
tokens that a plain rendering drops, as llama.cpp's "preserved tokens").

Detection follows llama.cpp's (common/chat.cpp picks a handler by text the
template holds): the most particular markers first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from localrun.structured.toolcalls import syntax, vendors
from localrun.structured.toolcalls.syntax import Finder
from localrun.structured.toolcalls.vendors import (
    DS_CALL_BEGIN,
    DS_CALL_END,
    DS_CALLS_BEGIN,
    DS_CALLS_END,
    DS_SEP,
)


@dataclass(frozen=True)
class CallFormat:
    """How a grammar writes one family's calls: ``begin`` call (``between``
    call)* ``end``. A ``json`` call is ``each`` + ``{"name": NAME, KEY: ARGS}``
    + ``after_each``; a ``named`` one is ``each`` + NAME + ``name_end`` + ARGS
    + ``after_each``. ``triggers``: in free text (``auto``), each (text, rest)
    pair opens a call: ``text`` is what the model writes, ``rest`` is forced
    after it up to the function's name. ``leading``: calls can only open the
    reply (their marker renders as nothing)."""

    name: str
    begin: str = ""
    each: str = ""
    between: str = "\n"
    after_each: str = ""
    end: str = ""
    key: str = "arguments"
    triggers: tuple[tuple[str, str], ...] = ()
    leading: bool = False
    shape: Literal["json", "named"] = "json"
    name_end: str = ""
    channels: bool = False  # harmony: the calls are messages on channels, after any thinking in its own

    @property
    def opening(self) -> str:
        """What precedes a call's name: its marker, and for JSON the object's start."""
        return self.each + ('{"name": ' if self.shape == "json" else "")


HERMES = CallFormat(
    "hermes", each="<tool_call>\n", after_each="\n</tool_call>", triggers=(("<tool_call>", '\n{"name": '),)
)
LLAMA3 = CallFormat("llama3", between="; ", key="parameters", leading=True)
MISTRAL_JSON = CallFormat("mistral", begin="[TOOL_CALLS][", between=", ", end="]", leading=True)
MISTRAL_ARGS = CallFormat(
    "mistral-args", each="[TOOL_CALLS]", between="", shape="named", name_end="[ARGS]", triggers=(("[TOOL_CALLS]", ""),)
)
GRANITE = CallFormat("granite", begin="<|tool_call|>[", between=", ", end="]", leading=True)
DEEPSEEK_R1 = CallFormat(
    "deepseek-r1",
    begin=DS_CALLS_BEGIN,
    each=DS_CALL_BEGIN + "function" + DS_SEP,
    after_each="\n```" + DS_CALL_END,
    end=DS_CALLS_END,
    shape="named",
    name_end="\n```json\n",
    triggers=((DS_CALLS_BEGIN, DS_CALL_BEGIN + "function" + DS_SEP),),
)
DEEPSEEK_V31 = CallFormat(
    "deepseek-v3.1",
    begin=DS_CALLS_BEGIN,
    each=DS_CALL_BEGIN,
    between="",
    after_each=DS_CALL_END,
    end=DS_CALLS_END,
    shape="named",
    name_end=DS_SEP,
    triggers=((DS_CALLS_BEGIN, DS_CALL_BEGIN),),
)
QWEN3_CODER = CallFormat(
    "qwen3-coder",
    each="<tool_call>\n<function=",
    after_each="</function>\n</tool_call>",
    shape="named",
    name_end=">\n",
    triggers=(("<tool_call>", "\n<function="),),
)
# gpt-oss: ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>``
# (``<|call|>`` ends the turn: one call a reply)
HARMONY = CallFormat(
    "harmony",
    each="<|channel|>commentary to=functions.",
    between="",
    after_each="<|call|>",
    shape="named",
    name_end=" <|constrain|>json<|message|>",
    channels=True,
)
GRAMMARS: tuple[CallFormat, ...] = (
    HERMES,
    QWEN3_CODER,
    LLAMA3,
    MISTRAL_JSON,
    MISTRAL_ARGS,
    GRANITE,
    DEEPSEEK_R1,
    DEEPSEEK_V31,
    HARMONY,
)


@dataclass(frozen=True)
class Family:
    """One family's tool calls: how they are read (its own syntax, then
    what any model may write: a fenced JSON block, a ``tool_code`` block, a
    bare call object opening the reply), and how they are constrained
    (``grammar`` None: read only, never constrained)."""

    name: str
    own: tuple[Finder, ...]
    grammar: CallFormat | None
    preserved: tuple[str, ...] = ()
    short_ids: bool = False  # its template refuses a call id that is not nine letters and digits

    @property
    def finders(self) -> tuple[Finder, ...]:
        return (*self.own, syntax.fenced_json, syntax.tool_code, syntax.bare_json)


_TOOL_CALL = ("<tool_call>", "</tool_call>")
HERMES_FAMILY = Family("hermes", (syntax.tool_call_tags,), HERMES, _TOOL_CALL)
QWEN3_CODER_FAMILY = Family("qwen3-coder", (syntax.tool_call_tags, syntax.function_tags), QWEN3_CODER, _TOOL_CALL)
LLAMA3_FAMILY = Family("llama3", (syntax.marker_then_json("<|python_tag|>"),), LLAMA3, ("<|python_tag|>",))
MISTRAL_FAMILY = Family(
    "mistral",
    (vendors.mistral, vendors.name_then_json),
    MISTRAL_ARGS,
    ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"),
    short_ids=True,
)
MISTRAL_NEMO_FAMILY = Family("mistral-nemo", (vendors.mistral,), MISTRAL_JSON, ("[TOOL_CALLS]",), short_ids=True)
GRANITE_FAMILY = Family("granite", (syntax.marker_then_json("<|tool_call|>"),), GRANITE, ("<|tool_call|>",))
_DEEPSEEK = (DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_BEGIN, DS_CALL_END, DS_SEP)
DEEPSEEK_R1_FAMILY = Family("deepseek-r1", (vendors.deepseek,), DEEPSEEK_R1, _DEEPSEEK)
DEEPSEEK_V31_FAMILY = Family("deepseek-v3.1", (vendors.deepseek,), DEEPSEEK_V31, _DEEPSEEK)
HARMONY_FAMILY = Family(
    "gpt-oss",
    (vendors.harmony,),
    HARMONY,
    ("<|start|>", "<|channel|>", "<|constrain|>", "<|message|>", "<|end|>", "<|call|>"),
)
GEMMA4_FAMILY = Family("gemma4", (vendors.gemma4,), None, ("<|tool_call>", "<tool_call|>", '<|"|>'))

FAMILIES: tuple[Family, ...] = (
    HERMES_FAMILY,
    QWEN3_CODER_FAMILY,
    LLAMA3_FAMILY,
    MISTRAL_FAMILY,
    MISTRAL_NEMO_FAMILY,
    GRANITE_FAMILY,
    DEEPSEEK_R1_FAMILY,
    DEEPSEEK_V31_FAMILY,
    HARMONY_FAMILY,
    GEMMA4_FAMILY,
)


# (text the template holds, all of it; the family): the first that matches
# decides. Mistral Nemo writes a JSON list after [TOOL_CALLS], newer Mistral
# templates NAME[ARGS]{...}; DeepSeek R1 writes `function<sep>NAME` and a
# fenced block, V3.1 `NAME<sep>` and the JSON.
DETECT: tuple[tuple[tuple[str, ...], Family], ...] = (
    (("<|channel|>",), HARMONY_FAMILY),
    (("[TOOL_CALLS]", "[ARGS]"), MISTRAL_FAMILY),
    (("[TOOL_CALLS]",), MISTRAL_NEMO_FAMILY),
    (("tool▁calls▁begin", "```json"), DEEPSEEK_R1_FAMILY),
    (("tool▁calls▁begin",), DEEPSEEK_V31_FAMILY),
    (("<|tool_call>call:",), GEMMA4_FAMILY),
    (("<tool_call>", "<function=", "<parameter="), QWEN3_CODER_FAMILY),
    (("<|tool_call|>",), GRANITE_FAMILY),
    (("<|python_tag|>",), LLAMA3_FAMILY),
    (('{"name": function name, "parameters":',), LLAMA3_FAMILY),  # Llama 3.2's JSON calls
)


def family(template: str | None) -> Family:
    """The family whose calls the model of ``template`` writes (Hermes, the
    format localrun describes tools in to a template that takes none, when
    nothing else is recognised)."""
    src = template or ""
    return next((fam for marks, fam in DETECT if all(mark in src for mark in marks)), HERMES_FAMILY)
