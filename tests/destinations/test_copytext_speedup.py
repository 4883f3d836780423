"""The compiled COPY encoder of the Postgres direct writes and stages (speedups/_copytext.pyx)
against psycopg's per-row path (`Copy.set_types` + `Copy.write_row`), the reference.

Both paths run through `copy_rows` on the same rows: into an in-memory COPY (psycopg's `Copy`
over a `FileWriter`), where they must send the same bytes or fail with the same exception; and
into two tables of the machine's Postgres with the column types the pipeline writes, whose
contents must then be the same. These tests fail, rather than skip, when the module is not built.
"""

from __future__ import annotations

import datetime as dt
import io
import math
import uuid
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.copy import Copy, FileWriter

from eventspark import speedups
from eventspark.destinations.base import DirectRows
from eventspark.destinations.postgres import client as client_module
from eventspark.destinations.postgres import direct as direct_module
from eventspark.destinations.postgres.client import copy_binary_rows
from eventspark.destinations.postgres.direct import copy_rows
from tests.compiled import compiled
from tests.conftest import pg_conninfo


def compiled_module() -> ModuleType:
    return compiled("copytext")


@pytest.fixture(scope="module")
def conn() -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_conninfo(), autocommit=True) as connection:
        connection.execute("SET TimeZone = 'UTC'")
        yield connection


def copy_data(conn: psycopg.Connection[Any], direct: DirectRows, compiled: ModuleType | None) -> bytes | str:
    """The bytes `copy_rows` sends for the rows, or the exception it raises (type and message)."""
    out = io.BytesIO()
    try:
        with conn.cursor() as cur, Copy(cur, writer=FileWriter(out)) as copy:
            copy_rows(copy, direct, "utf-8", compiled)
    except Exception as exc:  # the outcome compared between paths
        return f"{type(exc).__name__}: {exc}"
    return out.getvalue()


def test_the_module_is_built() -> None:
    compiled_module()


def test_the_writers_take_it_unless_turned_off() -> None:
    assert client_module.COPYTEXT is (None if speedups.pure() else compiled_module())
    assert direct_module.COPYTEXT is client_module.COPYTEXT


# --- bytes written by hand from the COPY docs (text format) -----------------------------------


def test_the_text_of_each_kind_of_value(conn: psycopg.Connection[Any]) -> None:
    rows: list[list[Any]] = [
        [1, 2.5, True, "plain"],
        [-9223372036854775808, -0.0, False, "tab\there"],
        [2**70, 1e300, None, "line\nfeed\rreturn\\slash"],
        [0, 5e-324, True, "\\N"],
        [None, float("nan"), False, ""],
        [7, float("-inf")],  # the missing tail is NULL
        [12, 100.0, True, "é😀\b\v\f"],
    ]
    expected = (
        b"1\t2.5\tt\tplain\n"
        b"-9223372036854775808\t-0.0\tf\ttab\\there\n"
        b"1180591620717411303424\t1e+300\t\\N\tline\\nfeed\\rreturn\\\\slash\n"
        b"0\t5e-324\tt\t\\\\N\n"
        b"\\N\tnan\tf\t\n"
        b"7\t-inf\t\\N\t\\N\n"
        b"12\t100.0\tt\t\xc3\xa9\xf0\x9f\x98\x80\\b\\v\\f\n"
    )
    direct = DirectRows(["n", "x", "ok", "s"], rows, [int, float, bool, str])
    assert copy_data(conn, direct, compiled_module()) == expected
    assert copy_data(conn, direct, None) == expected


def test_the_rest_of_the_rows_go_to_psycopg_from_the_first_it_must_have(
    conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "BLOCK_SIZE", 16)  # several blocks before the stop
    rows: list[list[Any]] = [[i, f"r{i}"] for i in range(10)]
    rows[6] = [True, "a bool in an int column"]  # psycopg's int8 text dumper writes 1
    rows[8] = [3, "x"]
    direct = DirectRows(["n", "s"], rows, [int, str])
    data = copy_data(conn, direct, compiled_module())
    assert data == copy_data(conn, direct, None)
    assert isinstance(data, bytes) and b"\n1\ta bool in an int column\n" in data


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("a\x00b", "DataError: PostgreSQL text fields cannot contain NUL (0x00) bytes"),
        ("\udc80", "UnicodeEncodeError"),
        (1.5, "TypeError"),
    ],
)
def test_a_value_psycopg_refuses_fails_as_psycopg_fails(conn: psycopg.Connection[Any], value: Any, error: str) -> None:
    direct = DirectRows(["n", "s"], [[1, "ok"], [2, value], [3, "after"]], [int, str])
    outcome = copy_data(conn, direct, compiled_module())
    assert isinstance(outcome, str) and outcome.startswith(error)
    assert outcome == copy_data(conn, direct, None)


