"""The Jinja environment chat templates run in, made to behave as llama.cpp's
own Jinja engine (common/jinja) does where the two differ: blocks trimmed,
undefined values that chain, ``tojson`` without HTML escaping, ``raise_exception``
and ``strftime_now``; and a way to see which values a template used, which
tells what the template supports (``template_caps``)."""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, cast

from jinja2 import ChainableUndefined, Template, TemplateError, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import SandboxedEnvironment


class Tracked:
    """A value whose use by a template is recorded: ``used`` once the template
    reached it, and which operations it went through (``ops``)."""

    used: bool
    ops: set[str]

    def _track(self) -> None:
        self.used = False
        self.ops = set()


class TrackedStr(str, Tracked):
    pass


class TrackedList(list[Any], Tracked):
    def __iter__(self) -> Iterator[Any]:
        mark(self, "array_access")
        return super().__iter__()


class TrackedDict(dict[str, Any], Tracked):
    pass


def tracked(value: Any) -> Any:
    """``value`` (JSON data) with every string, list and object tracked."""
    result: Tracked
    if isinstance(value, str):
        result = TrackedStr(value)
    elif isinstance(value, list):
        result = TrackedList(tracked(v) for v in value)
    elif isinstance(value, dict):
        result = TrackedDict((k, tracked(v)) for k, v in value.items())
    else:
        return value
    result._track()
    return result


def mark(value: Any, op: str | None = None, *, deep: bool = False) -> None:
    if isinstance(value, Tracked):
        value.used = True
        if op:
            value.ops.add(op)
    if deep and isinstance(value, list):
        for item in list.__iter__(value):  # reading every item is not an array access
            mark(item, deep=True)
    elif deep and isinstance(value, dict):
        for item in value.values():
            mark(item, deep=True)


class LenientUndefined(ChainableUndefined):
    """An undefined value as llama.cpp's engine treats it: attributes of it are
    undefined too, and joined to a string with ``+`` it is the empty string."""

    def __add__(self, other: Any) -> Any:
        return other if isinstance(other, str) else self

    def __radd__(self, other: Any) -> Any:
        return other if isinstance(other, str) else self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self  # a method of an undefined value: undefined as well


def _float_text(value: float) -> str:
    """A float printed as llama.cpp prints it: six decimals, trailing zeros cut, one kept."""
    text = f"{value:f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def output(value: Any) -> str:
    """What ``{{ value }}`` writes in llama.cpp: text and numbers as text, ``True``
    and ``False``, a list's items one after the other, and nothing at all for
    none, undefined and objects."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float_text(value)
    if isinstance(value, list | tuple):
        items = list.__iter__(value) if isinstance(value, list) else iter(value)
        return "".join(output(v) for v in items)
    return ""


def _safe(value: Any) -> Any:
    """``safe``: text stays plain text (no HTML escaping anywhere); lists and objects become JSON."""
    return tojson(value) if isinstance(value, list | dict) else value


class TemplateRaisedError(TemplateError):
    """The template called ``raise_exception``."""


def _raise(message: str) -> None:
    raise TemplateRaisedError(message)


def _json_float(value: float) -> str:
    """A float in JSON as C++'s stream writes it: six significant digits."""
    return f"{value:.6g}"


def _to_json(value: Any, indent: int | None, item_sep: str, key_sep: str, level: int = 0) -> str:  # noqa: C901, PLR0911
    newline = "\n" if indent is not None else ""
    pad = " " * (indent * level) if indent else ""
    inner = " " * (indent * (level + 1)) if indent else ""
    if value is None or isinstance(value, ChainableUndefined):
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _json_float(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple) or (isinstance(value, Iterable) and not isinstance(value, Mapping)):
        value = list(list.__iter__(value) if isinstance(value, list) else value)
        if not value:
            return "[]"
        items = [inner + _to_json(v, indent, item_sep, key_sep, level + 1) for v in value]
        return "[" + newline + (item_sep + newline).join(items) + newline + pad + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        pairs = [
            inner + json.dumps(str(k), ensure_ascii=False) + key_sep + _to_json(v, indent, item_sep, key_sep, level + 1)
            for k, v in value.items()
        ]
        return "{" + newline + (item_sep + newline).join(pairs) + newline + pad + "}"
    return "null"


def tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | list[str] | None = None,
    sort_keys: bool = False,
) -> str:
    """llama.cpp's ``tojson``: ``", "`` and ``": "`` between items on one line,
    ``","`` and newlines with ``indent``; non-ASCII text kept as it is."""
    mark(value, deep=True)
    if sort_keys:
        raise TemplateError("tojson sort_keys=true not implemented")
    item_sep = separators[0] if separators else ("," if indent is not None else ", ")
    key_sep = separators[1] if separators and len(separators) > 1 else ": "
    text = _to_json(
        value, indent if isinstance(indent, int) and not isinstance(indent, bool) else None, item_sep, key_sep
    )
    if ensure_ascii:
        text = text.encode("ascii", "backslashreplace").decode("ascii").replace("\\x", "\\u00")
    return text


def _tracking_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """A filter that marks its input as used by ``name``."""
    passes = getattr(func, "jinja_pass_arg", None)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        index = 1 if passes is not None else 0
        if len(args) > index:
            mark(args[index], name)
        return func(*args, **kwargs)

    return wrapper


def _tracking_test(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        passes = getattr(func, "jinja_pass_arg", None)
        index = 1 if passes is not None else 0
        if len(args) > index:
            mark(args[index], f"test_is_{name}")
        return func(*args, **kwargs)

    return wrapper


class _Generation(Extension):
    """``{% generation %}`` (Hugging Face's marker for assistant turns) renders its body as is."""

    tags = {"generation"}  # noqa: RUF012  jinja2's own attribute

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


class LlamaJinja(SandboxedEnvironment):
    """Jinja as llama.cpp runs chat templates; member and item reads mark tracked values used."""

    def __init__(self) -> None:
        super().__init__(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[loopcontrols, _Generation],
            undefined=LenientUndefined,
            finalize=output,
        )
        self.globals.update(raise_exception=_raise, strftime_now=datetime.datetime.now().strftime)
        self.filters["tojson"] = tojson
        self.filters["safe"] = _safe
        for name, func in list(self.filters.items()):
            self.filters[name] = _tracking_filter(name, func)
        for name, test in list(self.tests.items()):
            self.tests[name] = _tracking_test(name, cast("Callable[..., Any]", test))

    def getattr(self, obj: Any, attribute: str) -> Any:
        value = super().getattr(obj, attribute)
        self._reached(obj, value)
        return value

    def getitem(self, obj: Any, argument: Any) -> Any:
        value = super().getitem(obj, argument)
        self._reached(obj, value)
        return value

    @staticmethod
    def _reached(obj: Any, value: Any) -> None:
        if isinstance(obj, Tracked):
            mark(obj, "array_access" if isinstance(obj, list) else "object_access")
            mark(value)


_ENV = LlamaJinja()


@functools.lru_cache(maxsize=128)
def compiled(source: str) -> Template:
    """The template ``source`` compiled once (the date it prints comes with each render)."""
    return _ENV.from_string(source)


def render(source: str, context: dict[str, Any], now: datetime.datetime | None = None) -> str:
    """``source`` rendered with ``context``; ``strftime_now`` prints ``now`` (default: the local time)."""
    moment = now or datetime.datetime.now()
    return compiled(source).render({"strftime_now": moment.strftime, **context})
