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
    after it up to the function's name (its id, where it has one).
    ``leading``: calls can only open the reply (their marker renders as
    nothing, or the reply is one message: Functionary v3.2's, Muse's)."""

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
    name_end: str = ""  # ``{name}`` in it is the function's name again (Muse names it in its header and its invoke)
    quoted: bool = False  # a named call's NAME is a JSON string (Apertus, Command R)
    # a regex: the call's id, written after ``each`` and then ``id_end``, before the name (Solar Open, Command R)
    call_id: str = ""
    id_end: str = ""
    index: str = ""  # what follows the name before the call's number (Kimi K2 ``:``, Kimi K3 `` index="``)
    channels: bool = False  # harmony: the calls are messages on channels, after any thinking in its own
    # the arguments' notation: JSON, each its own ``<parameter=KEY>`` element (Qwen3-Coder, Seed-OSS),
    # ``<arg_key>``/``<arg_value>`` pairs (GLM, Hunyuan), ``<invoke>`` parameters (MiniMax M2, DeepSeek V3.2,
    # MiniCPM, Muse), Gemma 4's, Python keyword arguments (LFM2), Kimi K3's typed ``argument`` elements, or
    # one element per argument, an object's fields elements too (MiniMax M3)
    args: Literal["json", "xml", "pairs", "invoke", "gemma", "python", "kimi3", "elements"] = "json"
    # what an ``invoke`` format's tags begin with (DeepSeek V3.2's DSML marker, Muse's ``atem:``),
    # what a ``pairs`` format's end with (Hunyuan's ``:opensource``)
    tag: str = ""
    param: str = "parameter"  # an ``invoke`` format's parameter element (MiniCPM's ``param``)
    typed_attr: bool = False  # an ``invoke`` parameter says whether its value is text (``string="true"``)
    value_lines: bool = True  # an ``xml`` value on lines of its own (Qwen3-Coder; Seed-OSS's sits in its tags)
    # the reply's text (``auto``) opens with ``text_open`` (Functionary v3.2's ``all``, Muse's message to the
    # user, Kimi K3's response), and where ``text_close`` closes it the calls follow it (Kimi K3, GigaChat 3),
    # and ``reply_end`` may end the reply
    text_open: str = ""
    text_close: str = ""
    reply_end: str = ""
    # messages a reply (``auto``) may open with, before its text or its calls: each the first text, any
    # text, the second (Muse's messages to itself, its thinking)
    notes: tuple[str, str] = ("", "")

    @property
    def opening(self) -> str:
        """What precedes a call's name (or its id): its marker, and for JSON the object's start."""
        return self.each + ('{"name": ' if self.shape == "json" else "")

    @property
    def texts(self) -> tuple[str, ...]:
        """Every text the grammar writes as it is, its markers among them."""
        args = {
            "pairs": tuple(f"<{t}{self.tag}>" for t in ("arg_key", "/arg_key", "arg_value", "/arg_value")),
            "invoke": (f"</{self.tag}{self.param}>",),
            "kimi3": (KIMI3_ARGUMENT[1],),
            "elements": (MINIMAX_SEP,),
        }.get(self.args, ())
        fields = (self.begin, self.each, self.between, self.after_each, self.end, self.id_end, self.name_end)
        texts = (self.text_open, self.text_close, self.reply_end, *self.notes)
        return (*fields, *texts, *(t for t, _ in self.triggers), *args)


# Kimi K3's argument element, its key and its type (``string``, ``number``, ...) in its opening
KIMI3_ARGUMENT = ('<|open|>argument key="{key}" type="{type}"<|sep|>', "<|close|>argument<|sep|>")
MINIMAX_SEP = elements.MINIMAX_SEP


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
    index=":",
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
        # each call's new line after it, not before the next: the end's would start as the next call's does
        after_each=f"</{mark[1:]}invoke>\n",
        between="",
        end=f"</{mark[1:]}{block}>",
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
# LFM2: ``<|tool_call_start|>[get_weather(city='Lisbon', days=3), get_time(tz='UTC')]<|tool_call_end|>``
LFM2 = CallFormat(
    "lfm2",
    begin="<|tool_call_start|>[",
    between=", ",
    after_each=")",
    end="]<|tool_call_end|>",
    shape="named",
    name_end="(",
    triggers=(("<|tool_call_start|>", "["),),
    args="python",
)
# Command R7B, Command A: ``<|START_ACTION|>[{"tool_call_id": "0", "tool_name": NAME,
# "parameters": ARGS}, ...]<|END_ACTION|>``
COMMAND_R = CallFormat(
    "command-r",
    begin="<|START_ACTION|>[\n    ",
    each='{"tool_call_id": "',
    call_id="[0-9]{1,3}",
    id_end='", "tool_name": ',
    between=",\n    ",
    after_each="}",
    end="\n]<|END_ACTION|>",
    shape="named",
    quoted=True,
    name_end=', "parameters": ',
    triggers=(("<|START_ACTION|>", '[\n    {"tool_call_id": "'),),
)
# Command R+: ``Action:`` and a fenced JSON list of ``{"tool_name": NAME, "parameters": ARGS}``,
# laid out as its template lays it out
COMMAND_R_PLUS = CallFormat(
    "command-r-plus",
    begin="Action:\n```json\n[\n    ",
    each='{\n        "tool_name": ',
    between=",\n    ",
    after_each="\n    }",
    end="\n]```",
    shape="named",
    quoted=True,
    name_end=',\n        "parameters": ',
    triggers=(("Action:\n```json", '\n[\n    {\n        "tool_name": '),),
)
# Seed-OSS: Qwen3-Coder's elements in ``<seed:tool_call>``, each value inside its tags
SEED = CallFormat(
    "seed-oss",
    each="<seed:tool_call>\n<function=",
    after_each="</function>\n</seed:tool_call>",
    shape="named",
    name_end=">\n",
    triggers=(("<seed:tool_call>", "\n<function="),),
    args="xml",
    value_lines=False,
)
# Hunyuan: GLM's pairs, its tags ending in ``:opensource``, the calls in ``<tool_calls:opensource>``
HUNYUAN = CallFormat(
    "hunyuan",
    begin="<tool_calls:opensource>\n",
    each="<tool_call:opensource>",
    after_each="</tool_call:opensource>",
    end="\n</tool_calls:opensource>",
    shape="named",
    name_end="<tool_sep:opensource>",
    triggers=(("<tool_calls:opensource>", "\n<tool_call:opensource>"),),
    args="pairs",
    tag=":opensource",
)
# MiniCPM: ``<function name="NAME"><param name="KEY">VALUE</param>...</function>``
MINICPM = CallFormat(
    "minicpm",
    each='<function name="',
    after_each="</function>",
    shape="named",
    name_end='">',
    triggers=(('<function name="', ""),),
    args="invoke",
    param="param",
)
# Solar Open: ``<|tool_calls|><|tool_call:begin|>ID<|tool_call:name|>NAME<|tool_call:args|>{...}<|tool_call:end|>``
SOLAR = CallFormat(
    "solar-open",
    begin="<|tool_calls|>",
    each="<|tool_call:begin|>",
    call_id="[A-Za-z0-9_.\\-]{1,40}",
    id_end="<|tool_call:name|>",
    between="",
    after_each="<|tool_call:end|>",
    shape="named",
    name_end="<|tool_call:args|>",
    triggers=(("<|tool_calls|>", "<|tool_call:begin|>"),),
)
# Apertus: ``<|tools_prefix|>[{"NAME": {...}}, ...]<|tools_suffix|>``
APERTUS = CallFormat(
    "apertus",
    begin="<|tools_prefix|>[",
    each="{",
    between=", ",
    after_each="}",
    end="]<|tools_suffix|>",
    shape="named",
    quoted=True,
    name_end=": ",
    triggers=(("<|tools_prefix|>", "[{"),),
)
# FireFunction v2: `` functools[{"name": ..., "arguments": {...}}, ...]``
FIREFUNCTION = CallFormat(
    "firefunction-v2", begin=" functools[", between=", ", end="]", triggers=((" functools[", '{"name": '),)
)
# GigaChat 3: its text's message, then a message of the role ``function call``: the call's JSON
GIGACHAT_V3 = CallFormat("gigachat-v3", each="\n\nfunction call<|role_sep|>\n", text_close="<|message_sep|>")
# Functionary v3.2: messages each after ``>>>`` (the generation prompt writes the first), a function's
# name and its JSON arguments, or ``all`` and text to the user
FUNCTIONARY_V32 = CallFormat(
    "functionary-v3.2",
    between=">>>",
    shape="named",
    name_end="\n",
    leading=True,
    triggers=((">>>", ""),),
    text_open="all\n",
)
# Muse Glimmer: each call a message to its function, ``<atem:invoke>`` in it; text a message to the user
MUSE = CallFormat(
    "muse-glimmer",
    each=" to=",
    between="<|eom|><|start|>assistant",
    after_each="</atem:invoke>\n</atem:function_calls>",
    shape="named",
    name_end='<|message|><atem:function_calls>\n<atem:invoke name="{name}">',
    leading=True,
    args="invoke",
    tag="atem:",
    text_open=" to=user<|message|>",
    notes=(" to=self<|message|>", "<|eom|><|start|>assistant"),
)
# Kimi K3: the response (text), then ``<|open|>tools<|sep|>`` and each
# ``<|open|>call tool="NAME" index="N"<|sep|>`` with its typed arguments
KIMI_K3 = CallFormat(
    "kimi-k3",
    begin="<|open|>tools<|sep|>",
    each='<|open|>call tool="',
    between="",
    after_each="<|close|>call<|sep|>",
    end="<|close|>tools<|sep|>",
    shape="named",
    index='" index="',
    name_end='"<|sep|>',
    args="kimi3",
    text_open="<|open|>response<|sep|>",
    text_close="<|close|>response<|sep|>",
    reply_end="<|close|>message<|sep|>",
)
# MiniMax M3: ``<invoke name="NAME">`` with each argument an element, every tag after its separator token
MINIMAX_M3 = CallFormat(
    "minimax-m3",
    begin=f"{MINIMAX_SEP}<tool_call>\n",
    each=f'{MINIMAX_SEP}<invoke name="',
    between="",
    after_each=f"{MINIMAX_SEP}</invoke>\n",
    end=f"{MINIMAX_SEP}</tool_call>",
    shape="named",
    name_end='">',
    triggers=((f"{MINIMAX_SEP}<tool_call>", f'\n{MINIMAX_SEP}<invoke name="'),),
    args="elements",
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
    LFM2,
    COMMAND_R,
    COMMAND_R_PLUS,
    SEED,
    HUNYUAN,
    MINICPM,
    SOLAR,
    APERTUS,
    FIREFUNCTION,
    GIGACHAT_V3,
    FUNCTIONARY_V32,
    MUSE,
    KIMI_K3,
    MINIMAX_M3,
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
    (
        markup.wrapped(
            "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", markup.kimi_body, "<|tool_call_end|>"
        ),
    ),
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
    (markup.wrapped("<|tool_call_start|>", "<|tool_call_end|>", markup.python_list_body, ")"),),
    LFM2,
    ("<|tool_call_start|>", "<|tool_call_end|>"),
)
_TOOL_CALLS = markup.wrapped("<tool_calls>", "</tool_calls>", markup.json_calls_body, "}")
MINIMAX_M1_FAMILY = Family("minimax-m1", (_TOOL_CALLS,), TOOL_CALLS_LINES, ("<tool_calls>", "</tool_calls>"))
APRIEL_FAMILY = Family("apriel", (_TOOL_CALLS,), TOOL_CALLS_LIST, ("<tool_calls>", "</tool_calls>"))
MINIMAX_M2_FAMILY = Family(
    "minimax-m2",
    (markup.wrapped("<minimax:tool_call>", "</minimax:tool_call>", elements.invoke_body(""), "</invoke>"),),
    MINIMAX_M2,
    ("<minimax:tool_call>", "</minimax:tool_call>"),
)
FUNCTIONARY_V32_FAMILY = Family("functionary-v3.2", (recipients.functionary,), FUNCTIONARY_V32, (">>>",))
FUNCTIONARY_V31_FAMILY = Family(
    "functionary-v3.1",
    (markup.wrapped("<function=", "</function>", markup.named_json_body), syntax.marker_then_json("<|python_tag|>")),
    FUNCTIONARY_V31,
    ("<|python_tag|>",),
)
GIGACHAT_V3_FAMILY = Family(
    "gigachat-v3",
    (syntax.marker_then_json("<|message_sep|>\n\nfunction call<|role_sep|>"),),
    GIGACHAT_V3,
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
    (markup.wrapped("<|START_ACTION|>", "<|END_ACTION|>", markup.keyed_json("tool_name", "parameters"), "}"),),
    COMMAND_R,
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
            "</tool_call:opensource>",
        ),
    ),
    HUNYUAN,
    tuple(f"<{tag}:opensource>" for tag in ("tool_calls", "/tool_calls", "tool_call", "/tool_call", "tool_sep")),
)
MINICPM_FAMILY = Family("minicpm", (markup.wrapped('<function name="', "</function>", elements.param_body),), MINICPM)
DSML_V32_FAMILY = Family(
    "deepseek-v3.2",
    (
        markup.wrapped(
            "<｜DSML｜function_calls>",
            "</｜DSML｜function_calls>",
            elements.invoke_body("｜DSML｜"),
            "</｜DSML｜invoke>",
        ),
    ),
    DSML_V32,
)
DSML_V4_FAMILY = Family(
    "deepseek-v4",
    (
        markup.wrapped(
            "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", elements.invoke_body("｜DSML｜"), "</｜DSML｜invoke>"
        ),
    ),
    DSML_V4,
)
NEMOTRON_FAMILY = Family(
    "nemotron-v2",
    (markup.wrapped("<TOOLCALL>", "</TOOLCALL>", markup.json_calls_body, "}"),),
    NEMOTRON,
    ("<TOOLCALL>", "</TOOLCALL>"),
)
SEED_FAMILY = Family(
    "seed-oss",
    (markup.wrapped("<seed:tool_call>", "</seed:tool_call>", elements.seed_body),),
    SEED,
    ("<seed:tool_call>", "</seed:tool_call>"),
)
APERTUS_FAMILY = Family(
    "apertus",
    (markup.wrapped("<|tools_prefix|>", "<|tools_suffix|>", markup.name_keyed_json, "}"),),
    APERTUS,
    ("<|tools_prefix|>", "<|tools_suffix|>"),
)
SOLAR_FAMILY = Family(
    "solar-open",
    (
        markup.wrapped(
            "<|tool_calls|>",
            "<|calls|>",
            markup.each("<|tool_call:begin|>", "<|tool_call:end|>", markup.solar_body),
            "<|tool_call:end|>",
        ),
    ),
    SOLAR,
    ("<|tool_calls|>", "<|tool_call:begin|>", "<|tool_call:name|>", "<|tool_call:args|>", "<|tool_call:end|>"),
)
COMMAND_R_PLUS_FAMILY = Family(
    "command-r-plus",
    (markup.wrapped("Action:\n```json", "```", markup.keyed_json("tool_name", "parameters"), "}"),),
    COMMAND_R_PLUS,
)
MINIMAX_M3_FAMILY = Family(
    "minimax-m3",
    (
        markup.wrapped("<tool_call>", "</tool_call>", elements.minimax_m3_body, "</invoke>"),
        markup.layout(elements.MINIMAX_SEP),
    ),
    MINIMAX_M3,
    ("<tool_call>", "</tool_call>", elements.MINIMAX_SEP),
)
MUSE_FAMILY = Family(
    "muse-glimmer",
    (
        markup.wrapped(
            "<atem:function_calls>", "</atem:function_calls>", elements.invoke_body("atem:"), "</atem:invoke>"
        ),
        recipients.recipient_header,
        markup.layout("<|eom|>"),
    ),
    MUSE,
    ("<|start|>", "<|message|>", "<|eom|>"),
)
FIREFUNCTION_FAMILY = Family("firefunction-v2", (syntax.marker_then_json(" functools"),), FIREFUNCTION)
KIMI_K3_FAMILY = Family(
    "kimi-k3",
    (
        markup.wrapped(
            "<|open|>tools<|sep|>",
            "<|close|>tools<|sep|>",
            markup.each('<|open|>call tool="', "<|close|>call<|sep|>", elements.kimi3_body),
            "<|close|>call<|sep|>",
        ),
        markup.layout("<|open|>response<|sep|>", "<|close|>response<|sep|>", "<|close|>message<|sep|>"),
    ),
    KIMI_K3,
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
