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
marker begins, the rest of the call is constrained; where a family's text has
a place of its own (Functionary v3.2's and Muse's message to the user, Kimi
K3's response section), it is free there, the calls after it or instead of
it. A marker that is a special token of the model's vocabulary is referred
to as that token (free text can never contain it); otherwise it is matched
as text.

gpt-oss's harmony calls are messages on a channel of their own, after any
thinking in another: its grammar covers the whole reply, channels, thinking
(its budget included) and all, rather than the answer alone.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from localrun.errors import InvalidRequestError
from localrun.structured.gemma_args import gemma_rules, separated
from localrun.structured.spec import OutputSpec
from localrun.structured.toolcalls.calls import Call, Function
from localrun.structured.toolcalls.families import GRAMMARS, HARMONY_HEADER, KIMI3_ARGUMENT, MINIMAX_SEP, CallFormat
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

_MARKER = re.compile(rf"(</?\|?[A-Za-z_][\w|.:-]*\|?>|\[[A-Z_]+\]|<｜[^｜<>]+｜>|<\|\"\|>|{re.escape(MINIMAX_SEP)})")


# harmony: what ends a message and opens the next of the reply
NEXT_MESSAGE = "<|end|><|start|>assistant"


_SPECIALS: weakref.WeakKeyDictionary[Any, dict[str, int]] = weakref.WeakKeyDictionary()


def _specials(engine: Tokenizer) -> dict[str, int]:
    """The markers this vocabulary holds as one special token each, and their ids (found once per vocabulary)."""
    known = _SPECIALS.get(engine)
    if known is not None:
        return known
    found = {}
    for fmt in (*GRAMMARS, FENCED):
        for text in (NEXT_MESSAGE, GEMMA_QUOTE, *fmt.texts):
            for mark in _MARKER.findall(text):
                ids = engine.tokenize(mark, add_special=False, parse_special=True)
                if len(ids) == 1 and engine.is_special(ids[0]):
                    found[mark] = ids[0]
    _SPECIALS[engine] = found
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


def _tagged_args(
    f: Function,
    rule: str,
    schema: dict[str, Any],
    head: Callable[[str, Any], str],
    close: Callable[[str], str],
    specials: dict[str, int],
    *,
    lines: bool = True,
    nested: bool = False,
) -> list[str]:
    """The parameters of ``schema`` (``f``'s, or an object's inside them) each
    a tagged value: ``head(KEY, its schema)`` (a lark expression), VALUE and
    ``close(KEY)`` (text), in the schema's order, the required ones always, a
    new line before each and after the last or not (``lines``). A string's
    VALUE is any text up to its closing tag, any other VALUE is JSON of its
    schema; ``nested``: an object's VALUE is its own fields so tagged, an
    array's its ``item`` elements (MiniMax M3)."""
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    nl = '"\\n"?' if lines else ""
    rules: list[str] = []
    parts: list[str] = []
    for k, (key, sub) in enumerate(properties.items()):
        value = _tagged_value(
            f, f"{rule}_p{k}", sub, close(key), specials, rules, nested=nested, head=head, close=close
        )
        parts.append(f"({nl} {head(key, sub)} {value})" + ("" if key in required else "?"))
    rules.append(f"{rule}: {' '.join(parts) or EMPTY} {nl}".rstrip())
    return rules


def _tagged_value(
    f: Function,
    name: str,
    schema: Any,
    closing: str,
    specials: dict[str, int],
    rules: list[str],
    *,
    nested: bool,
    head: Callable[[str, Any], str],
    close: Callable[[str], str],
) -> str:
    """One tagged parameter's value and its closing tag ``closing``, as a lark
    expression (its rules, named ``name``, added to ``rules``)."""
    close_lark = _lark_text(closing, specials)
    if nested and isinstance(schema, dict) and schema.get("properties"):
        rules += _tagged_args(f, name, schema, head, close, specials, lines=False, nested=True)
        return f"{name} {close_lark}"
    if nested and isinstance(schema, dict) and schema.get("type") == "array" and "items" in schema:
        item = _tagged_value(
            f, f"{name}_i", schema["items"], close("item"), specials, rules, nested=True, head=head, close=close
        )
        rules.append(f"{name}: ({head('item', schema['items'])} {item})*")
        return f"{name} {close_lark}"
    token = (parts := [p for p in _MARKER.split(closing) if p]) != [] and parts[0] in specials
    return _parameter_value(f, name, schema, string_valued(schema), closing, rules, close_lark=close_lark, token=token)


def _xml_args(f: Function, rule: str, fmt: CallFormat, specials: dict[str, int]) -> list[str]:
    """Qwen3-Coder's ``<parameter=KEY>\\nVALUE\\n</parameter>\\n``, Seed-OSS's without the value's lines."""
    pad = "\n" if fmt.value_lines else ""
    return _tagged_args(
        f,
        rule,
        f.parameters,
        lambda key, _: json.dumps(f"<parameter={key}>{pad}"),
        lambda _: f"{pad}</parameter>\n",
        specials,
        lines=False,
    )


def _invoke_args(f: Function, rule: str, fmt: CallFormat, specials: dict[str, int]) -> list[str]:
    """``<parameter name="KEY">VALUE</parameter>`` (MiniMax M2; DeepSeek V3.2's
    and Muse's tags prefixed, DeepSeek's with ``string="true"`` on a text
    value; MiniCPM's ``param``)."""

    def head(key: str, schema: Any) -> str:
        attr = (' string="true"' if string_valued(schema) else ' string="false"') if fmt.typed_attr else ""
        return json.dumps(f'<{fmt.tag}{fmt.param} name="{key}"{attr}>')

    return _tagged_args(f, rule, f.parameters, head, lambda _: f"</{fmt.tag}{fmt.param}>", specials)


def _pair_args(f: Function, rule: str, fmt: CallFormat, specials: dict[str, int]) -> list[str]:
    """GLM's ``<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>``, a new line
    before each tag or not (GLM's templates differ); Hunyuan's tags suffixed."""
    key_open, key_close = (_lark_text(f"<{t}{fmt.tag}>", specials) for t in ("arg_key", "/arg_key"))
    value_open = _lark_text(f"<arg_value{fmt.tag}>", specials)

    def head(key: str, _: Any) -> str:
        return f'{key_open} {json.dumps(key)} {key_close} "\\n"? {value_open}'

    return _tagged_args(f, rule, f.parameters, head, lambda _: f"</arg_value{fmt.tag}>", specials)


def _kimi3_args(f: Function, rule: str, fmt: CallFormat, specials: dict[str, int]) -> list[str]:
    """Kimi K3's ``<|open|>argument key="KEY" type="TYPE"<|sep|>VALUE<|close|>argument<|sep|>``."""

    def head(key: str, schema: Any) -> str:
        before, after = KIMI3_ARGUMENT[0].replace("{key}", key).split("{type}")
        return f"{_lark_text(before, specials)} {_kimi3_type(schema)} {_lark_text(after, specials)}"

    return _tagged_args(f, rule, f.parameters, head, lambda _: KIMI3_ARGUMENT[1], specials, lines=False)


def _element_args(f: Function, rule: str, fmt: CallFormat, specials: dict[str, int]) -> list[str]:
    """MiniMax M3's ``<KEY>VALUE</KEY>``, each tag after its separator, an object's fields elements too."""
    return _tagged_args(
        f,
        rule,
        f.parameters,
        lambda key, _: _lark_text(f"{MINIMAX_SEP}<{key}>", specials),
        lambda key: f"{MINIMAX_SEP}</{key}>",
        specials,
        lines=False,
        nested=True,
    )


def _gemma_args(f: Function, rule: str, fmt: CallFormat, specials: dict[str, int]) -> list[str]:
    quote = _lark_text(GEMMA_QUOTE, specials)
    return gemma_rules(f.parameters, rule, quote, quote_is_token=GEMMA_QUOTE in specials)


def _json_args(f: Function, rule: str, fmt: CallFormat, specials: dict[str, int]) -> list[str]:
    return [f"{rule}: %json {_compile_args(f.name, f.parameters)}"]


ARGS: dict[str, Callable[[Function, str, CallFormat, dict[str, int]], list[str]]] = {
    "json": _json_args,
    "xml": _xml_args,
    "invoke": _invoke_args,
    "pairs": _pair_args,
    "kimi3": _kimi3_args,
    "elements": _element_args,
    "gemma": _gemma_args,
    "python": lambda f, rule, fmt, specials: _python_args(f, rule),
}


# the type Kimi K3 names in an argument's opening, by the value's JSON type
_KIMI3_TYPES = {"integer": "number", "number": "number", "boolean": "boolean", "null": "null"}
_KIMI3_TYPES |= {"object": "object", "array": "array"}


def _kimi3_type(schema: Any) -> str:
    """The ``type`` of a Kimi K3 argument of ``schema``: ``string`` for text, else its JSON type's."""
    if string_valued(schema):
        return '"string"'
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, str) and kind in _KIMI3_TYPES:
        return json.dumps(_KIMI3_TYPES[kind])
    return "(" + " | ".join(json.dumps(t) for t in sorted(set(_KIMI3_TYPES.values()))) + ")"


