"""Tool calls: the llguidance grammar that makes a call impossible to get
wrong, and the description of the tools for a template that takes none.
How each family writes its calls, and how they are read back, is
`localrun.structured.toolcalls`.

A JSON call is written as ``{"name": NAME, "arguments": ARGS}`` (the key
``arguments`` is ``parameters`` for Llama 3.x) between its family's markers;
a named one as the family's marker, NAME, its separator and ARGS (Mistral's
``[TOOL_CALLS]NAME[ARGS]{...}``, DeepSeek's, Qwen3-Coder's XML parameters).
The grammar constrains NAME to the declared functions and ARGS to that
function's JSON Schema. With ``required`` (or one named function) the reply is
calls from its first token; with ``auto`` it is free text, and once a call's
marker begins, the rest of the call is constrained. A marker that is a special
token of the model's vocabulary is referred to as that token (free text can
never contain it); otherwise it is matched as text.

gpt-oss's harmony calls are messages on a channel of their own, after any
thinking in another: its grammar covers the whole reply, channels, thinking
(its budget included) and all, rather than the answer alone.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Literal

from localrun.errors import InvalidRequestError
from localrun.structured.gemma_args import gemma_rules
from localrun.structured.spec import OutputSpec
from localrun.structured.toolcalls.calls import Call, Function
from localrun.structured.toolcalls.families import GRAMMARS, HARMONY_HEADER, CallFormat
from localrun.structured.toolcalls.values import GEMMA_QUOTE, string_valued

if TYPE_CHECKING:
    from localrun.structured.constraint import Tokenizer

__all__ = ["Call", "Choice", "Function", "takes_tools", "tool_grammar", "tools_prompt"]

Choice = Literal["auto", "required"]

# what models really write whatever their template says: a fenced JSON block
# (Qwen2.5-Coder does); its triggers end at `"name":` so that an ordinary
# JSON code block is left alone
FENCED = CallFormat(
    "fenced",
    each="```json\n",
    after_each="\n```",
    triggers=tuple(
        (f'```{lang}\n{{{space}"name":', " ") for lang in ("json", "") for space in ("", "\n  ", "\n    ", " ", "\n")
    ),
)
# a call object with no marker, at the start of a reply; and the same with
# the doubled brace Qwen2.5's templates show (``{{"name": ...}}``)
BARE = '{"name":'
DOUBLED = '{{"name":'


def takes_tools(template: str | None) -> bool:
    return bool(template) and "tools" in (template or "")


def tools_prompt(functions: list[Function]) -> str:
    """For a template that takes no tools: the system prompt's description of them, in Hermes' words."""
    lines = "\n".join(json.dumps({"type": "function", "function": _declared(f)}, ensure_ascii=False) for f in functions)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
        "\n</tool_call>"
    )


def _declared(f: Function) -> dict[str, Any]:
    return {"name": f.name, "description": f.description, "parameters": f.parameters}


# ---------------------------------------------------------------- grammar --

_MARKER = re.compile(r"(</?\|?[A-Za-z_][\w|.-]*\|?>|\[[A-Z_]+\]|<｜[^｜<>]+｜>|<\|\"\|>)")


# harmony: what ends a message and opens the next of the reply
NEXT_MESSAGE = "<|end|><|start|>assistant"


def _specials(engine: Tokenizer) -> dict[str, int]:
    """The markers this vocabulary holds as one special token each, and their ids."""
    from localrun.structured.constraint import tokenizer_for

    tok = tokenizer_for(engine)
    found = {}
    for fmt in (*GRAMMARS, FENCED):
        texts = (fmt.begin, fmt.each, fmt.name_end, fmt.after_each, fmt.end, *(t for t, _ in fmt.triggers))
        for text in (NEXT_MESSAGE, GEMMA_QUOTE, *texts):
            for mark in _MARKER.findall(text):
                ids = engine.tokenize(mark, add_special=False, parse_special=True)
                if len(ids) == 1 and tok.is_special_token(ids[0]):
                    found[mark] = ids[0]
    return found


def _lark_text(text: str, specials: dict[str, int]) -> str:
    """``text`` as a sequence of lark items: literals, and special tokens by id."""
    items = []
    for part in _MARKER.split(text):
        if not part:
            continue
        items.append(f"<[{specials[part]}]>" if part in specials else json.dumps(part))
    return " ".join(items) or '""'


# JSON inside a call: the layout models write (a space, or a new line and an
# indent), bounded so that a sampled reply cannot wander off into whitespace
ARGS_LAYOUT = {"whitespace_flexible": True, "whitespace_pattern": r"[ ]?|\n {0,16}"}
WS = "/( |\\n {0,16})?/"
EMPTY = '""'


def _grammar_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema the grammar follows: an object's undeclared keys left out
    (as OpenAI's strict mode does; a model otherwise invents parameters), the
    call's layout added."""
    if "properties" in schema and "additionalProperties" not in schema:
        schema = schema | {"additionalProperties": False}
    return schema | {"x-guidance": ARGS_LAYOUT | dict(schema.get("x-guidance") or {})}