def test_a_row_longer_than_the_columns_fails_as_psycopg_fails(conn: psycopg.Connection[Any]) -> None:
    direct = DirectRows(["n"], [[1], [2, 3]], [int])
    outcome = copy_data(conn, direct, compiled_module())
    assert outcome == copy_data(conn, direct, None) == "DataError: expected 1 values in row, got 2"


def test_without_kinds_or_utf8_psycopg_writes_every_row(conn: psycopg.Connection[Any]) -> None:
    """No `kinds`: psycopg picks each value's dumper; another client encoding: psycopg encodes."""
    compiled = compiled_module()
    untyped = DirectRows(["n", "s"], [[1, "a"], ["text", 2]])
    assert copy_data(conn, untyped, compiled) == copy_data(conn, untyped, None) == b"1\ta\ntext\t2\n"
    out = io.BytesIO()
    with conn.cursor() as cur, Copy(cur, writer=FileWriter(out)) as copy:
        copy_rows(copy, DirectRows(["s"], [["é"]], [str]), "latin-1", compiled)
    assert out.getvalue() == b"\xc3\xa9\n"  # psycopg's own dumper (this connection's UTF-8)


# --- differential: any rows, same bytes -----------------------------------------------------------


def texts(characters: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Text of `characters`, with the pieces COPY escapes (or reads specially) more often."""
    pieces = st.text(characters) | st.sampled_from(["\t", "\n", "\r", "\r\n", "\\", "\\N", "\b", "😀"])
    return st.lists(pieces, max_size=4).map("".join)


KINDS: dict[type, st.SearchStrategy[Any]] = {
    bool: st.booleans(),
    int: st.integers(-(2**63), 2**63 - 1) | st.integers(),
    float: st.floats()
    | st.sampled_from([1e300, 5e-324, -0.0, 0.0, 1.0, 100.0, 0.1, 1e16, 1e-5, 123.45, -9.99])
    | st.integers(-(10**9), 10**9).map(lambda n: n / 100),
    str: texts(st.characters(codec="utf-8")),
}
ODD_VALUES = st.sampled_from(["a\x00", "\ud800", 1, 2.5, True, "7", 2**64, b"bytes"])


@st.composite
def direct_rows(draw: st.DrawFn, odd: bool) -> DirectRows:
    kinds = draw(st.lists(st.sampled_from(list(KINDS)), min_size=1, max_size=6))
    value = [st.none() | KINDS[kind] for kind in kinds]
    if odd:  # now and then a value of another type, or one psycopg refuses
        value = [v | ODD_VALUES if draw(st.integers(0, 4)) == 0 else v for v in value]
    row = st.tuples(*value).map(list).flatmap(lambda r: st.integers(0, len(r)).map(lambda n: r[:n]))
    rows = draw(st.lists(row, max_size=30))
    return DirectRows([f"c{i}" for i in range(len(kinds))], rows, kinds)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(direct=direct_rows(odd=False))
def test_any_rows_make_the_bytes_psycopg_makes(conn: psycopg.Connection[Any], direct: DirectRows) -> None:
    assert copy_data(conn, direct, compiled_module()) == copy_data(conn, direct, None)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(direct=direct_rows(odd=True))
def test_any_odd_values_make_the_bytes_or_the_error_of_psycopg(
    conn: psycopg.Connection[Any], direct: DirectRows
) -> None:
    assert copy_data(conn, direct, compiled_module()) == copy_data(conn, direct, None)


# --- differential: the same table contents in the machine's Postgres ------------------------------

COLUMNS = {
    "id": ("bigint", int),
    "n": ("bigint", int),
    "x": ("numeric(38,18)", float),
    "d": ("double precision", float),
    "t": ("text", str),
    "v": ("character varying(12)", str),
    "ok": ("boolean", bool),
    "ts": ("timestamp", str),
    "tz": ("timestamptz", str),
}
STORABLE_TEXT = texts(st.characters(codec="utf-8", exclude_characters="\x00"))
TIMES = st.datetimes(dt.datetime(1900, 1, 1), dt.datetime(2200, 1, 1))
OFFSETS = st.sampled_from(["Z", "+00:00", "+05:30", "-08:00"])
VALUES = {
    "n": st.integers(-(2**63), 2**63 - 1),
    "x": st.integers(-(10**12), 10**12).map(lambda n: n / 1000) | st.floats(-1e19, 1e19),
    "d": st.floats() | st.sampled_from([1e300, 5e-324, -0.0, 3.0]),
    "t": STORABLE_TEXT,
    "v": STORABLE_TEXT.map(lambda s: s[:12]),
    "ok": st.booleans(),
    "ts": TIMES.map(lambda t: t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")),
    "tz": st.tuples(TIMES, OFFSETS).map(lambda p: p[0].strftime("%Y-%m-%dT%H:%M:%S.%f") + p[1]),
}


@st.composite
def table_rows(draw: st.DrawFn) -> list[list[Any]]:
    rows = []
    for i, width in enumerate(draw(st.lists(st.integers(1, len(COLUMNS)), max_size=25))):
        values = [draw(st.none() | VALUES[name]) for name in list(COLUMNS)[1:width]]
        rows.append([i, *values])
    return rows


def twin_tables(conn: psycopg.Connection[Any], defs: str) -> Iterator[tuple[str, str]]:
    """Two tables of columns `defs` in a schema of their own (dropped after): one for each path."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    conn.execute(f'CREATE SCHEMA "{schema}"')
    for table in ("by_psycopg", "by_compiled"):
        conn.execute(f'CREATE TABLE "{schema}".{table} ({defs})')
    yield f'"{schema}".by_psycopg', f'"{schema}".by_compiled'
    conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(scope="module")
def tables(conn: psycopg.Connection[Any]) -> Iterator[tuple[str, str]]:
    yield from twin_tables(conn, ", ".join(f"{name} {sql_type}" for name, (sql_type, _) in COLUMNS.items()))


def copied(conn: psycopg.Connection[Any], table: str, rows: list[list[Any]], compiled: ModuleType | None) -> Any:
    """The table's rows as Postgres writes them (text), after the COPY; or the COPY's error."""
    conn.execute(f"TRUNCATE {table}")
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.SQL(table), sql.SQL(", ").join(sql.Identifier(name) for name in COLUMNS)
    )
    direct = DirectRows(list(COLUMNS), rows, [kind for _, kind in COLUMNS.values()])
    try:
        with conn.cursor() as cur, cur.copy(statement) as copy:
            copy_rows(copy, direct, conn.info.encoding, compiled)
    except psycopg.Error as exc:
        return (exc.sqlstate, type(exc).__name__)
    return conn.execute(f"SELECT r::text FROM {table} r ORDER BY id").fetchall()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=table_rows())
