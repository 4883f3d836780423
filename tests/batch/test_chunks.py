"""ChunkBuffer: values checked against existing columns and casts, promoted otherwise."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from eventspark.batch.chunks import ChunkBuffer, chunk_buffer, text_holds_nul, to_stage
from eventspark.destinations.base import ORDER_COLUMN
from eventspark.destinations.postgres.client import PostgresStageTarget
from eventspark.steps.diff import UnmappedRule
from eventspark.steps.typing import DataType

B, INT, F, T, S = DataType.BOOL, DataType.INT64, DataType.FLOAT64, DataType.TIMESTAMP, DataType.STRING


def test_new_columns_take_the_promoted_type_and_values_are_converted() -> None:
    buffer = ChunkBuffer("t", None)
    assert buffer.add({"a": True, "b": 1, "c": "2020-08-02T18:23:56Z"}, {}) is None
    assert buffer.add({"a": 2, "b": 1.5, "c": "text"}, {}) is None
    assert buffer.add({"a": 3, "d": [1]}, {}) is None  # not from flatten, but a constant could be
    columns, rows, header = buffer.take()
    assert columns == {"a": INT, "b": F, "c": S, "d": S}
    assert rows == [[1, 1.0, "2020-08-02T18:23:56Z", None], [2, 1.5, "text", None], [3, None, None, "[1]"]]
    assert {n: f.type for n, f in header.fields.items()} == columns
    assert len(buffer) == 0 and buffer.take()[1] == []


finite = st.floats(allow_nan=False, allow_infinity=False)
values = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), finite, st.text(max_size=3), st.just(2**64))


@given(st.lists(st.dictionaries(st.sampled_from("abcde"), values), max_size=12))
def test_taken_rows_are_the_added_rows_in_column_order(rows: list[dict]) -> None:
    # Rows are kept as lists from the moment they are added: those added before a column came
    # must still get None there, and every value its column's final (promoted) form (2**64:
    # beyond bigint, so its column is a float one).
    buffer = ChunkBuffer("t", None)
    for row in rows:
        assert buffer.add(dict(row), {}) is None
    columns, taken, _ = buffer.take()
    expected = [[None if row.get(c) is None else to_stage(row[c], t) for c, t in columns.items()] for row in rows]
    assert taken == expected


def test_a_timestamp_column_stays_one_while_its_text_parses() -> None:
    buffer = ChunkBuffer("t", None)
    for text in ("2020-08-02T18:23:56Z", "2020-08-02T18:23:57.5+02:00", "9999-12-31T23:00:00+01:00"):
        assert buffer.add({"when": text, "_timestamp": text}, {}) is None
    assert buffer.take()[0] == {"when": T, "_timestamp": T}
    assert buffer.add({"when": "2020-08-02T18:23:56Z", "_timestamp": "2020-08-02T18:23:56Z"}, {}) is None
    # After year 9999 in UTC: not a timestamp, so the column becomes text and the fixed one refuses it.
    assert buffer.add({"when": "9999-12-31T23:00:00-01:00"}, {}) is None
    assert buffer.add({"_timestamp": "9999-12-31T23:00:00-01:00"}, {}) is not None
    assert buffer.take()[0] == {"when": S, "_timestamp": T}


def test_existing_columns_check_values_and_name_the_misfit() -> None:
    buffer = ChunkBuffer("t", {"n": INT, "when": T, "label": S, "blob": None})
    assert buffer.add({"n": "12", "when": "2020-08-02T18:23:56+02:00", "label": 5, "blob": 1.5}, {}) is None
    error = buffer.add({"n": "twelve"}, {})
    assert error is not None and "'n'" in error and "'twelve'" in error
    error = buffer.add({"when": "yesterday"}, {})
    assert error is not None and "'when'" in error and "TIMESTAMP" in error
    assert buffer.add({"n": 2**70}, {}) is not None  # beyond bigint
    columns, rows, _ = buffer.take()
    assert columns == {"n": INT, "when": T, "label": S, "blob": S}
    assert rows == [[12, "2020-08-02T18:23:56+02:00", "5", "1.5"]]


def test_casts_and_timestamp_names_fix_the_type() -> None:
    buffer = ChunkBuffer("t", None)
    casts = {"amount": "numeric(12,2)", "count": "integer"}
    assert buffer.add({"amount": 1.25, "count": "3", "_timestamp": "2020-08-02T18:23:56.1Z"}, casts) is None
    assert buffer.add({"count": "x"}, casts) == "column 'count': value 'x' does not fit a INT64 column"
    assert buffer.add({"_timestamp": 5}, {}) is not None
    columns, rows, header = buffer.take()
    assert columns == {"amount": S, "count": INT, "_timestamp": T}
    assert rows == [["1.25", 3, "2020-08-02T18:23:56.1Z"]]
    assert header.fields["amount"].sql_type == "numeric(12,2)"


def test_a_cast_that_changes_within_a_chunk_widens_the_column_and_converts_earlier_values() -> None:
    # A transform's type hints can cast one column differently from one event to the next.
    buffer = ChunkBuffer("t", None)
    assert buffer.add({"a": ""}, {}) is None
    assert buffer.add({"a": 1.5}, {"a": "double"}) is None
    assert buffer.add({"b": [1, "x"]}, {}) is None
    assert buffer.add({"b": 2}, {"b": "integer"}) is None
    types, rows, _ = buffer.take()
    assert types == {"a": DataType.STRING, "b": DataType.STRING}
    assert rows == [["", None], ["1.5", None], [None, '[1,"x"]'], [None, "2"]]
    lines = ChunkBuffer("t", None, json_lines=True)
    assert lines.add({"a": 1}, {"a": "integer"}) is None
    assert lines.add({"a": "x"}, {"a": "string"}) is None
    types, data, _ = lines.take_json()
    assert types == {"a": DataType.STRING}
    assert data == b'{"a":"1"}\n{"a":"x"}\n'


def test_literal_casts_are_checked_per_value() -> None:
    casts = {"amount": "numeric(5,2)", "code": "varchar(2)"}
    buffer = ChunkBuffer("t", None)
    assert buffer.add({"amount": 1.5, "code": "ab"}, casts) is None
    assert buffer.add({"amount": "999.99", "code": "cd"}, casts) is None
    error = buffer.add({"amount": 1000, "code": "ef"}, casts)
    assert error is not None and "'amount' (numeric(5,2))" in error and "3 digit(s)" in error
    error = buffer.add({"amount": 1, "code": "xyz"}, casts)  # the column's second string: no fast path
    assert error is not None and "'code' (varchar(2))" in error
    assert buffer.take()[1] == [["1.5", "ab"], ["999.99", "cd"]]
    # A table that already has the column: its own type decides (its SQL type is not known here).
    existing = ChunkBuffer("t", {"amount": DataType.FLOAT64, "code": DataType.STRING})
    assert existing.add({"amount": 12345.5, "code": "longer"}, casts) is None
    assert existing.add({"amount": "x"}, casts) is not None


def test_primary_keys_are_required_and_order_is_kept() -> None:
    buffer = ChunkBuffer("t", None, primary_keys=("id",))
    assert buffer.add({"v": 1}, {}) == "primary key field 'id' is missing"
    assert buffer.add({"id": "a"}, {}, seq=7) is None
    columns, rows, _ = buffer.take(ordered=True)
    assert columns == {"id": S, ORDER_COLUMN: INT}
    assert rows == [["a", 7]]


def test_to_stage_forms() -> None:
    assert to_stage(True, S) == "true"
    assert to_stage(True, INT) == 1
    assert to_stage(3, F) == 3.0 and type(to_stage(3, F)) is float
    assert to_stage("2020-08-02T18:23:56Z", T) == "2020-08-02T18:23:56Z"


def test_json_lines_are_encoded_per_row_and_again_after_a_promotion() -> None:
    buffer = ChunkBuffer("t", None, json_lines=True)
    assert buffer.add({"a": 1, "b": "x", "gone": None}, {}) is None
    assert buffer.add({"a": 2**70, "b": "y"}, {}) is None  # beyond 64 bits: orjson refuses it as an int
    assert buffer.add({"a": "text", "c": True}, {}) is None
    columns, lines, header = buffer.take_json()
    assert columns == {"a": S, "b": S, "c": B}
    assert len(buffer) == 0 and [orjson.loads(line) for line in lines.splitlines()] == [
        {"a": "1", "b": "x", "gone": None},
        {"a": str(float(2**70)), "b": "y"},
        {"a": "text", "c": True},
    ]
    assert set(header.fields) == set(columns) and buffer.take_json()[1] == b""


def test_json_lines_of_keyed_rows_carry_the_order_column() -> None:
    buffer = ChunkBuffer("t", None, primary_keys=("id",), json_lines=True)
    assert buffer.add({"id": "a"}, {}, seq=7) is None
    assert buffer.add({"v": 1}, {}, seq=8) is not None  # no key: refused, not encoded
    columns, lines, _ = buffer.take_json()
    assert columns == {"id": S, ORDER_COLUMN: INT}
    assert [orjson.loads(line) for line in lines.splitlines()] == [{"id": "a", ORDER_COLUMN: 7}]


def test_integers_beyond_bigint_never_stay_in_a_bigint_column() -> None:
    buffer = ChunkBuffer("t", None)
    for value in (1, -(2**63) - 1):  # the second after the column is known: the fast path's check
        assert buffer.add({"n": value}, {}) is None
    columns, rows, _ = buffer.take()
    assert columns == {"n": F} and [row[0] for row in rows] == [1.0, float(-(2**63) - 1)]


def test_values_the_stage_cannot_hold_fail_their_event_not_the_chunk() -> None:
    from datetime import date

    for json_lines in (False, True):
        buffer = ChunkBuffer("t", None, json_lines=json_lines)
        error = buffer.add({"n": 10**400}, {})  # a mapping constant could; no float holds it
        assert error is not None and "'n'" in error and len(buffer) == 0
        assert buffer.add({"n": 2**70, "d": date(2026, 11, 24)}, {}) is None
        if json_lines:
            columns, lines, _ = buffer.take_json()
            rows = [orjson.loads(line) for line in lines.splitlines()]
        else:
            columns, lists, _ = buffer.take()
            rows = [dict(zip(columns, row, strict=True)) for row in lists]
        assert columns == {"n": F, "d": T} and rows == [{"n": float(2**70), "d": "2026-11-24T00:00:00.000000Z"}]


def test_the_order_column_name_is_reserved() -> None:
    for keys in ((), ("id",)):
        buffer = ChunkBuffer("t", None, primary_keys=keys, json_lines=bool(keys))
        error = buffer.add({"id": "a", ORDER_COLUMN: 5}, {}, seq=1)
        assert error is not None and "reserved" in error and len(buffer) == 0


def test_int_then_float_needs_no_second_json_encoding_but_bool_then_float_does() -> None:
    buffer = ChunkBuffer("t", None, json_lines=True)
    assert buffer.add({"p": 12}, {}) is None and buffer.add({"p": 12.5}, {}) is None
    encoded = buffer.lines
    columns, lines, _ = buffer.take_json()
    assert columns == {"p": F} and lines is encoded  # not decoded: a JSON number is read as a float
    assert [orjson.loads(line) for line in lines.splitlines()] == [{"p": 12}, {"p": 12.5}]
    assert buffer.add({"q": True}, {}) is None and buffer.add({"q": 2.5}, {}) is None
    columns, lines, _ = buffer.take_json()
    assert columns == {"q": F} and [orjson.loads(line) for line in lines.splitlines()] == [{"q": 1.0}, {"q": 2.5}]


NUL_ERROR = "text cannot hold the character U+0000 (NUL)"


def test_where_text_cannot_hold_nul_a_str_holding_it_fails_its_event_alone() -> None:
    """Postgres text cannot store U+0000: in the stage's COPY it would fail the whole chunk."""
    buffer = ChunkBuffer("t", {"label": S, "n": INT}, holds_nul=False)
    assert buffer.add({"label": "a", "fresh": "b", "n": 1}, {}) is None  # each column's first value
    for column, row in [
        ("label", {"label": "a\x00"}),  # fast path: a column of the table, a str seen before
        ("fresh", {"fresh": "\x00b"}),  # fast path: a column new to the table
        ("other", {"label": "ok", "other": "x\x00y"}),  # slow path: the column's first value
        ("code", {"code": "a\x00"}),  # slow path, cast to a literal type
    ]:
        assert buffer.add(row, {"code": "varchar(8)"}) == f"column {column!r}: {NUL_ERROR}"
    assert buffer.add({"n": "1\x00"}, {}) == f"column 'n': {NUL_ERROR}"  # whatever the column's type
    # A structure staged as JSON text holds the escape `\u0000`, not the character.
    assert buffer.add({"label": {"k": "v\x00"}, "fresh": "c"}, {}) is None
    columns, rows, _ = buffer.take()
    assert list(columns) == ["label", "fresh", "n"]  # no column typed for a failed event alone
    assert rows == [["a", "b", 1], ['{"k":"v\\u0000"}', "c", None]]


def test_elsewhere_text_holding_nul_is_staged() -> None:
    rows = [{"label": "a\x00"}, {"label": "b\x00", "fresh": "\x00"}]
    for json_lines in (False, True):
        buffer = chunk_buffer("t", {"label": S}, (), json_lines, None)
        assert all(buffer.add(dict(row), {}) is None for row in rows)
        if json_lines:
            assert [orjson.loads(line) for line in buffer.take_json()[1].splitlines()] == rows
        else:
            assert buffer.take()[1] == [["a\x00", None], ["b\x00", "\x00"]]


def test_the_stage_target_tells_whether_text_holds_nul() -> None:
    assert text_holds_nul(PostgresStageTarget("host=nowhere", "s", "job")) is False
    assert text_holds_nul(object()) is True  # a stage that does not say: every other warehouse stores it
    rule = UnmappedRule("_unmapped", 0, freeze=True)
    unmapped = chunk_buffer("t", {"label": S}, (), False, rule, holds_nul=False)
    assert type(unmapped) is not ChunkBuffer  # the subclass for a full table passes the flag on
    assert unmapped.add({"label": "a\x00"}, {}) == f"column 'label': {NUL_ERROR}"