def _compile_args(name: str, schema: dict[str, Any], *, check: bool = True) -> str:
    """A schema for an inline %json, checked: one that cannot be used is a 400 naming its function."""
    import llguidance

    from localrun.errors import UsageError
    from localrun.structured.spec import _check_schema

    grammar_schema = _grammar_schema(schema)
    try:
        if check:
            _check_schema(schema, f"the parameters of function {name!r}")
        llguidance.LLMatcher.grammar_from_json_schema(grammar_schema)
    except (UsageError, ValueError) as exc:
        message = exc.message if isinstance(exc, UsageError) else f"function {name!r}: cannot be used: {exc}"
        raise InvalidRequestError(message, "tools") from None
    return json.dumps(grammar_schema, ensure_ascii=False)


def _xml_args(f: Function, rule: str) -> list[str]:
    """Qwen3-Coder's parameters for ``f``: each ``<parameter=P>\nVALUE\n</parameter>\n``
    in the schema's order, the required ones always; a string's VALUE is any
    text up to the closing tag, any other VALUE is JSON of its schema."""
    _compile_args(f.name, f.parameters)
    properties = f.parameters.get("properties") or {}
    required = set(f.parameters.get("required") or [])
    close = "\n</parameter>\n"
    rules: list[str] = []
    parts: list[str] = []
    for k, (key, schema) in enumerate(properties.items()):
        opening = json.dumps(f"<parameter={key}>\n")
        value = _parameter_value(f, f"{rule}_p{k}", schema, string_valued(schema), close, rules)
        parts.append(f"({opening} {value})" + ("" if key in required else "?"))
    rules.append(f"{rule}: {' '.join(parts) or EMPTY}")
    return rules


def _parameter_value(
    f: Function,
    name: str,
    schema: Any,
    text: bool,
    close: str,
    rules: list[str],
    *,
    close_lark: str | None = None,
    token: bool = False,
) -> str:
    """A tagged parameter's value and its closing tag ``close``, as a lark
    expression (any rule it needs, named ``name``, added to ``rules``): one of a
    text's ``enum``, any text up to the tag (``token``: the tag is a special
    token, which text never holds), or JSON of ``schema``. ``close_lark``: the
    tag as lark writes it (default: its literal text)."""
    closing = close_lark if close_lark is not None else json.dumps(close)
    if text and "enum" in schema:
        return "(" + " | ".join(json.dumps(v) for v in schema["enum"]) + f") {closing}"
    if text:
        least, most = schema.get("minLength", 0), schema.get("maxLength", "")
        if token:
            rules.append(f"{name}: /(.|\\n){{{least},{most}}}/ {closing}")
        else:
            rules.append(f"{name}[lazy]: /(.|\\n){{{least},{most}}}{_regex(close)}/")
        return name
    rules.append(f"{name}: %json {_compile_args(f.name, schema, check=False)}")
    return f"{name} {closing}"


def _pair_args(f: Function, rule: str, specials: dict[str, int]) -> list[str]:
    """GLM's parameters for ``f``: each ``<arg_key>P</arg_key><arg_value>VALUE</arg_value>``
    (a new line before each tag or not, as GLM's templates differ) in the
    schema's order, the required ones always; a string's VALUE is any text up
    to the closing tag, any other VALUE is JSON of its schema."""
    _compile_args(f.name, f.parameters)
    properties = f.parameters.get("properties") or {}
    required = set(f.parameters.get("required") or [])
    nl = '"\\n"?'
    key_open, key_close = _lark_text("<arg_key>", specials), _lark_text("</arg_key>", specials)
    value_open, value_close = _lark_text("<arg_value>", specials), _lark_text("</arg_value>", specials)
    rules: list[str] = []
    parts: list[str] = []
    for k, (key, schema) in enumerate(properties.items()):
        opening = f"{nl} {key_open} {json.dumps(key)} {key_close} {nl} {value_open}"
        token = "</arg_value>" in specials  # text never holds the token: the text runs up to it
        value = _parameter_value(
            f, f"{rule}_p{k}", schema, string_valued(schema), "</arg_value>", rules, close_lark=value_close, token=token
        )
        parts.append(f"({opening} {value})" + ("" if key in required else "?"))
    rules.append(f"{rule}: {' '.join(parts)} {nl}")
    return rules