def test_any_rows_land_in_postgres_as_psycopg_writes_them(
    conn: psycopg.Connection[Any], tables: tuple[str, str], rows: list[list[Any]]
) -> None:
    by_psycopg, by_compiled = tables
    assert copied(conn, by_compiled, rows, compiled_module()) == copied(conn, by_psycopg, rows, None)


# --- the binary COPY of the staged path (`PostgresStageWriter`) -------------------------------------

STAGE = {"n": ("bigint", int), "x": ("float8", float), "ok": ("boolean", bool), "s": ("text", str)}


def binary_data(conn: psycopg.Connection[Any], rows: list[list[Any]], compiled: ModuleType | None) -> bytes | str:
    """The bytes `copy_binary_rows` sends for the rows of `STAGE`, or the exception it raises."""
    out = io.BytesIO()
    types = [stage_type for stage_type, _ in STAGE.values()]
    try:
        with conn.cursor() as cur, Copy(cur, binary=True, writer=FileWriter(out)) as copy:
            copy_binary_rows(copy, types, rows, "utf-8", compiled)
    except Exception as exc:  # the outcome compared between paths
        return f"{type(exc).__name__}: {exc}"
    return out.getvalue()


def test_the_binary_fields_of_each_stage_type(conn: psycopg.Connection[Any]) -> None:
    rows: list[list[Any]] = [[-2, 1.5, True, "é\t"], [None, None, False, ""], [2**63 - 1, -0.0, None, None]]
    expected = (
        b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
        # 4 fields: int8 -2, float8 1.5 (0x3FF8...), bool true, text of 3 UTF-8 bytes
        b"\x00\x04"
        + b"\x00\x00\x00\x08\xff\xff\xff\xff\xff\xff\xff\xfe"
        + b"\x00\x00\x00\x08\x3f\xf8"
        + b"\x00" * 6
        + b"\x00\x00\x00\x01\x01"
        + b"\x00\x00\x00\x03\xc3\xa9\t"
        # NULL, NULL, bool false, an empty text
        + b"\x00\x04"
        + b"\xff\xff\xff\xff" * 2
        + b"\x00\x00\x00\x01\x00"
        + b"\x00\x00\x00\x00"
        # the largest int8, float8 -0.0 (the sign bit), NULL, NULL
        + b"\x00\x04"
        + b"\x00\x00\x00\x08\x7f"
        + b"\xff" * 7
        + b"\x00\x00\x00\x08\x80"
        + b"\x00" * 7
        + b"\xff\xff\xff\xff" * 2
        + b"\xff\xff"
    )
    assert binary_data(conn, rows, compiled_module()) == expected
    assert binary_data(conn, rows, None) == expected