# a character of a Python string in single quotes, as a lark regex: any but the quote, a backslash,
# a line's end and NUL, or a simple escape
PYTHON_TEXT = r"([^'\\\n\r\x00]|\\['\\nrt])"


def _python_args(f: Function, rule: str) -> list[str]:
    """LFM2's ``KEY=VALUE, ...`` for ``f``: in the schema's order, the required
    ones always; a string's VALUE is a Python string in single quotes, any
    other VALUE is JSON of its schema (which LFM2's reader takes)."""
    properties = f.parameters.get("properties") or {}
    required = set(f.parameters.get("required") or [])
    rules: list[str] = []
    items = []
    for k, (key, schema) in enumerate(properties.items()):
        name = f"{rule}_p{k}"
        if string_valued(schema) and "enum" in schema:
            value = "(" + " | ".join(json.dumps(repr(v)) for v in schema["enum"]) + ")"
        elif string_valued(schema):
            least, most = schema.get("minLength", 0), schema.get("maxLength", "")
            value = f'"\'" /{PYTHON_TEXT}{{{least},{most}}}/ "\'"'
        else:
            rules.append(f"{name}: %json {_compile_args(f.name, schema, check=False)}")
            value = name
        items.append((f"{json.dumps(key + '=')} {value}", key in required))
    listed_rules, listed = separated(rule + "_k", items, '", "')
    return [*rules, *listed_rules, f"{rule}: {listed}"]


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


