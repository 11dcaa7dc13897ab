"""Each model family's way of writing tool calls: the syntax its replies
are read with, the grammar that constrains a call once its marker begins
(where one can), and the markers the reply must show as text for the calls
to be read (special tokens that a plain rendering drops, as llama.cpp's
"preserved tokens"). Which family a template is of is
`localrun.chatformat.of`'s to say."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from localrun.structured.toolcalls import elements, markup, recipients, syntax, vendors
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
    numbered: bool = False  # the name is followed by ``:`` and the call's number (Kimi K2)
    # the arguments' notation: JSON, each its own ``<parameter=KEY>`` element (Qwen3-Coder),
    # ``<arg_key>``/``<arg_value>`` pairs (GLM), ``<invoke>`` parameters (MiniMax M2, DeepSeek V3.2), or Gemma 4's
    args: Literal["json", "xml", "pairs", "invoke", "gemma"] = "json"
    tag: str = ""  # what an ``invoke`` format's tags begin with (DeepSeek V3.2's DSML marker)
    typed_attr: bool = False  # an ``invoke`` parameter says whether its value is text (``string="true"``)

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
    args="xml",
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
KIMI_K2 = CallFormat(
    "kimi-k2",
    begin="<|tool_calls_section_begin|>",
    each="<|tool_call_begin|>functions.",
    between="",
    after_each="<|tool_call_end|>",
    end="<|tool_calls_section_end|>",
    shape="named",
    name_end="<|tool_call_argument_begin|>",
    numbered=True,
    triggers=(("<|tool_calls_section_begin|>", "<|tool_call_begin|>functions."),),
)
TOOL_CALLS_LINES = CallFormat(
    "tool-calls-lines",
    begin="<tool_calls>\n",
    end="\n</tool_calls>",
    triggers=(("<tool_calls>", '\n{"name": '),),
)
TOOL_CALLS_LIST = CallFormat(
    "tool-calls-list",
    begin="<tool_calls>[",
    between=", ",
    end="]</tool_calls>",
    triggers=(("<tool_calls>", '[{"name": '),),
)
NEMOTRON = CallFormat(
    "nemotron", begin="<TOOLCALL>[", between=", ", end="]</TOOLCALL>", triggers=(("<TOOLCALL>", '[{"name": '),)
)
FUNCTIONARY_V31 = CallFormat(
    "functionary-v3.1",
    each="<function=",
    between="",
    after_each="</function>",
    shape="named",
    name_end=">",
    triggers=(("<function=", ""),),
)
GIGACHAT_V31 = CallFormat("gigachat-v3.1", each="<|function_call|>", triggers=(("<|function_call|>", '{"name": '),))
# the same call with its recipient in the role header, as gpt-oss's chat template
# renders a past call: ``<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>ARGS<|call|>``
HARMONY_HEADER = CallFormat(
    "harmony-header",
    each=" to=functions.",
    between="",
    after_each="<|call|>",
    shape="named",
    name_end="<|channel|>commentary json<|message|>",
    channels=True,
)
# GLM 4.5 to 4.7, Ling: ``<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...</tool_call>``
GLM = CallFormat(
    "glm",
    each="<tool_call>",
    after_each="</tool_call>",
    shape="named",
    triggers=(("<tool_call>", ""),),
    args="pairs",
)
MINIMAX_M2 = CallFormat(
    "minimax-m2",
    begin="<minimax:tool_call>\n",
    each='<invoke name="',
    after_each="</invoke>",
    end="\n</minimax:tool_call>",
    shape="named",
    name_end='">',
    triggers=(("<minimax:tool_call>", '\n<invoke name="'),),
    args="invoke",
)


def _dsml(block: str) -> CallFormat:
    """DeepSeek V3.2 (``function_calls``) and V4 (``tool_calls``): MiniMax's invoke, its tags prefixed."""
    mark = "<｜DSML｜"
    return CallFormat(
        f"dsml-{block}",
        begin=f"{mark}{block}>\n",
        each=f'{mark}invoke name="',
        after_each=f"</{mark[1:]}invoke>",
        end=f"\n</{mark[1:]}{block}>",
        shape="named",
        name_end='">',
        triggers=((f"{mark}{block}>", f'\n{mark}invoke name="'),),
        args="invoke",
        tag=mark[1:],
        typed_attr=True,
    )


