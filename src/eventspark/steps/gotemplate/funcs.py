"""Go's template builtins, truthiness and field access, on JSON values.

A missing key and a JSON null are both ``None`` (Go: an invalid value, or a nil interface).
Comparison follows Go's ``eq``/``lt``: values of different basic kinds are an error
("incompatible types for comparison"), except that ints and floats compare numerically here
(Go would refuse ``eq 1 1.0``) and that null equals only null.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import orjson

from .errors import TemplateEvalError
from .gofmt import go_type, sprint, sprintf
from .timefmt import Formatter, compile_layout, parse_rfc3339

__all__ = ["ARITY", "EAGER_FUNCS", "equal", "field_of", "format_time", "is_true", "time_of"]

MAX_LAYOUT_CHARS = 256
MAX_FORMAT_CHARS = 1024  # a printf format read from the event; longer output is refused anyway


def is_true(value: Any) -> bool:
    """Go's truth: false, 0, null/missing and empty strings, lists and maps are false."""
    if value is None:
        return False
    kind = type(value)
    if kind is bool:
        return value
    if kind is str or kind is list or kind is dict:
        return len(value) > 0
    if kind is int or kind is float:
        return value != 0
    return True


def field_of(value: Any, key: str) -> Any:
    """``.key`` on a value that is not a plain dict (the hot path handles dicts inline)."""
    if isinstance(value, dict):
        return value.get(key)
    if value is None:
        return None  # like Go on a missing key: .missing.b is "no value", not an error
    raise TemplateEvalError(f"can't evaluate field {key} in type {go_type(value)}")


def time_of(value: Any) -> datetime:
    """The receiver of ``.Format``: a datetime, or a string holding an RFC 3339 timestamp."""
    if isinstance(value, datetime):
        return value
    if type(value) is str:
        parsed = parse_rfc3339(value)
        if parsed is not None:
            return parsed
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise TemplateEvalError(f"can't call Format: {shown!r} is not an RFC 3339 timestamp")
    if value is None:
        raise TemplateEvalError("can't call Format on a missing or null value")
    if isinstance(value, dict):
        raise TemplateEvalError("Format is not a method but has arguments")
    raise TemplateEvalError(f"can't evaluate field Format in type {go_type(value)}")


def format_time(value: Any, layout: Any) -> str:
    """``value.Format layout`` with a layout known only at run time."""
    if type(layout) is not str:
        raise TemplateEvalError(f"wrong type for value; expected string; got {go_type(layout)}")
    if len(layout) > MAX_LAYOUT_CHARS:
        raise TemplateEvalError(f"Format layout longer than {MAX_LAYOUT_CHARS} characters")
    formatter: Formatter = compile_layout(layout)
    return formatter(time_of(value))


def _basic_kind(value: Any) -> str:
    if value is None:
        return "nil"
    kind = type(value)
    if kind is bool:
        return "bool"
    if kind is int or kind is float:
        return "number"
    if kind is str:
        return "string"
    return "other"


_BASIC_TYPES = frozenset({str, int, float, bool})


def equal(a: Any, b: Any) -> bool:
    """``eq a b``."""
    kind = type(a)
    if kind is type(b) and kind in _BASIC_TYPES:
        return bool(a == b)
    return _equal(a, b)


def _equal(a: Any, b: Any) -> bool:
    kind_a, kind_b = _basic_kind(a), _basic_kind(b)
    if kind_a != kind_b:
        if kind_a == "nil" or kind_b == "nil":
            return False
        raise TemplateEvalError("incompatible types for comparison")
    if kind_a == "other":
        raise TemplateEvalError(f"non-comparable type {go_type(a)}")
    return a == b


def eq(first: Any, *others: Any) -> bool:
    """Go's ``eq a b c``: a equals b or a equals c (stopping at the first match, as Go does)."""
    return any(_equal(first, other) for other in others)


def ne(a: Any, b: Any) -> bool:
    return not _equal(a, b)


def lt(a: Any, b: Any) -> bool:
    kind_a, kind_b = _basic_kind(a), _basic_kind(b)
    if kind_a not in ("number", "string") or kind_b not in ("number", "string"):
        raise TemplateEvalError("invalid type for comparison")
    if kind_a != kind_b:
        raise TemplateEvalError("incompatible types for comparison")
    return bool(a < b)


def le(a: Any, b: Any) -> bool:
    return lt(a, b) or _equal(a, b)


def gt(a: Any, b: Any) -> bool:
    return not le(a, b)


def ge(a: Any, b: Any) -> bool:
    return not lt(a, b)


def not_(value: Any) -> bool:
    return not is_true(value)


def length(value: Any) -> int:
    """Go's ``len``: a string's length is in UTF-8 bytes."""
    if type(value) is str:
        return len(value) if value.isascii() else len(value.encode())
    if isinstance(value, dict | list):
        return len(value)
    if value is None:
        raise TemplateEvalError("len of nil pointer")
    raise TemplateEvalError(f"len of type {go_type(value)}")


def index(item: Any, *keys: Any) -> Any:
    """Go's ``index x k1 k2``: x[k1][k2] over maps, lists and strings (a string gives a byte)."""
    for key in keys:
        if isinstance(item, dict):
            if type(key) is not str:
                raise TemplateEvalError(f"value has type {go_type(key)}; should be string")
            item = item.get(key)
            continue
        if item is None:
            raise TemplateEvalError("index of untyped nil")
        if not isinstance(item, list | str):
            raise TemplateEvalError(f"can't index item of type {go_type(item)}")
        if type(key) is not int:
            raise TemplateEvalError(f"cannot index slice/array with type {go_type(key)}")
        sequence = item.encode() if isinstance(item, str) else item
        if not 0 <= key < len(sequence):
            raise TemplateEvalError(f"index out of range: {key}")
        item = sequence[key]
    return item


def printf(template: Any, *args: Any) -> str:
    if type(template) is not str:
        raise TemplateEvalError(f"wrong type for value; expected string; got {go_type(template)}")
    if len(template) > MAX_FORMAT_CHARS:
        raise TemplateEvalError(f"printf format longer than {MAX_FORMAT_CHARS} characters")
    return sprintf(template, args)


_GO_JSON_ESCAPES = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))


def to_json(value: Any) -> str:
    """EventNative's ``json`` (webhook templates): the value as Go's ``json.Marshal`` writes it,
    keys sorted and ``< > &`` escaped (they only occur inside strings, so replacing is exact)."""
    try:
        text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError as exc:
        raise TemplateEvalError(f"json: {exc}") from None
    for raw, escaped in _GO_JSON_ESCAPES:
        if raw in text:
            text = text.replace(raw, escaped)
    return text


EAGER_FUNCS: dict[str, Callable[..., Any]] = {
    "eq": eq,
    "ne": ne,
    "lt": lt,
    "le": le,
    "gt": gt,
    "ge": ge,
    "not": not_,
    "len": length,
    "index": index,
    "printf": printf,
    "print": sprint,
    "json": to_json,
}
"""Functions that get their arguments evaluated; ``and`` and ``or`` are lazy (see compiler)."""

ARITY: dict[str, tuple[int, int | None]] = {
    "eq": (2, None),
    "ne": (2, 2),
    "lt": (2, 2),
    "le": (2, 2),
    "gt": (2, 2),
    "ge": (2, 2),
    "not": (1, 1),
    "len": (1, 1),
    "index": (1, None),
    "printf": (1, None),
    "print": (0, None),
    "json": (1, 1),
    "and": (1, None),
    "or": (1, None),
}
"""(fewest, most) arguments of each builtin; checked when the template is compiled."""