def _invoke_args(f: Function, rule: str, fmt: CallFormat) -> list[str]:
    """``<parameter name="P">VALUE</parameter>`` for each of ``f``'s parameters
    (MiniMax M2; DeepSeek V3.2's tags prefixed, with ``string="true"`` on a
    text value), a new line before each or not, in the schema's order, the
    required ones always; a string's VALUE is any text up to the closing
    tag, any other VALUE is JSON of its schema."""
    _compile_args(f.name, f.parameters)
    properties = f.parameters.get("properties") or {}
    required = set(f.parameters.get("required") or [])
    close = f"</{fmt.tag}parameter>"
    nl = '"\\n"?'
    rules: list[str] = []
    parts: list[str] = []
    for k, (key, schema) in enumerate(properties.items()):
        text = string_valued(schema)
        attr = (' string="true"' if text else ' string="false"') if fmt.typed_attr else ""
        head = f'<{fmt.tag}parameter name="{key}"{attr}>'
        opening = f"{nl} {json.dumps(head)}"
        value = _parameter_value(f, f"{rule}_p{k}", schema, text, close, rules)
        parts.append(f"({opening} {value})" + ("" if key in required else "?"))
    rules.append(f"{rule}: {' '.join(parts)} {nl}")
    return rules


def _call_rules(fmt: CallFormat, functions: list[Function], specials: dict[str, int], tag: str) -> list[str]:
    """Rules for one call of ``fmt`` from its name on (rule ``{tag}_rest``)."""
    choices = []
    rules = []
    for i, f in enumerate(functions):
        if fmt.args == "xml":
            rules += _xml_args(f, f"{tag}_a{i}")
        elif fmt.args == "invoke":
            rules += _invoke_args(f, f"{tag}_a{i}", fmt)
        elif fmt.args == "pairs":
            rules += _pair_args(f, f"{tag}_a{i}", specials)
        elif fmt.args == "gemma":
            _compile_args(f.name, f.parameters)
            quote = _lark_text(GEMMA_QUOTE, specials)
            rules += gemma_rules(f.parameters, f"{tag}_a{i}", quote, quote_is_token=GEMMA_QUOTE in specials)
        else:
            rules.append(f"{tag}_a{i}: %json {_compile_args(f.name, f.parameters)}")
        if fmt.shape == "json":
            name = f"{json.dumps(json.dumps(f.name) + ',')} {WS} {json.dumps(json.dumps(fmt.key) + ': ')}"
        else:
            number = ' ":" /[0-9]{1,3}/' if fmt.numbered else ""
            name = f"{json.dumps(f.name)}{number} {_lark_text(fmt.name_end, specials)}"
        choices.append(f"{name} {tag}_a{i}")
    close = f'{WS} "}}" ' if fmt.shape == "json" else ""
    rules.append(f"{tag}_rest: ({' | '.join(choices)}) {close}{_lark_text(fmt.after_each, specials)}")
    rules.append(f"{tag}_call: {_lark_text(fmt.opening, specials)} {tag}_rest")
    return rules


