"""Go's ``fmt`` for JSON values: how a template prints a value, ``print`` and ``printf``.

Values are what JSON decodes to (dict, list, str, int, float, bool, None) plus ``datetime``,
printed as Go prints the matching ``interface{}`` values: ``map[a:1 b:x]`` with sorted keys,
``[1 2 3]``, floats in Go's shortest ``%v`` form (``1e+06``, ``0.5``), ``<nil>`` for null.
``printf`` supports the verbs ``v s d f F e E g G q x X t c b o O %`` with the flags
``+ - # 0 space``, a width and a precision (each at most ``MAX_WIDTH``); a verb that does not
fit its argument prints Go's ``%!d(string=abc)`` marker, as do missing (``%!d(MISSING)``) and
extra (``%!(EXTRA int=1)``) arguments. Not supported: ``*`` widths, ``%[n]`` argument indexes,
``%x`` of floats, ``%U``, ``%p``.
"""

from __future__ import annotations

import math
from datetime import datetime
from decimal import Decimal
from functools import lru_cache
from typing import Any, NamedTuple

from .errors import TemplateEvalError
from .timefmt import go_time_string

__all__ = ["MAX_WIDTH", "go_float", "go_type", "go_value", "parse_format", "sprint", "sprintf", "text_of"]

MAX_WIDTH = 1024
"""Largest printf width or precision: bounds what one verb can allocate."""

_MAX_PRINT_DEPTH = 64
_GO_TYPES = {str: "string", int: "int", float: "float64", bool: "bool", datetime: "time.Time"}
_INT_BASES = {"d": "d", "v": "d", "b": "b", "o": "o", "O": "o", "x": "x", "X": "X"}
_INT_PREFIXES = {"x": "0x", "X": "0X", "b": "0b", "o": "0"}
_QUOTE_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


class Verb(NamedTuple):
    """One ``%`` directive of a printf format."""

    verb: str
    flags: str
    width: int | None
    precision: int | None


def go_type(value: Any) -> str:
    """The Go type name of a JSON value, for messages and printf's error markers."""
    if value is None:
        return "<nil>"
    if isinstance(value, dict):
        return "map[string]interface {}"
    if isinstance(value, list | tuple):
        return "[]interface {}"
    return _GO_TYPES.get(type(value), type(value).__name__)


def text_of(value: Any) -> str:
    """What ``{{value}}`` prints: like Go, except that a missing key or null prints ``null``."""
    if type(value) is str:
        return value
    if value is None:
        return "null"  # Go prints "<no value>", which EventNative replaced with "null"
    return go_value(value)


def go_value(value: Any, depth: int = 0) -> str:
    """Go's ``%v`` of a JSON value."""
    kind = type(value)
    if kind is str:
        return value
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return str(value)
    if kind is float:
        return go_float(value)
    if value is None:
        return "<nil>"
    return _composite(value, depth, lambda item, level: go_value(item, level))


def _composite(value: Any, depth: int, show: Any) -> str:
    if depth >= _MAX_PRINT_DEPTH:
        raise TemplateEvalError("value nested too deeply to print")
    if isinstance(value, dict):
        keys = sorted(value, key=str)
        return "map[" + " ".join(f"{show(key, depth + 1)}:{show(value[key], depth + 1)}" for key in keys) + "]"
    if isinstance(value, list | tuple):
        return "[" + " ".join(show(item, depth + 1) for item in value) + "]"
    if isinstance(value, datetime):
        return go_time_string(value)
    return str(value)


def go_float(value: float) -> str:
    """Go's ``%v`` of a float64: the shortest digits; exponent form below 1e-4 and from 1e6 on."""
    if not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    sign, digits, exponent = Decimal(repr(value)).as_tuple()
    text = "".join(map(str, digits)).rstrip("0")
    point = len(digits) + int(exponent)  # the decimal point sits after this many digits
    minus = "-" if sign else ""
    if not -4 <= point - 1 < 6:  # Go's strconv 'g' with the shortest precision
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{minus}{mantissa}e{point - 1:+03d}"
    return f"{minus}{abs(value):.{max(len(text) - point, 0)}f}"


def sprint(*args: Any) -> str:
    """Go's ``fmt.Sprint``: a space between operands when neither is a string."""
    out: list[str] = []
    previous_is_string = True
    for arg in args:
        is_string = type(arg) is str
        if out and not is_string and not previous_is_string:
            out.append(" ")
        out.append(go_value(arg))
        previous_is_string = is_string
    return "".join(out)


def sprintf(template: str, args: tuple[Any, ...] | list[Any]) -> str:
    """Go's ``fmt.Sprintf``."""
    out: list[str] = []
    used = 0
    for part in parse_format(template):
        if type(part) is str:
            out.append(part)
        elif used < len(args):
            out.append(format_arg(args[used], part))  # type: ignore[arg-type]
            used += 1
        else:
            out.append(f"%!{part.verb}(MISSING)")  # type: ignore[union-attr]
    if used < len(args):
        extra = ", ".join(_typed(arg) for arg in args[used:])
        out.append(f"%!(EXTRA {extra})")
    return "".join(out)


def _typed(value: Any) -> str:
    return "<nil>" if value is None else f"{go_type(value)}={go_value(value)}"