def _call_rules(fmt: CallFormat, functions: list[Function], specials: dict[str, int], tag: str) -> list[str]:
    """Rules for one call of ``fmt`` from its name (or its id) on (rule ``{tag}_rest``)."""
    choices = []
    rules = []
    for i, f in enumerate(functions):
        if fmt.args != "json":
            _compile_args(f.name, f.parameters)  # a schema that cannot be used is refused by its function's name
        rules += ARGS[fmt.args](f, f"{tag}_a{i}", fmt, specials)
        if fmt.shape == "json":
            name = f"{json.dumps(json.dumps(f.name) + ',')} {WS} {json.dumps(json.dumps(fmt.key) + ': ')}"
        else:
            number = f" {_lark_text(fmt.index, specials)} /[0-9]{{1,3}}/" if fmt.index else ""
            written = json.dumps(json.dumps(f.name) if fmt.quoted else f.name)
            name = f"{written}{number} {_lark_text(fmt.name_end.replace('{name}', f.name), specials)}"
        choices.append(f"{name} {tag}_a{i}")
    close = f'{WS} "}}" ' if fmt.shape == "json" else ""
    call_id = f"/{fmt.call_id}/ {_lark_text(fmt.id_end, specials)} " if fmt.call_id else ""
    rules.append(f"{tag}_rest: {call_id}({' | '.join(choices)}) {close}{_lark_text(fmt.after_each, specials)}")
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
    # messages before the reply's text or calls (with required, the call comes first)
    notes = "n_note* " if fmt.notes[0] and choice != "required" else ""
    if notes:
        rules += [
            f"n_note: {_lark_text(fmt.notes[0], specials)} n_text",
            _trigger_rule("n_text", fmt.notes[1], specials, "(.|\\n)*"),
        ]
    if fmt.text_close:
        rules[1:1] = _text_then_calls(fmt, choice, calls, specials)
    elif choice == "required":
        rules.insert(1, f"start: {calls}")
    else:
        # plain text may not start the way a call does: with the family's
        # leading marker, or with a bare call object (what small models write)
        text = "([^{\\[<](.|\\n)*)?" if fmt.leading else _not_starting((BARE, DOUBLED))
        text = "(.|\\n)*" if fmt.text_open else text  # its opening tells text from a call
        rules[1] = f"TEXT: /{text}/"
        opened = _lark_text(fmt.text_open, specials) + " " if fmt.text_open else ""
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
            alternatives.append(
                f"{opened}t{k} {_lark_text(rest, specials)} c_rest {more} {_lark_text(fmt.end, specials)}"
            )
        rules += _call_rules(FENCED, functions, specials, "f")
        for k, (trigger, rest) in enumerate(FENCED.triggers):
            rules.append(_trigger_rule(f"ft{k}", trigger, specials, text))
            alternatives.append(f"{opened}ft{k} {_lark_text(rest, specials)} (f_rest | OTHER)")
        rules.insert(1, f"start: {notes}({opened}TEXT | {' | '.join(alternatives)})")
    grammar = llguidance.LLMatcher.grammar_from_lark("\n".join(rules))
    return OutputSpec("grammar", _compiled(grammar, "tools"), None, "tools")


