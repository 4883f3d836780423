from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventspark.steps.flatten import flatten
from eventspark.steps.typing import (
    ALWAYS_TIMESTAMP,
    BatchHeader,
    DataType,
    Field,
    ancestors,
    coerce,
    field_for,
    format_timestamp,
    header_for,
    infer_type,
    is_timestamp,
    parse_generic_type,
    parse_timestamp,
    promote,
)
from tests.shared_data import eventnative_data

TESTDATA = eventnative_data()

types = st.sampled_from(list(DataType))
aware_datetimes = st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC))
int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1)
finite_floats = st.floats(allow_nan=False, allow_infinity=False)
json_scalars = st.one_of(st.booleans(), int64s, finite_floats, st.text(), aware_datetimes.map(format_timestamp))


# --- promotion -------------------------------------------------------------------------------


@given(types, types)
def test_promote_is_commutative(a: DataType, b: DataType) -> None:
    assert promote(a, b) == promote(b, a)


@given(types, types, types)
def test_promote_is_associative(a: DataType, b: DataType, c: DataType) -> None:
    assert promote(promote(a, b), c) == promote(a, promote(b, c))


@given(types)
def test_promote_is_idempotent(a: DataType) -> None:
    assert promote(a, a) == a


@given(types, types)
def test_promote_is_the_lowest_common_ancestor(a: DataType, b: DataType) -> None:
    result = promote(a, b)
    assert result in ancestors(a) and result in ancestors(b)
    common = set(ancestors(a)) & set(ancestors(b))
    # every other common ancestor is above the result
    assert all(other in ancestors(result) for other in common)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (DataType.FLOAT64, DataType.TIMESTAMP, DataType.STRING),  # the design doc's example
        (DataType.BOOL, DataType.INT64, DataType.INT64),
        (DataType.BOOL, DataType.FLOAT64, DataType.FLOAT64),
        (DataType.INT64, DataType.TIMESTAMP, DataType.STRING),
        (DataType.BOOL, DataType.STRING, DataType.STRING),
    ],
)
def test_promote_follows_the_design_tree(a: DataType, b: DataType, expected: DataType) -> None:
    assert promote(a, b) is expected


def test_tree_shape_matches_the_design_doc() -> None:
    assert ancestors(DataType.BOOL) == (DataType.BOOL, DataType.INT64, DataType.FLOAT64, DataType.STRING)
    assert ancestors(DataType.TIMESTAMP) == (DataType.TIMESTAMP, DataType.STRING)


# --- inference -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, DataType.BOOL),
        (False, DataType.BOOL),
        (0, DataType.INT64),
        (-5, DataType.INT64),
        (2**64, DataType.FLOAT64),
        (10.0, DataType.FLOAT64),
        (0.5, DataType.FLOAT64),
        (Decimal("1.5"), DataType.FLOAT64),
        ("2020-08-07T14:43:14.333Z", DataType.TIMESTAMP),
        ("2020-06-16T23:00:00.000000Z", DataType.TIMESTAMP),
        ("2020-08-07T14:43:14+03:00", DataType.TIMESTAMP),
        ("2020-08-07 14:43:14Z", DataType.STRING),
        ("2020-08-07T14:43:14", DataType.STRING),
        ("2020-13-07T14:43:14Z", DataType.STRING),
        ("10", DataType.STRING),
        ("", DataType.STRING),
        (datetime(2020, 1, 1, tzinfo=UTC), DataType.TIMESTAMP),
    ],
)
def test_infer_type(value: object, expected: DataType) -> None:
    assert infer_type(value) is expected


@pytest.mark.parametrize(
    "text",
    [
        "2020-08-07T14:43:14Z",
        "2020-08-07T14:43:14.1Z",
        "2020-08-07T14:43:14.123456789Z",
        "2020-08-07T17:43:14+03:00",
        "2020-08-07T11:43:14-03:00",
    ],
)
def test_parse_timestamp_accepts_rfc3339_and_returns_utc(text: str) -> None:
    parsed = parse_timestamp(text)
    assert parsed is not None
    assert parsed.utcoffset() == timedelta(0)
    assert parsed.replace(microsecond=0) == datetime(2020, 8, 7, 14, 43, 14, tzinfo=UTC)


