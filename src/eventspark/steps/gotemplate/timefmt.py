"""Go's ``time.Time.Format`` with reference-date layouts ("2006-01-02 15:04:05"), and RFC 3339 parsing.

A layout is translated once into a ``%``-format pattern plus the values to fill it (datetime
attributes read with ``attrgetter``, or small helper functions), so that formatting one
timestamp is a single C-level ``%`` for the common layouts. The attribute names come from the
fixed table below, never from the layout, and the layout's literal text has its ``%`` doubled.

Supported (as in Go): 2006 06 01 1 Jan January 02 2 _2 002 __2 Mon Monday 15 03 3 04 4 05 5
PM pm MST, the numeric zones -0700 -07:00 -07 -070000 -07:00:00 and their ISO 8601 forms
Z0700 Z07:00 Z07 Z070000 Z07:00:00, and fractional seconds .000 / .999 (or with a comma).
Differences from Go: Python datetimes hold microseconds, so digits past the sixth are 0; a
naive datetime counts as UTC; ``MST`` prints the zone's abbreviation when it has one, else the
offset (+0200), like Go for a parsed fixed offset.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from functools import lru_cache
from operator import attrgetter

__all__ = ["compile_layout", "go_time_string", "parse_rfc3339", "significant_prefix"]

Formatter = Callable[[datetime], str]

_MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")  # weekday() order

# Go's chunks that are one datetime attribute each: (printf conversion, attribute).
_FIELDS = {
    "2006": ("%04d", "year"),
    "01": ("%02d", "month"),
    "1": ("%d", "month"),
    "02": ("%02d", "day"),
    "2": ("%d", "day"),
    "_2": ("%2d", "day"),
    "15": ("%02d", "hour"),
    "04": ("%02d", "minute"),
    "4": ("%d", "minute"),
    "05": ("%02d", "second"),
    "5": ("%d", "second"),
}


def _hour12(dt: datetime) -> int:
    return dt.hour % 12 or 12


def _offset_seconds(dt: datetime) -> int:
    offset = dt.utcoffset()
    return 0 if offset is None else int(offset.total_seconds())


def _zone_offset(dt: datetime, iso_z: bool, colon: bool, minutes: bool, seconds: bool) -> str:
    total = _offset_seconds(dt)
    if iso_z and total == 0:
        return "Z"
    sign = "-" if total < 0 else "+"
    total = abs(total)
    sep = ":" if colon else ""
    out = f"{sign}{total // 3600:02d}"
    if minutes:
        out += f"{sep}{total // 60 % 60:02d}"
    if seconds:
        out += f"{sep}{total % 60:02d}"
    return out


def _zone_name(dt: datetime) -> str:
    if dt.tzinfo is None or dt.tzinfo is UTC:
        return "UTC"
    name = dt.tzname() or ""
    if name and all(ch.isalnum() or ch in "+-" for ch in name):
        return name
    return _zone_offset(dt, False, False, True, False)


def _zone(iso_z: bool, colon: bool, minutes: bool, seconds: bool) -> Formatter:
    return lambda dt: _zone_offset(dt, iso_z, colon, minutes, seconds)


def _fraction(separator: str, digits: int, trim: bool) -> Formatter:
    digits = min(digits, 9)

    def fraction(dt: datetime) -> str:
        text = f"{dt.microsecond:06d}000"[:digits]
        if trim:
            text = text.rstrip("0")
            if not text:
                return ""
        return separator + text

    return fraction


_DERIVED: dict[str, Formatter] = {
    "06": lambda dt: f"{dt.year % 100:02d}",
    "Jan": lambda dt: _MONTHS[dt.month - 1][:3],
    "January": lambda dt: _MONTHS[dt.month - 1],
    "Mon": lambda dt: _WEEKDAYS[dt.weekday()][:3],
    "Monday": lambda dt: _WEEKDAYS[dt.weekday()],
    "002": lambda dt: f"{dt.timetuple().tm_yday:03d}",
    "__2": lambda dt: f"{dt.timetuple().tm_yday:>3}",
    "3": lambda dt: str(_hour12(dt)),
    "03": lambda dt: f"{_hour12(dt):02d}",
    "PM": lambda dt: "PM" if dt.hour >= 12 else "AM",
    "pm": lambda dt: "pm" if dt.hour >= 12 else "am",
    "MST": _zone_name,
    "-0700": _zone(False, False, True, False),
    "-07:00": _zone(False, True, True, False),
    "-07": _zone(False, False, False, False),
    "-070000": _zone(False, False, True, True),
    "-07:00:00": _zone(False, True, True, True),
    "Z0700": _zone(True, False, True, False),
    "Z07:00": _zone(True, True, True, False),
    "Z07": _zone(True, False, False, False),
    "Z070000": _zone(True, False, True, True),
    "Z07:00:00": _zone(True, True, True, True),
}

# Longest first, as Go's nextStdChunk tries them at each position.
_ZONES = ("-07:00:00", "-070000", "-07:00", "-0700", "-07")


def _chunk_at(layout: str, i: int) -> str | None:
    """The Go layout chunk starting at ``layout[i]``, or None for a literal character."""
    rest = layout[i:]
    first = rest[0]
    if first == "J" and rest.startswith("Jan"):
        if rest.startswith("January"):
            return "January"
        return None if rest[3:4].islower() and rest[3:4].isascii() else "Jan"
    if first == "M":
        if rest.startswith("Mon"):
            if rest.startswith("Monday"):
                return "Monday"
            if not (rest[3:4].islower() and rest[3:4].isascii()):
                return "Mon"
        return "MST" if rest.startswith("MST") else None
    if first in "012345_":
        return _numeric_chunk(rest)
    if first in "Pp":
        return rest[:2] if rest[:2] in ("PM", "pm") else None
    if first in "-Z":
        for zone in _ZONES:
            candidate = first + zone[1:]
            if rest.startswith(candidate):
                return candidate
    return None


def _numeric_chunk(rest: str) -> str | None:
    first, second = rest[0], rest[1:2]
    if first == "0":
        if second and "1" <= second <= "6":
            return rest[:2]
        return "002" if rest.startswith("002") else None
    if first == "1":
        return "15" if second == "5" else "1"
    if first == "2":
        return "2006" if rest.startswith("2006") else "2"
    if first == "_":
        if second == "2":
            return None if rest.startswith("_2006") else "_2"  # "_2006" is "_" then the year
        return "__2" if rest.startswith("__2") else None
    return first  # 3, 4, 5


def _fraction_length(layout: str, i: int) -> int:
    """Length of ``.000`` / ``.999`` (or with a comma) at ``i`` when no digit follows it, else 0."""
    digit = layout[i + 1 : i + 2]
    if digit not in ("0", "9"):
        return 0
    end = i + 1
    while end < len(layout) and layout[end] == digit:
        end += 1
    return 0 if layout[end : end + 1].isdecimal() else end - i


def _split_layout(layout: str) -> list[tuple[bool, str]]:
    """The layout as (is_chunk, text) pieces, scanning like Go's nextStdChunk."""
    pieces: list[tuple[bool, str]] = []
    i = literal_start = 0
    while i < len(layout):
        chunk = _chunk_at(layout, i)
        if chunk is None and layout[i] in ".,":
            chunk = layout[i : i + _fraction_length(layout, i)] or None
        if chunk is None:
            i += 1
            continue
        if literal_start < i:
            pieces.append((False, layout[literal_start:i]))
        pieces.append((True, chunk))
        i += len(chunk)
        literal_start = i
    if literal_start < len(layout):
        pieces.append((False, layout[literal_start:]))
    return pieces


