"""Direct writes in the binary COPY format (`destinations.postgres.direct.binary_data`,
`speedups/_copytext.pyx` `binary_direct_rows`) against the text COPY, the reference: the same
rows go into two tables of the same column types, once each way, through the writer itself, and
the tables must hold the same values (compared as the server prints them). A value whose binary
form the encoder is not sure of sends the whole split as text. These tests fail, rather than
skip, when the module is not built."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventspark.destinations.base import DirectRows
from eventspark.destinations.postgres.direct import PostgresDirectTarget, PostgresDirectWriter, binary_data
from tests.compiled import compiled
from tests.conftest import pg_conninfo

COLUMNS = {
    "b": ("boolean", bool),
    "i8": ("bigint", int),
    "i4": ("integer", int),
    "i2": ("smallint", int),
    "f8": ("double precision", float),
    "s": ("text", str),
    "v": ("character varying(12)", str),
    "n": ("numeric(38,18)", float),
    "nu": ("numeric", float),
    "ts": ("timestamp without time zone", str),
    "ts3": ("timestamp(3) without time zone", str),
    "tz": ("timestamp with time zone", str),
}
NAMES = list(COLUMNS)


@pytest.fixture(scope="module")
def schema() -> Iterator[str]:
    compiled("copytext")
    name = f"t_bin_{uuid.uuid4().hex[:12]}"
    defs = ", ".join(f'"{c}" {t}' for c, (t, _kind) in COLUMNS.items())
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
        for table in ("as_text", "as_binary"):
            conn.execute(f'CREATE TABLE "{name}"."{table}" (seq serial, {defs})')
        keys = "dest_id text, file text, table_name text, PRIMARY KEY (dest_id, file, table_name)"
        conn.execute(f'CREATE TABLE "{name}".loads ({keys})')
    yield name
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{name}" CASCADE')


def direct_rows(rows: list[list[Any]]) -> DirectRows:
    return DirectRows(NAMES, rows, [kind for _t, kind in COLUMNS.values()], [t for t, _kind in COLUMNS.values()])


def load_both(schema: str, rows: list[list[Any]]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The rows written by the writer as text and as binary, read back as the server prints them."""
    split = uuid.uuid4().hex
    for table, binary in (("as_text", False), ("as_binary", True)):
        target = PostgresDirectTarget(pg_conninfo(), schema, "loads", f"pg-{table}", binary=binary)
        writer = PostgresDirectWriter(target)
        try:
            writer.write_split(split, {table: direct_rows(rows)})
        finally:
            writer.close()
    columns = ", ".join(f'"{c}"::text' for c in NAMES)
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        read = [
            conn.execute(f'SELECT {columns} FROM "{schema}"."{table}" ORDER BY seq').fetchall()
            for table in ("as_text", "as_binary")
        ]
        for table in ("as_text", "as_binary"):
            conn.execute(f'TRUNCATE "{schema}"."{table}"')
    return read[0], read[1]


def row(**values: Any) -> list[Any]:
    return [values.get(name) for name in NAMES]


TYPICAL = [
    row(b=True, i8=2**63 - 1, i4=-(2**31), i2=32767, f8=-0.0, s="tab\there é😀", v="cut", n=19.99, nu=1e-7),
    row(ts="2020-08-02T18:23:56.291383Z", ts3="2020-08-02T18:23:56.291683Z", tz="2020-08-02T18:23:56+02:00"),
    row(n=-0.0, nu=1e300, f8=5e-324, ts="1999-12-31T23:59:59Z", tz="0001-01-01T00:00:00.5-15:59"),
    row(n=99999999999999999.5, nu=-123456.789, ts="2400-02-29 00:00:00.000001+00:00", tz="9999-12-31T23:59:59.999999Z"),
    row(n=0.1, nu=100.0, ts="1900-03-01T00:00:00-00:00", tz="2020-01-01T00:00:00-00:30"),
    [None, 1],  # a row shorter than the columns: NULL tail
]