@pytest.mark.parametrize(
    "text",
    [
        "2020-08-07",
        "2020-08-07T14:43:14",  # no offset
        "2020-08-07t14:43:14Z",
        "2020-08-07T14:43:14+0300",
        "2020-08-07T14:43:14.Z",
        "2020-08-07T14:43:14.1234567890Z",
        "2020-02-30T00:00:00Z",
        "0000-01-01T00:00:00Z",
        "0001-01-01T00:00:00+01:00",  # before year 1 in UTC
        "２０２０-08-07T14:43:14Z",  # non-ASCII digits
        "x" * 25,
    ],
)
def test_parse_timestamp_rejects_non_rfc3339(text: str) -> None:
    assert parse_timestamp(text) is None


@pytest.mark.parametrize(
    "text",
    [
        "2020-08-07T14:43:14Z",
        "2020-08-07T14:43:14.123456789-03:00",
        "2020-08-07",
        "2020-08-07T14:43:14.Z",
        "2020-02-30T00:00:00Z",
        "0000-01-01T00:00:00Z",
        "0001-01-01T00:00:00+01:00",  # before year 1 in UTC
        "0001-01-01T00:00:00-01:00",
        "9999-12-31T23:00:00-01:00",  # after year 9999 in UTC
        "9999-12-31T23:00:00+01:00",
        "2020-W32-5T14:43:14Z",  # ISO week dates: fromisoformat takes them, RFC 3339 does not
        "２０２０-08-07T14:43:14Z",
    ],
)
def test_is_timestamp_is_parse_timestamp_without_the_datetime(text: str) -> None:
    assert is_timestamp(text) is (parse_timestamp(text) is not None)


@given(st.one_of(st.text(), st.datetimes(timezones=st.timezones()).map(lambda moment: moment.isoformat())))
def test_is_timestamp_agrees_with_parse_timestamp(text: str) -> None:
    assert is_timestamp(text) is (parse_timestamp(text) is not None)


@given(aware_datetimes)
def test_format_then_parse_timestamp_round_trips(moment: datetime) -> None:
    assert parse_timestamp(format_timestamp(moment)) == moment


@given(st.datetimes(timezones=st.just(timezone(timedelta(hours=5, minutes=30)))))
def test_parse_timestamp_of_any_offset_is_the_same_instant(moment: datetime) -> None:
    parsed = parse_timestamp(moment.isoformat())
    assert parsed is None or parsed == moment  # None only when UTC leaves datetime's range


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("string", DataType.STRING),
        ("integer", DataType.INT64),
        ("double", DataType.FLOAT64),
        ("TIMESTAMP", DataType.TIMESTAMP),
        (" Boolean ", DataType.BOOL),
        ("numeric(12,2)", None),
        ("LowCardinality(String)", None),
        ("text", None),
    ],
)
def test_parse_generic_type(name: str, expected: DataType | None) -> None:
    assert parse_generic_type(name) is expected


# --- headers ---------------------------------------------------------------------------------


def test_header_for_uses_casts_then_always_timestamp_then_values() -> None:
    row = {
        "_timestamp": "not a time",
        "eventn_ctx_utc_time": "2020-08-07T14:43:14.333Z",
        "amount": 5,
        "when": "x",
        "name": "n",
        "flag": True,
    }
    casts = {"amount": "numeric(12,2)", "when": "timestamp", "missing": "text"}
    header = header_for("events", row, casts)
    assert header.table_name == "events"
    assert header.fields == {
        "_timestamp": Field(DataType.TIMESTAMP),
        "eventn_ctx_utc_time": Field(DataType.TIMESTAMP),
        "amount": Field(DataType.INT64, "numeric(12,2)"),
        "when": Field(DataType.TIMESTAMP),
        "name": Field(DataType.STRING),
        "flag": Field(DataType.BOOL),
    }


def test_always_timestamp_names() -> None:
    for name in ALWAYS_TIMESTAMP:
        assert header_for("t", {name: 1}, {}).fields[name].type is DataType.TIMESTAMP