@lru_cache(maxsize=256)
def compile_layout(layout: str) -> Formatter:
    """A function formatting a datetime as Go's ``t.Format(layout)`` would."""
    pattern: list[str] = []
    parts: list[str | Formatter] = []  # attribute names and helper functions, in pattern order
    for is_chunk, text in _split_layout(layout):
        if not is_chunk:
            pattern.append(text.replace("%", "%%"))
        elif text in _FIELDS:
            conversion, attribute = _FIELDS[text]
            pattern.append(conversion)
            parts.append(attribute)
        else:
            pattern.append("%s")
            fraction = text[0] in ".,"
            parts.append(_fraction(text[0], len(text) - 1, text[1] == "9") if fraction else _DERIVED[text])
    return _formatter("".join(pattern), parts, layout)


# How much of a "YYYY-MM-DDThh:mm:ss" string each chunk reads.
_PREFIX_BY_CHUNK = {
    **dict.fromkeys(("2006", "06"), 4),
    **dict.fromkeys(("01", "1", "Jan", "January"), 7),
    **dict.fromkeys(("02", "2", "_2", "002", "__2", "Mon", "Monday"), 10),
    **dict.fromkeys(("15", "03", "3", "PM", "pm"), 13),
    **dict.fromkeys(("04", "4"), 16),
    **dict.fromkeys(("05", "5"), 19),
}


@lru_cache(maxsize=256)
def significant_prefix(layout: str) -> int | None:
    """How many leading characters of an RFC 3339 string decide ``Format(layout)``.

    A string's fields are local to its own offset, so without zone or fraction chunks the
    result depends only on that prefix and can be cached by it. None: it depends on more.
    """
    lengths = [_PREFIX_BY_CHUNK.get(text, -1) for is_chunk, text in _split_layout(layout) if is_chunk]
    return None if -1 in lengths else max(lengths, default=0)


def _formatter(pattern: str, parts: list[str | Formatter], layout: str) -> Formatter:
    # %-formatting of attrgetter tuples is about twice as fast as str.format with {0.year}
    if not parts:
        return lambda dt: layout
    if all(isinstance(part, str) for part in parts):
        values = attrgetter(*parts)  # type: ignore[arg-type]
        return lambda dt: pattern % values(dt)
    getters = [attrgetter(part) if isinstance(part, str) else part for part in parts]
    return lambda dt: pattern % tuple([get(dt) for get in getters])


def go_time_string(dt: datetime) -> str:
    """What Go prints for a ``time.Time`` (its ``String`` method)."""
    return compile_layout("2006-01-02 15:04:05.999999999 -0700 MST")(dt)


def parse_rfc3339(text: str) -> datetime | None:
    """The timestamp in an RFC 3339 string (``2020-08-02T18:23:56.291383Z``), else None.

    ``datetime.fromisoformat`` does the work (it is C); the checks after it turn away the
    other ISO 8601 forms it accepts: dates alone, basic and week forms, times without a zone.
    It lets through a few near-misses (``+0200`` offsets, a comma before the fraction).
    """
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        if "t" not in text and "z" not in text:
            return None
        return parse_rfc3339(text.upper())  # RFC 3339 allows lower-case t and z
    # the characters at 7, 10, 13 and 16 of YYYY-MM-DDThh:mm:ss
    if parsed.tzinfo is None or text[7:17:3] != "-T::":
        return None
    return parsed
