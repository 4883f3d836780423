"""Rows as tab-separated text, the bulk format both ClickHouse (`FORMAT TabSeparated`) and MySQL
(`LOAD DATA ... FIELDS TERMINATED BY '\\t' ESCAPED BY '\\\\'`) read at full speed.

Both read the same escapes: `\\N` is NULL; backslash, tab, newline, carriage return and NUL
inside text are written as backslash sequences. Encoding goes column by column (one type check
per column, not per value), then the columns are zipped into lines.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from eventspark.steps.typing import DataType

NULL = "\\N"
_SPECIAL = re.compile("[\\\\\t\n\r\x00]")
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\x00": "\\0"})

Encoder = Callable[[Sequence[Any]], list[str]]


def escape(text: str) -> str:
    """`text` as one TSV field."""
    return text if _SPECIAL.search(text) is None else text.translate(_ESCAPES)


def _text(values: Sequence[Any]) -> list[str]:
    out = [NULL if v is None else v for v in values]
    # Most columns need no escape at all: one scan of the column's text proves it (every tab is a
    # separator of this join, every backslash one of the NULLs) instead of a search per value.
    text = "\t".join(out)
    if (
        text.count("\t") == len(out) - 1
        and text.count("\\") == values.count(None)
        and "\n" not in text
        and "\r" not in text
        and "\x00" not in text
    ):
        return out
    search = _SPECIAL.search
    return [NULL if v is None else (v if search(v) is None else v.translate(_ESCAPES)) for v in values]


def _number(values: Sequence[Any]) -> list[str]:
    # int and float print as both warehouses parse them (repr of a float round-trips).
    return [NULL if v is None else str(v) for v in values]


def _bool(values: Sequence[Any]) -> list[str]:
    return [NULL if v is None else ("1" if v else "0") for v in values]


STAGE_ENCODERS: dict[DataType, Encoder] = {
    DataType.BOOL: _bool,
    DataType.INT64: _number,
    DataType.FLOAT64: _number,
    DataType.STRING: _text,
    DataType.TIMESTAMP: _text,
}
"""Encoders for values in their stage form (bool, int, float, str; timestamps as RFC 3339 text)."""


def encode_rows(rows: Sequence[Sequence[Any]], encoders: Sequence[Encoder]) -> bytes:
    """`rows` (one value per encoder, in order) as UTF-8 TSV, one line per row."""
    if not rows:
        return b""
    columns = [encode(column) for encode, column in zip(encoders, zip(*rows, strict=True), strict=True)]
    lines = map("\t".join, zip(*columns, strict=True))
    return ("\n".join(lines) + "\n").encode()