def test_typical_rows_go_binary_and_land_as_the_text_lands(schema: str) -> None:
    assert binary_data(direct_rows(TYPICAL), "utf-8") is not None
    as_text, as_binary = load_both(schema, TYPICAL)
    assert as_binary == as_text and len(as_text) == len(TYPICAL)


@pytest.mark.parametrize(
    "odd",
    [
        row(ts="2020-08-02T18:23:56.2913831Z"),  # more than microseconds: the server rounds
        row(ts="2020-08-02T18:23:56+02:00"),  # a `timestamp` column's values are in UTC
        row(tz="2020-02-30T00:00:00Z"),  # no such day
        row(tz="2020-08-02T24:00:00Z"),
        row(tz="2020-08-02T18:23:60Z"),  # a leap second
        row(tz="2020-08-02t18:23:56z"),
        row(tz="+2020-08-02T18:23:56Z"),
        row(nu=float("nan")),
        row(nu=float("inf")),
        row(s="nul\x00inside"),
        row(i4=True),  # not an int of the column's kind
        row(i2=40000),
    ],
)
def test_a_value_the_encoder_is_unsure_of_sends_the_split_as_text(odd: list[Any]) -> None:
    assert binary_data(direct_rows([TYPICAL[0], odd]), "utf-8") is None


def test_a_column_type_without_a_binary_form_sends_text() -> None:
    rows = DirectRows(["j"], [["{}"]], [str], ["jsonb"])
    assert binary_data(rows, "utf-8") is None
    assert binary_data(direct_rows(TYPICAL), "latin-1") is None
    assert binary_data(DirectRows(NAMES, TYPICAL, [kind for _t, kind in COLUMNS.values()]), "utf-8") is None


def test_a_split_with_an_unsure_value_still_lands_whole(schema: str) -> None:
    rows = [*TYPICAL, row(ts="2020-08-02T18:23:56.2913836Z", nu=float("nan"))]
    as_text, as_binary = load_both(schema, rows)
    assert as_binary == as_text and len(as_binary) == len(rows)


def timestamps(zoned: bool) -> st.SearchStrategy[str]:
    moments = st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30))
    offsets = st.sampled_from(["Z", "+00:00", "-00:00"])
    if zoned:
        offsets = offsets | st.builds(
            lambda sign, h, m: f"{sign}{h:02d}:{m:02d}", st.sampled_from("+-"), st.integers(0, 15), st.integers(0, 59)
        )
    places = st.integers(0, 6)  # more than microseconds goes as text: its own test above

    def text(moment: dt.datetime, offset: str, digits: int, separator: str) -> str:
        base = moment.strftime("%Y-%m-%d") if moment.year >= 1000 else f"{moment.year:04d}{moment.strftime('-%m-%d')}"
        clock = moment.strftime("%H:%M:%S")
        fraction = f".{moment.microsecond:06d}"[: digits + 1] if digits else ""
        return f"{base}{separator}{clock}{fraction}{offset}"

    return st.builds(text, moments, offsets, places, st.sampled_from("T "))


VALUES = {
    "b": st.booleans(),
    "i8": st.integers(-(2**63), 2**63 - 1),
    "i4": st.integers(-(2**31), 2**31 - 1),
    "i2": st.integers(-(2**15), 2**15 - 1),
    "f8": st.floats(allow_nan=False, allow_infinity=False),
    "s": st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=20),
    "v": st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=12),
    "n": st.floats(min_value=-1e19, max_value=1e19) | st.floats(min_value=-1e-3, max_value=1e-3),
    "nu": st.floats(allow_nan=False, allow_infinity=False),
    "ts": timestamps(zoned=False),
    "ts3": timestamps(zoned=False),
    "tz": timestamps(zoned=True),
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(*(st.none() | VALUES[name] for name in NAMES)).map(list), min_size=1, max_size=20))
def test_any_rows_land_binary_as_they_land_as_text(schema: str, rows: list[list[Any]]) -> None:
    assert binary_data(direct_rows(rows), "utf-8") is not None
    as_text, as_binary = load_both(schema, rows)
    assert as_binary == as_text