def test_merge_promotes_per_field_and_keeps_sql_type() -> None:
    first = BatchHeader("t", {"a": Field(DataType.INT64), "b": Field(DataType.BOOL, "numeric(2)")})
    second = BatchHeader("t", {"a": Field(DataType.TIMESTAMP), "b": Field(DataType.FLOAT64), "c": Field(DataType.BOOL)})
    first.merge(second)
    assert first.fields == {
        "a": Field(DataType.STRING),
        "b": Field(DataType.FLOAT64, "numeric(2)"),
        "c": Field(DataType.BOOL),
    }
    second.fields["c"].type = DataType.STRING  # merge copied the field, it does not share it
    assert first.fields["c"].type is DataType.BOOL


def test_merging_the_mixed_type_log_of_the_test_vectors() -> None:
    import orjson

    with open(f"{TESTDATA}/fact_input_with_error_lines_1.0.log", "rb") as log:
        rows = [flatten(orjson.loads(line)) for line in log if line.strip()]
    header = BatchHeader("events")
    for row in rows:
        header.merge(header_for("events", row, {}))
    fields = header.fields
    assert fields["key1_key2"].type is DataType.STRING
    assert fields["key1"].type is DataType.STRING  # 9999999.0, "10" and 120.0
    assert fields["key10_sib1_1"].type is DataType.STRING  # "k" and 50.0
    assert fields["key10"].type is DataType.STRING  # an array
    assert fields["_geo_data_zip"].type is DataType.INT64
    assert fields["_geo_data_latitude"].type is DataType.FLOAT64
    assert fields["_timestamp"].type is DataType.TIMESTAMP
    assert "_geo_data" not in fields  # an empty object gives no column


@given(st.dictionaries(st.text(min_size=1), st.tuples(types, st.none() | st.text(min_size=1))))
def test_batch_header_dict_round_trips(spec: dict[str, tuple[DataType, str | None]]) -> None:
    header = BatchHeader("tbl", {name: Field(t, sql) for name, (t, sql) in spec.items()})
    assert BatchHeader.from_dict(header.to_dict()) == header


@pytest.mark.parametrize(
    "data",
    [
        {"table_name": "t", "fields": {"a": {"type": "INTEGER"}}},
        {"table_name": "t", "fields": {"a": "INT64"}},
        {"table_name": 5, "fields": {}},
        {"table_name": "t", "fields": []},
    ],
)
def test_batch_header_from_dict_rejects_malformed(data: dict) -> None:
    with pytest.raises(ValueError):
        BatchHeader.from_dict(data)


# --- coercion --------------------------------------------------------------------------------


@given(json_scalars, types)
def test_a_value_fits_every_type_its_type_promotes_to(value: object, other: DataType) -> None:
    column = promote(infer_type(value), other)
    coerce(value, column)  # must not raise


@given(json_scalars, types)
def test_coerce_is_idempotent(value: object, to: DataType) -> None:
    try:
        once = coerce(value, to)
    except ValueError:
        return
    assert coerce(once, to) == once


@given(int64s)
def test_int_round_trips_through_string(value: int) -> None:
    assert coerce(coerce(value, DataType.STRING), DataType.INT64) == value


@given(finite_floats)
def test_float_round_trips_through_string(value: float) -> None:
    assert coerce(coerce(value, DataType.STRING), DataType.FLOAT64) == value


@given(st.booleans())
def test_bool_round_trips_through_string_and_int(value: bool) -> None:
    assert coerce(coerce(value, DataType.STRING), DataType.BOOL) is value
    assert coerce(coerce(value, DataType.INT64), DataType.BOOL) is value


@given(aware_datetimes)
def test_timestamp_round_trips_through_string(value: datetime) -> None:
    assert coerce(coerce(value, DataType.STRING), DataType.TIMESTAMP) == value