def tool_grammar(
    engine: Tokenizer,
    functions: list[Function],
    fmt: CallFormat,
    choice: Choice,
    *,
    parallel: bool = True,
    budget: int | None = None,
) -> OutputSpec:
    """The constraint for a reply: calls only (``required``), or free text
    whose calls are constrained once their marker begins (``auto``).
    ``budget``: the thinking's tokens, where the grammar covers the thinking
    too (harmony's channels)."""
    import llguidance

    from localrun.structured.spec import _compiled

    specials = _specials(engine)
    rules = ["%llguidance {}", "TEXT: /(.|\\n)*/"]
    rules += _call_rules(fmt, functions, specials, "c")
    if fmt.channels:
        rules += _call_rules(HARMONY_HEADER, functions, specials, "d")  # the recipient in the role header
        rules[1:1] = _channel_rules(choice, specials, budget)
        grammar = llguidance.LLMatcher.grammar_from_lark("\n".join(rules))
        return OutputSpec("grammar", _compiled(grammar, "tools"), None, "tools", whole=True)
    more = f"({_lark_text(fmt.between, specials)} c_call)*" if parallel else ""
    calls = f"{_lark_text(fmt.begin, specials)} c_call {more} {_lark_text(fmt.end, specials)}"
    if choice == "required":
        rules.insert(1, f"start: {calls}")
    else:
        # plain text may not start the way a call does: with the family's
        # leading marker, or with a bare call object (what small models write)
        text = "([^{\\[<](.|\\n)*)?" if fmt.leading else _not_starting((BARE, DOUBLED))
        rules[1] = f"TEXT: /{text}/"
        alternatives = [calls] if fmt.leading else []
        # a fenced block or bare object naming an undeclared function is text
        rules.append(f'OTHER: /"{_not_named([f.name for f in functions])}"(.|\\n)*/')
        if not fmt.leading:
            rules += _call_rules(CallFormat("bare", key=fmt.key), functions, specials, "b")
            bare_more = ' ("\\n" b_call)*' if parallel else ""
            alternatives.append(f"{json.dumps(BARE + ' ')} (b_rest{bare_more} | OTHER)")
            alternatives.append(f'{json.dumps(DOUBLED + " ")} (b_rest "}}" | OTHER)')
        for k, (trigger, rest) in enumerate(fmt.triggers):
            rules.append(_trigger_rule(f"t{k}", trigger, specials, text))
            alternatives.append(f"t{k} {_lark_text(rest, specials)} c_rest {more} {_lark_text(fmt.end, specials)}")
        rules += _call_rules(FENCED, functions, specials, "f")
        for k, (trigger, rest) in enumerate(FENCED.triggers):
            rules.append(_trigger_rule(f"ft{k}", trigger, specials, text))
            alternatives.append(f"ft{k} {_lark_text(rest, specials)} (f_rest | OTHER)")
        rules.insert(1, f"start: TEXT | {' | '.join(alternatives)}")
    grammar = llguidance.LLMatcher.grammar_from_lark("\n".join(rules))
    return OutputSpec("grammar", _compiled(grammar, "tools"), None, "tools")


def _channel_rules(choice: Choice, specials: dict[str, int], budget: int | None) -> list[str]:
    """Harmony's whole reply: messages on channels, each after the header
    ``<|channel|>NAME<|message|>``, the next one opened by
    ``<|end|><|start|>assistant``. With ``required``, at most one analysis
    message (the thinking, ``budget`` tokens at most: then its end and the
    call's header are forced), then the call; with ``auto``, any messages,
    then a call or the final answer. A call (``c_call``, or ``d_call`` with
    its recipient in the role header, as the chat template renders past
    calls) is constrained from its ``to=functions.`` on."""
    channel, message = _lark_text("<|channel|>", specials), _lark_text("<|message|>", specials)
    after = _lark_text(NEXT_MESSAGE, specials)
    limit = f"[max_tokens={budget}]" if budget is not None else ""
    rules = [
        f'h_think: {channel} "analysis" {message} h_text {after}',
        f"h_text{limit}: /(.|\\n)*/",
    ]
    if choice == "required":
        return ["start: h_think? (c_call | d_call)", *rules]
    return [
        "start: (h_think | h_note)* (c_call | d_call | h_final)",
        *rules,
        f'h_note: {channel} "commentary" {message} TEXT {after}',
        f'h_final: {channel} "final" {message} TEXT',
    ]


def _regex(text: str) -> str:
    """``text`` matched literally, inside a lark /regex/."""
    return re.escape(text).replace("\\\n", "\\n").replace("/", "\\/")


def _not_starting(prefixes: tuple[str, ...]) -> str:
    """A regex for any text that starts with none of ``prefixes``."""
    trie: dict[str, Any] = {}
    for prefix in prefixes:
        node = trie
        for c in prefix:
            node = node.setdefault(c, {})
        node[""] = {}

    def below(node: dict[str, Any]) -> str:
        chars = "".join(_regex(c) for c in node)
        options = ["", f"[^{chars}](.|\\n)*"]
        options += [_regex(c) + below(child) for c, child in node.items() if "" not in child]
        return "(" + "|".join(options) + ")"

    return below(trie)


def _not_named(names: list[str]) -> str:
    """A regex for a JSON string's content that is none of ``names``."""
    trie: dict[str, Any] = {}
    for name in names:
        node = trie
        for c in name:
            node = node.setdefault(c, {})
        node[""] = {}

    def below(node: dict[str, Any]) -> str:
        chars = "".join(_regex(c) for c in node if c)
        options = [f'[^"\\\\{chars}]([^"\\\\]|\\\\.)*', *(_regex(c) + below(child) for c, child in node.items() if c)]
        if "" not in node:
            options.append("")
        return "(" + "|".join(options) + ")"

    return below(trie)


def _trigger_rule(name: str, trigger: str, specials: dict[str, int], text: str) -> str:
    if trigger in specials:
        return f"{name}: TEXT <[{specials[trigger]}]>"
    return f"{name}[lazy]: /{text}{_regex(trigger)}/"
