"""Checks of values against literal SQL types named by a mapping's `cast` (`numeric(12,2)`, `varchar(8)`).

A column with a literal type is staged as text and cast by the warehouse at commit. A value the
warehouse refuses there would fail the whole destination/table pair, so the common types are
checked before staging, where one bad value fails one event. `literal_check(sql_type)` gives a
function that returns why a staged text value does not fit, or None when it fits; it is None for
a type it does not know (that value is left to the warehouse, as before).

A value is refused here only when no supported warehouse (Postgres, MySQL in strict mode,
ClickHouse) would store it as given: text that is not an ASCII number, an integer out of the
type's range, more integer digits than a decimal's precision allows, text longer than a
`varchar(n)`, a malformed UUID. (ClickHouse would wrap an integer out of range and MySQL round
`1.5` into an INT: refused here rather than stored changed.) A value that only some warehouses
refuse, such as more decimal places than the scale (ClickHouse refuses, Postgres and MySQL round)
or a float beyond a 4-byte `real`, is left to the warehouse, as before. Types whose accepted text
differs a lot between warehouses (dates, JSON) are not checked.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable
from decimal import Context, Decimal, InvalidOperation
from functools import lru_cache

LiteralCheck = Callable[[str], str | None]

_INTEGER_RANGES = {
    "smallint": (-(2**15), 2**15 - 1),
    "int2": (-(2**15), 2**15 - 1),
    "integer": (-(2**31), 2**31 - 1),
    "int": (-(2**31), 2**31 - 1),
    "int4": (-(2**31), 2**31 - 1),
    "bigint": (-(2**63), 2**63 - 1),
    "int8": (-(2**63), 2**63 - 1),
    "tinyint": (-(2**7), 2**7 - 1),
    "mediumint": (-(2**23), 2**23 - 1),
}
_CLICKHOUSE_INTEGER = re.compile(r"(u?)int(8|16|32|64)", re.ASCII)
_FLOATS = frozenset({"real", "float4", "float8", "double precision", "double", "float", "float32", "float64"})
_DECIMAL = re.compile(r"(?:numeric|decimal)\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?", re.ASCII)
_TEXT = re.compile(r"(?:varchar|character varying|char|character|nvarchar|fixedstring)\s*\(\s*(\d+)\s*\)", re.ASCII)
_INTEGER_TEXT = re.compile(r"[+-]?\d+", re.ASCII)
# An ASCII number as SQL reads it: Python's float() and Decimal() also take full-width digits,
# underscores and "nan"/"inf", which no warehouse does.
_NUMBER_TEXT = re.compile(r" *[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)? *", re.ASCII)
_DEFAULT_DECIMAL_PRECISION = 10  # MySQL's DECIMAL without (p,s) is DECIMAL(10,0): the strictest


@lru_cache(maxsize=256)
def literal_check(sql_type: str) -> LiteralCheck | None:
    """The check of values for `sql_type` (case and spacing as written in a mapping), or None."""
    name = " ".join(sql_type.strip().lower().split())
    if name in _INTEGER_RANGES:
        return _integer_check(*_INTEGER_RANGES[name])
    found = _CLICKHOUSE_INTEGER.fullmatch(name)
    if found:
        bits = int(found.group(2))
        low, high = (0, 2**bits - 1) if found.group(1) else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        return _integer_check(low, high)
    if name in _FLOATS:
        return _check_float
    found = _DECIMAL.fullmatch(name)
    if found:
        precision = int(found.group(1) or _DEFAULT_DECIMAL_PRECISION)
        scale = int(found.group(2) or 0)
        return _decimal_check(precision, scale) if 0 <= scale <= precision else None
    found = _TEXT.fullmatch(name)
    if found:
        return _length_check(int(found.group(1)), bytes_=name.startswith("fixedstring"))
    if name == "uuid":
        return _check_uuid
    return None


def _integer_check(low: int, high: int) -> LiteralCheck:
    def check(text: str) -> str | None:
        digits = text.strip(" ")
        if _INTEGER_TEXT.fullmatch(digits) is None:
            return f"{_show(text)} is not an integer"
        # Longer than any 64-bit integer: no int() of a huge string (Python caps its digits anyway).
        significant = digits.lstrip("+-").lstrip("0") or "0"
        if (
            len(significant) > 20
            or not low <= int(digits[0] + significant if digits[0] == "-" else significant) <= high
        ):
            return f"{_show(text)} is out of range [{low}, {high}]"
        return None

    return check


def _check_float(text: str) -> str | None:
    if _NUMBER_TEXT.fullmatch(text) is None:
        return f"{_show(text)} is not a number"
    return None if math.isfinite(float(text)) else f"{_show(text)} is beyond a double"


def _decimal_check(precision: int, scale: int) -> LiteralCheck:
    whole_digits = precision - scale

    def check(text: str) -> str | None:
        if _NUMBER_TEXT.fullmatch(text) is None:
            return f"{_show(text)} is not a number"
        try:
            number = Decimal(text.strip(" "))
        except InvalidOperation:
            return f"{_show(text)} is not a number"
        too_long = f"{_show(text)} has more than {whole_digits} digit(s) before the point"
        # Digits after the point are rounded to the scale (or refused: left to the warehouse); the
        # integer part must fit everywhere.
        if number != 0 and number.adjusted() >= whole_digits:
            return too_long
        rounded = number.quantize(Decimal(1).scaleb(-scale), context=Context(prec=precision + 1))
        return too_long if rounded != 0 and rounded.adjusted() >= whole_digits else None

    return check


def _length_check(limit: int, bytes_: bool) -> LiteralCheck:
    def check(text: str) -> str | None:
        size = len(text.encode()) if bytes_ else len(text)
        if size > limit:
            unit = "bytes" if bytes_ else "characters"
            return f"{_show(text)} is longer than {limit} {unit}"
        return None

    return check


def _check_uuid(text: str) -> str | None:
    try:
        uuid.UUID(text)
    except ValueError:
        return f"{_show(text)} is not a UUID"
    return None


def _show(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")