@pytest.mark.parametrize(
    ("value", "to", "expected"),
    [
        (5, DataType.STRING, "5"),
        (True, DataType.STRING, "true"),
        (1.5, DataType.STRING, "1.5"),
        (True, DataType.INT64, 1),
        (10.0, DataType.INT64, 10),
        ("42", DataType.INT64, 42),
        ("1e3", DataType.INT64, 1000),
        (3, DataType.FLOAT64, 3.0),
        ("2.5", DataType.FLOAT64, 2.5),
        ("TRUE", DataType.BOOL, True),
        (0, DataType.BOOL, False),
        (None, DataType.INT64, None),
        ("2020-08-07T17:43:14+03:00", DataType.TIMESTAMP, datetime(2020, 8, 7, 14, 43, 14, tzinfo=UTC)),
        (datetime(2020, 1, 1), DataType.TIMESTAMP, datetime(2020, 1, 1, tzinfo=UTC)),
        (date(2020, 1, 1), DataType.TIMESTAMP, datetime(2020, 1, 1, tzinfo=UTC)),
    ],
)
def test_coerce_examples(value: object, to: DataType, expected: object) -> None:
    result = coerce(value, to)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("value", "to"),
    [
        ("abc", DataType.INT64),
        (10.5, DataType.INT64),
        (2**63, DataType.INT64),
        ("1_000", DataType.INT64),
        (" 12", DataType.INT64),
        ("١٢", DataType.INT64),
        ("nan", DataType.FLOAT64),
        ("infinity", DataType.FLOAT64),
        (float("inf"), DataType.FLOAT64),
        ("1e999", DataType.FLOAT64),
        (5, DataType.TIMESTAMP),
        ("yesterday", DataType.TIMESTAMP),
        ("yes", DataType.BOOL),
        (2, DataType.BOOL),
        ([1], DataType.INT64),
    ],
)
def test_coerce_refuses_what_does_not_fit(value: object, to: DataType) -> None:
    with pytest.raises(ValueError, match=f"does not fit a {to.name} column"):
        coerce(value, to)


def test_coerce_error_message_is_bounded() -> None:
    with pytest.raises(ValueError) as info:
        coerce("x" * 10_000, DataType.INT64)
    assert len(str(info.value)) < 150


row_names = st.sampled_from(["_timestamp", "eventn_ctx_utc_time", "cast_int", "cast_literal", "x", "y"])
row_values = st.one_of(json_scalars, st.none(), st.integers(min_value=2**63, max_value=2**64))
ROW_CASTS = {"cast_int": "integer", "cast_literal": "numeric(12,2)", "_timestamp": "TIMESTAMP"}


@given(st.lists(st.dictionaries(row_names, row_values), max_size=6))
def test_add_row_equals_merging_per_row_headers(rows: list[dict]) -> None:
    running = BatchHeader("t")
    merged = BatchHeader("t")
    for row in rows:
        running.add_row(row, ROW_CASTS)
        single = BatchHeader("t")
        for name, value in row.items():  # the per-row rules, spelled out without add_row
            if value is None:
                continue
            cast = ROW_CASTS.get(name)
            if cast is not None and parse_generic_type(cast) is not None:
                single.fields[name] = Field(parse_generic_type(cast))
            elif cast is not None:
                single.fields[name] = Field(infer_type(value), cast)
            elif name in ALWAYS_TIMESTAMP:
                single.fields[name] = Field(DataType.TIMESTAMP)
            else:
                single.fields[name] = Field(infer_type(value))
        assert header_for("t", row, ROW_CASTS) == single
        merged.merge(single)
    assert running == merged


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("cast_int", "12", (Field(DataType.INT64), True)),
        ("cast_literal", "12", (Field(DataType.STRING, "numeric(12,2)"), False)),
        ("_timestamp", "x", (Field(DataType.TIMESTAMP), True)),
        ("eventn_ctx_utc_time", 5, (Field(DataType.TIMESTAMP), True)),
        ("x", 5, (Field(DataType.INT64), False)),
    ],
)
def test_field_for(name: str, value: object, expected: tuple[Field, bool]) -> None:
    assert field_for(name, value, ROW_CASTS) == expected


def test_add_row_sees_columns_added_since_it_last_looked() -> None:
    # add_row remembers which columns are not STRING until the number of columns changes
    header = BatchHeader("t")
    header.add_row({"s": "a", "t": "b", "n": 1}, {})
    header.add_row({"s": "a", "t": "b", "n": 2}, {})  # no new column: only n is looked at
    header.add_row({"s": "a", "m": 1}, {})  # a new column
    header.merge(BatchHeader("t", {"f": Field(DataType.BOOL)}))
    header.fields["g"] = Field(DataType.INT64)  # by hand
    header.add_row({"s": "x", "t": "y", "n": 3, "m": 1.5, "f": 2, "g": "text"}, {})
    types = {name: f.type for name, f in header.fields.items()}
    assert types == {
        "s": DataType.STRING,
        "t": DataType.STRING,
        "n": DataType.INT64,
        "m": DataType.FLOAT64,
        "f": DataType.INT64,
        "g": DataType.STRING,
    }