def _text_then_calls(fmt: CallFormat, choice: Choice, calls: str, specials: dict[str, int]) -> list[str]:
    """A reply whose text ``text_open``...``text_close`` comes before its calls
    (Kimi K3's response, GigaChat 3's message), ``reply_end`` after: with
    ``required``, no text and the calls; with ``auto``, any text, and once it
    is closed the calls, or none."""
    opened = _lark_text(fmt.text_open, specials) if fmt.text_open else ""
    close = _lark_text(fmt.text_close, specials)
    end = f"{_lark_text(fmt.reply_end, specials)}?" if fmt.reply_end else ""
    if choice == "required":
        return [f"start: {opened} {close} {calls} {end}"]
    return [
        f"start: {opened} (TEXT | x_text ({calls})? {end})",
        _trigger_rule("x_text", fmt.text_close, specials, "(.|\\n)*"),
    ]


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
    """Rule ``name``: free text (``text``, a regex) up to and including ``trigger``.
    Free text never holds a special token: where the trigger starts with one,
    the rule is the text, then the token, then the trigger's rest."""
    parts = [part for part in _MARKER.split(trigger) if part]
    first = next((k for k, part in enumerate(parts) if part in specials), len(parts))
    rest = _lark_text("".join(parts[first + 1 :]), specials) if first + 1 < len(parts) else ""
    if first == 0:
        return f"{name}: TEXT <[{specials[parts[0]]}]> {rest}".rstrip()
    if first < len(parts):  # text, then a special token: the text is matched lazily up to the token
        return f"{name}: {name}_t <[{specials[parts[first]]}]> {rest}".rstrip() + (
            f"\n{name}_t[lazy]: /{text}{_regex(''.join(parts[:first]))}/"
        )
    return f"{name}[lazy]: /{text}{_regex(trigger)}/"