def test_no_rows_make_the_header_and_the_trailer(conn: psycopg.Connection[Any]) -> None:
    assert binary_data(conn, [], compiled_module()) == binary_data(conn, [], None)


BINARY_ODD = st.sampled_from(["a\x00", "\ud800", 1, 2.5, True, 2**64, "7", None])


@st.composite
def stage_rows(draw: st.DrawFn, odd: bool) -> list[list[Any]]:
    value = [st.none() | KINDS[kind] for _, kind in STAGE.values()]
    if odd:
        value = [v | BINARY_ODD for v in value]
    rows = draw(st.lists(st.tuples(*value).map(list), max_size=30))
    if odd and rows and draw(st.booleans()):
        rows[draw(st.integers(0, len(rows) - 1))].append(1)  # a row longer than the columns
    return rows


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=stage_rows(odd=False))
def test_any_stage_rows_make_the_binary_psycopg_makes(conn: psycopg.Connection[Any], rows: list[list[Any]]) -> None:
    int64 = [row for row in rows if row[0] is None or -(2**63) <= row[0] < 2**63]
    assert binary_data(conn, int64, compiled_module()) == binary_data(conn, int64, None)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=stage_rows(odd=True))
def test_any_odd_stage_values_make_the_binary_or_the_error_of_psycopg(
    conn: psycopg.Connection[Any], rows: list[list[Any]]
) -> None:
    assert binary_data(conn, rows, compiled_module()) == binary_data(conn, rows, None)


def test_the_rest_of_the_stage_rows_go_to_psycopg(
    conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "BLOCK_SIZE", 16)  # several blocks before the stop
    rows: list[list[Any]] = [[i, i / 4, i % 2 == 0, f"r{i}"] for i in range(10)]
    rows[7][0] = True  # psycopg's int8 binary dumper takes a bool as 1
    data = binary_data(conn, rows, compiled_module())
    assert isinstance(data, bytes) and data == binary_data(conn, rows, None)


@pytest.fixture(scope="module")
def stage_tables(conn: psycopg.Connection[Any]) -> Iterator[tuple[str, str]]:
    defs = ", ".join(f"{name} {stage_type}" for name, (stage_type, _) in STAGE.items())
    yield from twin_tables(conn, f"id bigint, {defs}")


def staged(conn: psycopg.Connection[Any], table: str, rows: list[list[Any]], compiled: ModuleType | None) -> Any:
    """The table's rows as Postgres writes them (text), after the binary COPY; or its error."""
    conn.execute(f"TRUNCATE {table}")
    types = ["bigint", *(stage_type for stage_type, _ in STAGE.values())]
    statement = f"COPY {table} (id, {', '.join(STAGE)}) FROM STDIN (FORMAT BINARY)"
    try:
        with conn.cursor() as cur, cur.copy(statement) as copy:
            copy_binary_rows(copy, types, [[i, *row] for i, row in enumerate(rows)], conn.info.encoding, compiled)
    except psycopg.Error as exc:
        return (exc.sqlstate, type(exc).__name__)
    return conn.execute(f"SELECT r::text FROM {table} r ORDER BY id").fetchall()


STORABLE_STAGE = {"n": VALUES["n"], "x": KINDS[float], "ok": st.booleans(), "s": STORABLE_TEXT}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(*(st.none() | values for values in STORABLE_STAGE.values())).map(list), max_size=25))
def test_any_stage_rows_land_in_postgres_as_psycopg_writes_them(
    conn: psycopg.Connection[Any], stage_tables: tuple[str, str], rows: list[list[Any]]
) -> None:
    by_psycopg, by_compiled = stage_tables
    assert staged(conn, by_compiled, rows, compiled_module()) == staged(conn, by_psycopg, rows, None)