DSML_V32 = _dsml("function_calls")
DSML_V4 = _dsml("tool_calls")
# Gemma 4: ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>``
GEMMA4 = CallFormat(
    "gemma4",
    each="<|tool_call>call:",
    between="",
    after_each="<tool_call|>",
    shape="named",
    triggers=(("<|tool_call>", "call:"),),
    args="gemma",
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
    KIMI_K2,
    TOOL_CALLS_LINES,
    TOOL_CALLS_LIST,
    NEMOTRON,
    FUNCTIONARY_V31,
    GIGACHAT_V31,
    GLM,
    MINIMAX_M2,
    DSML_V32,
    DSML_V4,
    GEMMA4,
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
    parallel: bool = True  # one reply may hold several calls

    @property
    def finders(self) -> tuple[Finder, ...]:
        return (*self.own, syntax.fenced_json, syntax.tool_code, syntax.bare_json)


_TOOL_CALL = ("<tool_call>", "</tool_call>")
HERMES_FAMILY = Family("hermes", (syntax.tool_call_tags,), HERMES, _TOOL_CALL)
QWEN3_CODER_FAMILY = Family("qwen3-coder", (syntax.tool_call_tags, syntax.function_tags), QWEN3_CODER, _TOOL_CALL)
LLAMA3_FAMILY = Family(
    "llama3", (syntax.marker_then_json("<|python_tag|>"),), LLAMA3, ("<|python_tag|>",), parallel=False
)
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
    parallel=False,
)
GEMMA4_FAMILY = Family("gemma4", (vendors.gemma4,), GEMMA4, ("<|tool_call>", "<tool_call|>", '<|"|>'))
KIMI_K2_FAMILY = Family(
    "kimi-k2",
    (markup.wrapped("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", markup.kimi_body),),
    KIMI_K2,
    (
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
    ),
)
LFM2_FAMILY = Family(
    "lfm2",
    (markup.wrapped("<|tool_call_start|>", "<|tool_call_end|>", markup.python_list_body),),
    None,
    ("<|tool_call_start|>", "<|tool_call_end|>"),
)
_TOOL_CALLS = markup.wrapped("<tool_calls>", "</tool_calls>", markup.json_calls_body)
MINIMAX_M1_FAMILY = Family("minimax-m1", (_TOOL_CALLS,), TOOL_CALLS_LINES, ("<tool_calls>", "</tool_calls>"))
APRIEL_FAMILY = Family("apriel", (_TOOL_CALLS,), TOOL_CALLS_LIST, ("<tool_calls>", "</tool_calls>"))
MINIMAX_M2_FAMILY = Family(
    "minimax-m2",
    (markup.wrapped("<minimax:tool_call>", "</minimax:tool_call>", elements.invoke_body("")),),
    MINIMAX_M2,
    ("<minimax:tool_call>", "</minimax:tool_call>"),
)
FUNCTIONARY_V32_FAMILY = Family("functionary-v3.2", (recipients.functionary,), None, (">>>",))
FUNCTIONARY_V31_FAMILY = Family(
    "functionary-v3.1",
    (markup.wrapped("<function=", "</function>", markup.named_json_body), syntax.marker_then_json("<|python_tag|>")),
    FUNCTIONARY_V31,
    ("<|python_tag|>",),
)
GIGACHAT_V3_FAMILY = Family(
    "gigachat-v3",
    (syntax.marker_then_json("<|message_sep|>\n\nfunction call<|role_sep|>"),),
    None,
    ("<|message_sep|>", "<|role_sep|>"),
    parallel=False,
)
GIGACHAT_V31_FAMILY = Family(
    "gigachat-v3.1",
    (syntax.marker_then_json("<|function_call|>"),),
    GIGACHAT_V31,
    ("<|function_call|>",),
    parallel=False,
)
COMMAND_R_FAMILY = Family(
    "command-r",
    (markup.wrapped("<|START_ACTION|>", "<|END_ACTION|>", markup.keyed_json("tool_name", "parameters")),),
    None,
    ("<|START_ACTION|>", "<|END_ACTION|>"),
)
GLM_FAMILY = Family(
    "glm",
    (markup.wrapped("<tool_call>", "</tool_call>", elements.arg_pairs_body()),),
    GLM,
    (*_TOOL_CALL, "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
)
HUNYUAN_FAMILY = Family(
    "hunyuan",
    (
        markup.wrapped(
            "<tool_calls:opensource>",
            "</tool_calls:opensource>",
            markup.each(
                "<tool_call:opensource>",
                "</tool_call:opensource>",
                elements.arg_pairs_body(":opensource", "<tool_sep:opensource>"),
            ),
        ),
    ),
    None,
    tuple(f"<{tag}:opensource>" for tag in ("tool_calls", "/tool_calls", "tool_call", "/tool_call", "tool_sep")),
)
MINICPM_FAMILY = Family("minicpm", (markup.wrapped('<function name="', "</function>", elements.param_body),), None)
DSML_V32_FAMILY = Family(
    "deepseek-v3.2",
    (markup.wrapped("<｜DSML｜function_calls>", "</｜DSML｜function_calls>", elements.invoke_body("｜DSML｜")),),
    DSML_V32,
)
DSML_V4_FAMILY = Family(
    "deepseek-v4",
    (markup.wrapped("<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", elements.invoke_body("｜DSML｜")),),
    DSML_V4,
)
NEMOTRON_FAMILY = Family(
    "nemotron-v2",
    (markup.wrapped("<TOOLCALL>", "</TOOLCALL>", markup.json_calls_body),),
    NEMOTRON,
    ("<TOOLCALL>", "</TOOLCALL>"),
)
SEED_FAMILY = Family(
    "seed-oss",
    (markup.wrapped("<seed:tool_call>", "</seed:tool_call>", elements.seed_body),),
    None,
    ("<seed:tool_call>", "</seed:tool_call>"),
)
APERTUS_FAMILY = Family(
    "apertus",
    (markup.wrapped("<|tools_prefix|>", "<|tools_suffix|>", markup.name_keyed_json),),
    None,
    ("<|tools_prefix|>", "<|tools_suffix|>"),
)
SOLAR_FAMILY = Family(
    "solar-open",
    (
        markup.wrapped(
            "<|tool_calls|>", "<|calls|>", markup.each("<|tool_call:begin|>", "<|tool_call:end|>", markup.solar_body)
        ),
    ),
    None,
    ("<|tool_calls|>", "<|tool_call:begin|>", "<|tool_call:name|>", "<|tool_call:args|>", "<|tool_call:end|>"),
)
COMMAND_R_PLUS_FAMILY = Family(
    "command-r-plus",
    (markup.wrapped("Action:\n```json", "```", markup.keyed_json("tool_name", "parameters")),),
    None,
)
MINIMAX_M3_FAMILY = Family(
    "minimax-m3",
    (markup.wrapped("<tool_call>", "</tool_call>", elements.minimax_m3_body), markup.layout(elements.MINIMAX_SEP)),
    None,
    ("<tool_call>", "</tool_call>", elements.MINIMAX_SEP),
)
MUSE_FAMILY = Family(
    "muse-glimmer",
    (
        markup.wrapped("<atem:function_calls>", "</atem:function_calls>", elements.invoke_body("atem:")),
        recipients.recipient_header,
        markup.layout("<|eom|>"),
    ),
    None,
    ("<|start|>", "<|message|>", "<|eom|>"),
)
FIREFUNCTION_FAMILY = Family("firefunction-v2", (syntax.marker_then_json(" functools"),), None)
KIMI_K3_FAMILY = Family(
    "kimi-k3",
    (
        markup.wrapped(
            "<|open|>tools<|sep|>",
            "<|close|>tools<|sep|>",
            markup.each('<|open|>call tool="', "<|close|>call<|sep|>", elements.kimi3_body),
        ),
        markup.layout("<|open|>response<|sep|>", "<|close|>response<|sep|>", "<|close|>message<|sep|>"),
    ),
    None,
    ("<|open|>", "<|close|>", "<|sep|>"),
)

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
    KIMI_K2_FAMILY,
    LFM2_FAMILY,
    MINIMAX_M1_FAMILY,
    APRIEL_FAMILY,
    MINIMAX_M2_FAMILY,
    FUNCTIONARY_V32_FAMILY,
    FUNCTIONARY_V31_FAMILY,
    GIGACHAT_V3_FAMILY,
    GIGACHAT_V31_FAMILY,
    COMMAND_R_FAMILY,
    GLM_FAMILY,
    HUNYUAN_FAMILY,
    MINICPM_FAMILY,
    DSML_V32_FAMILY,
    DSML_V4_FAMILY,
    NEMOTRON_FAMILY,
    SEED_FAMILY,
    APERTUS_FAMILY,
    SOLAR_FAMILY,
    FIREFUNCTION_FAMILY,
    KIMI_K3_FAMILY,
    COMMAND_R_PLUS_FAMILY,
    MINIMAX_M3_FAMILY,
    MUSE_FAMILY,
)