@lru_cache(maxsize=256)
def parse_format(template: str) -> tuple[str | Verb, ...]:
    """Split a printf format into literal text and verbs; TemplateEvalError when unsupported."""
    parts: list[str | Verb] = []
    literal: list[str] = []
    i, n = 0, len(template)
    while i < n:
        percent = template.find("%", i)
        if percent < 0:
            literal.append(template[i:])
            break
        literal.append(template[i:percent])
        verb, i = _parse_verb(template, percent + 1)
        if verb is None:
            literal.append("%!(NOVERB)")
        elif verb.verb == "%":
            literal.append("%")
        else:
            parts.append("".join(literal))
            literal = []
            parts.append(verb)
    parts.append("".join(literal))
    return tuple(part for part in parts if part != "")


def _parse_verb(template: str, i: int) -> tuple[Verb | None, int]:
    n = len(template)
    start = i
    while i < n and template[i] in "+-# 0":
        i += 1
    flags = template[start:i]
    width, i = _parse_count(template, i)
    precision = None
    if i < n and template[i] == ".":
        precision, i = _parse_count(template, i + 1)
        precision = precision or 0
    if i >= n:
        return None, i
    if template[i] in "*[":
        raise TemplateEvalError("printf: '*' widths and '[n]' argument indexes are not supported")
    return Verb(template[i], flags, width, precision), i + 1


def _parse_count(template: str, i: int) -> tuple[int | None, int]:
    start = i
    while i < len(template) and template[i].isdecimal() and template[i].isascii():
        i += 1
    if i == start:
        return None, i
    count = int(template[start:i])
    if count > MAX_WIDTH:
        raise TemplateEvalError(f"printf: width or precision {count} is over {MAX_WIDTH}")
    return count, i


def format_arg(value: Any, spec: Verb, depth: int = 0) -> str:
    """One argument formatted by one verb, as Go's fmt does it (elements of lists and maps too)."""
    verb, kind = spec.verb, type(value)
    if kind is str:
        return _format_string(value, spec)
    if kind is bool:
        return _pad("true" if value else "false", spec) if verb in "vt" else _bad_verb(value, verb)
    if kind is int:
        return _format_int(value, spec)
    if kind is float:
        return _format_float(value, spec)
    if value is None:
        return _pad("<nil>", spec) if verb == "v" else f"%!{verb}(<nil>)"
    if isinstance(value, datetime):
        return _pad(go_time_string(value), spec) if verb in "vs" else _bad_verb(value, verb)
    if isinstance(value, dict | list | tuple):
        return _composite(value, depth, lambda item, level: format_arg(item, spec, level))
    return _bad_verb(value, verb)


def _bad_verb(value: Any, verb: str) -> str:
    return f"%!{verb}({_typed(value)})"


def _pad(body: str, spec: Verb, sign: str = "", zero_ok: bool = True) -> str:
    """Apply the width: spaces (or zeros after the sign with the ``0`` flag), left with ``-``."""
    width = spec.width
    if width is None or len(sign) + len(body) >= width:
        return sign + body
    if "-" in spec.flags:
        return (sign + body).ljust(width)
    if "0" in spec.flags and zero_ok:
        return sign + body.rjust(width - len(sign), "0")
    return (sign + body).rjust(width)


def _sign(negative: bool, flags: str) -> str:
    if negative:
        return "-"
    return "+" if "+" in flags else (" " if " " in flags else "")


def _format_string(value: str, spec: Verb) -> str:
    verb = spec.verb
    if spec.precision is not None and verb in "svq":
        value = value[: spec.precision]
    if verb in "sv":
        return _pad(value, spec)
    if verb == "q":
        return _pad(go_quote(value, '"'), spec)
    if verb in "xX":
        digits = value.encode().hex()
        return _pad(digits.upper() if verb == "X" else digits, spec)
    return _bad_verb(value, verb)


def _format_int(value: int, spec: Verb) -> str:
    verb, flags = spec.verb, spec.flags
    if verb == "c":
        return _pad(_rune(value), spec)
    if verb == "q":
        return _pad(go_quote(_rune(value), "'"), spec)
    if verb not in _INT_BASES:
        return _bad_verb(value, verb)
    digits = format(abs(value), _INT_BASES[verb])
    if spec.precision is not None:
        digits = digits.zfill(spec.precision)
    prefix = "0o" if verb == "O" else (_INT_PREFIXES.get(verb, "") if "#" in flags else "")
    sign = _sign(value < 0, flags) + prefix
    return _pad(digits, spec, sign, zero_ok=spec.precision is None)


def _rune(code: int) -> str:
    return chr(code) if 0 <= code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF else "\ufffd"


def _format_float(value: float, spec: Verb) -> str:
    verb, precision = spec.verb, spec.precision
    if verb not in "vgGeEfF":
        if verb in "xX":
            raise TemplateEvalError(f"printf: %{verb} of a float is not supported")
        return _bad_verb(value, verb)
    if not math.isfinite(value):
        return _pad(go_float(value), spec, zero_ok=False)
    magnitude = abs(value)
    if verb in "vgG" and precision is None:
        body = go_float(magnitude)
    else:
        style = "g" if verb == "v" else verb
        body = format(magnitude, f".{6 if precision is None else precision}{style}")
    if verb in "GE":
        body = body.upper()
    negative = math.copysign(1.0, value) < 0
    return _pad(body, spec, _sign(negative, spec.flags))


def go_quote(text: str, quote: str) -> str:
    """Go's ``strconv.Quote`` (or ``QuoteRune`` with ``'``): escapes, printable text kept."""
    out = [quote]
    for ch in text:
        if ch == quote or ch == "\\":
            out.append("\\" + ch)
        elif ch in _QUOTE_ESCAPES:
            out.append(_QUOTE_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append(quote)
    return "".join(out)