# --- found in review: a list subclass of rows, and arguments out of range --------------------------


class Rows(list):  # type: ignore[type-arg]
    """A list subclass: `copy_rows` and `copy_binary_rows` take it (an isinstance check)."""


def test_a_list_subclass_of_rows_is_written_as_psycopg_writes_it(conn: psycopg.Connection[Any]) -> None:
    rows = Rows([[1, "a"], [None, "b\tc"]])
    direct = DirectRows(["n", "s"], rows, [int, str])
    assert copy_data(conn, direct, compiled_module()) == copy_data(conn, direct, None) == b"1\ta\n\\N\tb\\tc\n"
    stage = Rows([[1, 0.5, True, "a"]])
    data = binary_data(conn, stage, compiled_module())
    assert isinstance(data, bytes) and data == binary_data(conn, stage, None)


@pytest.mark.parametrize("encode", ["text_rows", "binary_rows"])
@pytest.mark.parametrize(("start", "block_size"), [(-1, 1024), (-(2**40), 1024), (0, 0), (0, -5), (0, 2**63 - 1)])
def test_the_encoders_refuse_a_start_or_a_block_size_out_of_range(encode: str, start: int, block_size: int) -> None:
    # A negative start would read before the list's items (no bounds checks in C); a block size
    # of 0 would make `write_blocks` loop for ever on empty blocks.
    rows: list[list[Any]] = [[1, 2.0, True, "x"]]
    with pytest.raises(ValueError, match=r"^(start|block_size) "):
        getattr(compiled_module(), encode)(rows, start, b"ifbs", block_size)


def _float_edges() -> list[float]:
    """Floats where the shortcut of `_put_fixed` (few decimals, without repr's search) could part
    from repr: the edges of its range (1e-3, 1e15) and of the doubles, powers of two and ten and
    their neighbours, values with few decimals and their neighbours, and halves between two
    shortest candidates (b/4 and b/8 near 2**49, where an ulp is 1/8)."""
    edges = [0.0, 5e-324, 2.2250738585072014e-308, 2.225073858507201e-308, 1.7976931348623157e308]
    edges += [0.1, 0.2, 0.3, 1 / 3, 2 / 3, 999.995, 999.9949999999999, 0.0009999999999999998, 999999999999999.9]
    edges += [2.0**e for e in range(-12, 53)] + [float(f"1e{e}") for e in range(-5, 17)]
    edges += [n / 100 for n in range(-1000, 1000, 7)] + [n / 10**k for k in range(1, 18) for n in (1, 5, 12345, 99999)]
    edges += [(2**49 + n) / 4 for n in range(-20, 20)] + [(2**49 + n) / 8 for n in range(-20, 20)]
    edges += [(2**52 - n) / 4 for n in range(1, 10)]
    with_neighbours = [x for edge in edges for x in (edge, math.nextafter(edge, 0), math.nextafter(edge, math.inf))]
    return [x for edge in with_neighbours for x in (edge, -edge)]


def test_the_float_shortcut_writes_repr_at_every_edge(conn: psycopg.Connection[Any]) -> None:
    values = _float_edges()
    data = copy_data(conn, DirectRows(["x"], [[x] for x in values], [float]), compiled_module())
    assert data == copy_data(conn, DirectRows(["x"], [[x] for x in values], [float]), None)
    assert isinstance(data, bytes) and data.split(b"\n")[:-1] == [repr(x).encode() for x in values]


class Text(str):
    def __str__(self) -> str:
        return "changed"


class Number(int):
    def __repr__(self) -> str:
        return "changed"


class Real(float):
    def __repr__(self) -> str:
        return "changed"


def test_values_of_subclasses_are_written_as_psycopg_writes_them(conn: psycopg.Connection[Any]) -> None:
    # bool is an int subclass too: a bool in an int column and an int in a bool column.
    rows: list[list[Any]] = [[Number(5), Real(0.5), True, Text("a\tb")], [True, 1.0, 1, "x"], [1, 2, False, "y"]]
    direct = DirectRows(["n", "x", "ok", "s"], rows, [int, float, bool, str])
    assert copy_data(conn, direct, compiled_module()) == copy_data(conn, direct, None)
    stage = [[Number(5), Real(0.5), True, Text("a")], [True, 1.0, False, "x"]]
    assert binary_data(conn, stage, compiled_module()) == binary_data(conn, stage, None)
