"""The compiled fast path of the row buffers (speedups/_rows.pyx) against the pure-Python loops.

The same rows go into a buffer built with the compiled module and one built without it (as
`ChunkBuffer` and `DirectBuffer` are built when `speedups.load("rows")` gives None): every `add`
must return the same, leave the row's dict the same, and the buffers must hand over the same rows.
These tests fail, rather than skip, when the compiled module is not built.
"""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspark import speedups
from eventspark.batch import chunks, direct
from eventspark.batch.chunks import ChunkBuffer, chunk_buffer
from eventspark.batch.direct import DirectBuffer, DirectColumns, direct_columns
from eventspark.destinations.base import ORDER_COLUMN
from eventspark.steps.diff import UnmappedRule
from eventspark.steps.typing import DataType, is_timestamp
from tests.compiled import compiled

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
Buffer = TypeVar("Buffer", ChunkBuffer, DirectBuffer)


def compiled_module() -> ModuleType:
    return compiled("rows")


def pair(owner: ModuleType, make: Callable[[], Buffer]) -> tuple[Buffer, Buffer]:
    """A buffer built with the compiled module and one built without it (`owner._rows`)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(owner, "_rows", compiled_module())
        compiled = make()
        patch.setattr(owner, "_rows", None)
        pure = make()
    assert compiled.fast is not None and pure.fast is None
    return compiled, pure


# --- values of every kind ---------------------------------------------------------------------------


def _timestamp_text(year: int, month: int, day: int, clock: tuple[int, int, int], fraction: str, suffix: str) -> str:
    hour, minute, second = clock
    return f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}{fraction}{suffix}"


offsets = st.builds(
    lambda sign, hours, minutes: f"{sign}{hours:02d}:{minutes:02d}",
    st.sampled_from("+-"),
    st.integers(0, 25),
    st.integers(0, 61),
)
# Near and beyond every edge is_timestamp checks: year 0/1/9999, month and day ranges, leap days,
# hour 24, second 60, fraction lengths 0-10, offsets, and shapes the regex refuses.
timestamps = st.builds(
    _timestamp_text,
    st.one_of(st.sampled_from([0, 1, 2, 1900, 2000, 2024, 2100, 9998, 9999]), st.integers(0, 9999)),
    st.integers(0, 13),
    st.integers(0, 32),
    st.tuples(st.integers(0, 25), st.integers(0, 61), st.integers(0, 61)),
    st.one_of(st.just(""), st.just("."), st.integers(1, 10).map(lambda n: "." + "1234567890"[:n])),
    st.one_of(st.sampled_from(["Z", "z", "", "+0530", "+05:3", "Z ", "\x00"]), offsets),
)
mutated_timestamps = st.tuples(timestamps, st.integers(0, 40), st.sampled_from("0T:-.Z+ ٣\x00x")).map(
    lambda t: t[0][: t[1]] + t[2] + t[0][t[1] + 1 :]
)
texts = st.one_of(st.text(max_size=4), st.text(alphabet="a\x00é", max_size=4), timestamps, mutated_timestamps)
ints = st.one_of(
    st.integers(-5, 5),
    st.sampled_from([INT64_MIN, INT64_MAX, INT64_MIN - 1, INT64_MAX + 1, 2**64, -(2**70), 2**31, -(2**15) - 1]),
)
floats = st.one_of(
    st.floats(),
    st.sampled_from([999.994, 999.995, -999.995, 999.9949999999999, 1e18, -1e20, 0.0, -0.0]),
)
values = st.one_of(st.none(), st.booleans(), ints, floats, texts, st.just([1, "a"]), st.just({"k": 1}))

# Values that fit their column, most of the time: whole rows then take the fast path, or miss it
# by one value, which is where the compiled scan must agree with the loop.
good_ints = st.one_of(st.integers(-1000, 1000), st.sampled_from([INT64_MIN, INT64_MAX]))
good_floats = st.floats(-100, 100)
plain_texts = st.text(alphabet="abé", max_size=4)
good_texts = st.one_of(plain_texts, plain_texts, st.text(alphabet="a\x00", min_size=1, max_size=3))  # NUL: Postgres
good_timestamps = st.builds(
    _timestamp_text,
    st.integers(1990, 2030),
    st.integers(1, 12),
    st.integers(1, 28),
    st.tuples(st.integers(0, 23), st.integers(0, 59), st.integers(0, 59)),
    st.one_of(st.just(""), st.integers(1, 9).map(lambda n: "." + "987654321"[:n])),
    st.sampled_from(["Z", "+02:00", "-00:00", "+00:00", "-23:59"]),
)


class Fit:
    """A column's values: `good` ones (of its kind), or `odd` ones (its kind's edges, any kind)."""

    def __init__(self, good: st.SearchStrategy[Any], edge: st.SearchStrategy[Any]) -> None:
        self.good = good
        self.odd = st.one_of(edge, values)


def fit(good: st.SearchStrategy[Any], edge: st.SearchStrategy[Any]) -> Fit:
    return Fit(good, edge)


def rows(fits: dict[str, Fit]) -> st.SearchStrategy[list[dict[str, Any]]]:
    """Rows of some of these columns in any order: all values good (the whole row can take the
    fast path), all but one (it misses the fast path by that one), or any mix; mostly after a
    row that gives every column a good value (its columns are known by then)."""
    good = st.fixed_dictionaries({}, optional={name: fit.good for name, fit in fits.items()})
    odd = st.fixed_dictionaries({}, optional={name: st.one_of(fit.good, fit.odd) for name, fit in fits.items()})
    one_odd = st.tuples(
        good, st.sampled_from(list(fits)).flatmap(lambda name: st.tuples(st.just(name), fits[name].odd))
    )
    row = st.one_of(good, one_odd.map(lambda both: {**both[0], both[1][0]: both[1][1]}), odd)
    shuffled = row.flatmap(lambda found: st.permutations(list(found.items())).map(dict))
    first = st.fixed_dictionaries({name: fit.good for name, fit in fits.items() if not fit.good.is_empty})
    return st.tuples(st.lists(first, max_size=1), st.lists(shuffled, max_size=15)).map(lambda both: both[0] + both[1])


def outcome(run: Callable[[], object]) -> tuple[str, object]:
    try:
        return "value", run()
    except Exception as exc:  # both paths must fail alike too
        return "raised", (type(exc), str(exc))


def same(got: object, expected: object) -> bool:
    """Equal, with the same types inside (True is not 1, 1.0 is not 1) and NaN equal to itself."""
    if type(got) is not type(expected):
        return False
    if isinstance(got, float):
        return got == expected or (got != got and expected != expected)
    if isinstance(got, list | tuple):
        return len(got) == len(expected) and all(map(same, got, expected))  # type: ignore[arg-type]
    if isinstance(got, dict):
        return list(got) == list(expected) and all(same(got[k], expected[k]) for k in got)  # type: ignore[index]
    return got == expected


def add_both(compiled: Any, pure: Any, row: dict[str, Any], casts: dict[str, str], seq: int) -> None:
    compiled_row, pure_row = copy.deepcopy(row), copy.deepcopy(row)
    got = outcome(lambda: compiled.add(compiled_row, casts, seq))
    expected = outcome(lambda: pure.add(pure_row, casts, seq))
    assert same(got, expected), (row, got, expected)
    assert same(compiled_row, pure_row), (row, compiled_row, pure_row)  # the same values changed


# --- ChunkBuffer --------------------------------------------------------------------------------------

CHUNK_FITS = {
    "a": fit(good_ints, ints),
    "b": fit(good_texts, texts),
    "s": fit(good_texts, texts),
    "n": fit(good_ints, ints),
    "f": fit(good_floats, floats),
    "ok": fit(st.booleans(), ints),
    "when": fit(good_timestamps, timestamps),
    "_timestamp": fit(good_timestamps, timestamps),
    "price": fit(good_floats, floats),
    "blob": fit(st.none(), values),
    "id": fit(good_ints, ints),
    ORDER_COLUMN: fit(st.nothing(), ints),
}
EXISTING = {"n": DataType.INT64, "when": DataType.TIMESTAMP, "s": DataType.STRING, "blob": None}
CASTS = [{}, {"price": "numeric(5,2)"}, {"a": "double", "b": "timestamp"}, {"b": "varchar(3)", "a": "integer"}]


def take_chunk(buffer: ChunkBuffer, json_lines: bool) -> object:
    if json_lines:
        types, lines, header = buffer.take_json()
        return types, bytes(lines), header.table_name, dict(header.fields)
    types, taken, header = buffer.take(ordered=True)
    return types, taken, header.table_name, dict(header.fields)


@settings(max_examples=300, deadline=None)
@given(
    rows(CHUNK_FITS),
    st.sampled_from([None, EXISTING]),
    st.sampled_from([(), ("id",)]),
    st.booleans(),
    st.booleans(),
    st.lists(st.sampled_from(CASTS), min_size=1, max_size=3),
    st.integers(0, 15),
)
def test_chunk_buffers_match_the_reference(
    added: list[dict[str, Any]],
    existing: dict[str, DataType | None] | None,
    primary_keys: tuple[str, ...],
    json_lines: bool,
    holds_nul: bool,
    casts: list[dict[str, str]],
    take_at: int,
) -> None:
    compiled, pure = pair(chunks, lambda: ChunkBuffer("t", existing, primary_keys, json_lines, holds_nul))
    for seq, row in enumerate(added):
        # The casts may change between rows (a column cast to a literal type: every value checked).
        add_both(compiled, pure, row, casts[seq % len(casts)], seq)
        if seq == take_at:  # a chunk handed over midway: the buffers start again alike
            assert same(take_chunk(compiled, json_lines), take_chunk(pure, json_lines))
    assert len(compiled) == len(pure)
    assert same(take_chunk(compiled, json_lines), take_chunk(pure, json_lines))


@settings(max_examples=100, deadline=None)
@given(
    rows(
        {
            "label": fit(good_texts, texts),
            "n": fit(good_ints, ints),
            "extra": fit(texts, texts),
            "other": fit(floats, floats),
        }
    ),
    st.booleans(),
    st.booleans(),
)
def test_unmapped_chunk_buffers_match_the_reference(
    added: list[dict[str, Any]], json_lines: bool, holds_nul: bool
) -> None:
    existing = {"label": DataType.STRING, "n": DataType.INT64, "_unmapped": DataType.STRING}
    rule = UnmappedRule("_unmapped", 0, freeze=True)
    compiled, pure = pair(chunks, lambda: chunk_buffer("t", existing, (), json_lines, rule, holds_nul))
    assert type(compiled) is not ChunkBuffer
    for seq, row in enumerate(added):
        add_both(compiled, pure, row, {}, seq)
    assert same(take_chunk(compiled, json_lines), take_chunk(pure, json_lines))


# --- DirectBuffer -------------------------------------------------------------------------------------

DIRECT_SQL = {
    "event_type": "text",
    "n": "bigint",
    "small": "smallint",
    "x": "numeric(38,18)",
    "price": "numeric(5,2)",
    "ok": "boolean",
    "d": "double precision",
    "code": "character varying(3)",
    "at": "timestamp with time zone",
    "t": "timestamp without time zone",
}


def direct_table() -> DirectColumns:
    from eventspark.destinations.postgres.dialect import DIALECT

    columns = direct_columns(DIRECT_SQL, {name: DIALECT.data_type_of(sql) for name, sql in DIRECT_SQL.items()})
    assert columns is not None
    return columns


DIRECT_ROWS = rows(
    {
        "event_type": fit(good_texts, texts),
        "n": fit(good_ints, ints),
        "small": fit(st.nothing(), ints),  # every value of a checked column misses the fast path
        "x": fit(good_floats, floats),
        "price": fit(st.floats(-999.99, 999.99), floats),
        "ok": fit(st.booleans(), ints),
        "d": fit(good_floats, floats),
        "code": fit(st.nothing(), texts),
        "at": fit(good_timestamps, timestamps),
        "t": fit(good_timestamps.map(lambda text: text[:19] + "Z"), timestamps),
        "missing": fit(st.none(), values),
    }
)


@settings(max_examples=300, deadline=None)
@given(DIRECT_ROWS, st.booleans())
def test_direct_buffers_match_the_reference(added: list[dict[str, Any]], keep: bool) -> None:
    table = direct_table()
    compiled, pure = pair(direct, lambda: DirectBuffer(table, keep))
    for seq, row in enumerate(added):
        add_both(compiled, pure, row, {}, seq)
    assert len(compiled) == len(pure)
    got, expected = compiled.take(), pure.take()
    assert same((got.columns, got.rows, got.kinds), (expected.columns, expected.rows, expected.kinds))


@settings(max_examples=100, deadline=None)
@given(DIRECT_ROWS)
def test_direct_buffers_give_the_same_dicts_to_stage(added: list[dict[str, Any]]) -> None:
    table = direct_table()
    compiled, pure = pair(direct, lambda: DirectBuffer(table))
    for seq, row in enumerate(added):
        add_both(compiled, pure, row, {}, seq)
    assert same(compiled.dicts(), pure.dicts())


# --- the timestamp check in C -------------------------------------------------------------------------


@settings(max_examples=2000, deadline=None)
@given(st.one_of(timestamps, mutated_timestamps, st.text(max_size=36)))
def test_the_c_timestamp_check_accepts_only_what_is_timestamp_accepts(text: str) -> None:
    # It may leave a text to is_timestamp (False), never accept one it refuses.
    if compiled_module().surely_timestamp(text):
        assert is_timestamp(text), text


def test_the_c_timestamp_check_takes_the_common_shapes_itself() -> None:
    # Else every timestamp would call back into Python, and the speed-up would be lost quietly.
    surely = compiled_module().surely_timestamp
    for text in (
        "2026-11-01T00:00:05.763146Z",
        "2020-08-02T18:23:57.5+02:00",
        "2024-02-29T23:59:59.123456789-23:59",
        "0002-01-01T00:00:00Z",
        "9998-12-31T23:59:59+00:00",
    ):
        assert surely(text) and is_timestamp(text), text


def test_the_c_timestamp_check_refuses_every_day_outside_its_month() -> None:
    surely = compiled_module().surely_timestamp
    for year in (1900, 1999, 2000, 2023, 2024, 2100, 2400):
        for month in range(0, 14):
            for day in range(0, 33):
                text = f"{year:04d}-{month:02d}-{day:02d}T12:00:00Z"
                assert surely(text) == is_timestamp(text), text


@pytest.mark.parametrize(
    "text",
    [
        "0001-01-01T00:00:00Z",  # datetime's first year: is_timestamp decides
        "0001-01-01T00:30:00+01:00",  # before datetime's range in UTC
        "9999-12-31T23:00:00-01:00",  # after it
        "2020-01-01T24:00:00Z",
        "2020-01-01T00:00:60Z",
        "2020-01-01T00:00:00+24:00",
        "2020-01-01T00:00:00+00:60",  # datetime takes it (an offset of one hour): is_timestamp decides
        "2020-01-01T00:00:00.Z",
        "2020-01-01T00:00:00.1234567890Z",
        "2020-01-01T00:00:00z",
        "2020-01-01t00:00:00Z",
        "2020-01-01T00:00:00",
        "２020-01-01T00:00:00Z",
        "2020-01-01T00:00:0٣Z",
        "2020-01-01T00:00:00Z\x00",
    ],
)
def test_the_c_timestamp_check_leaves_the_edges_to_is_timestamp(text: str) -> None:
    assert not compiled_module().surely_timestamp(text)


# --- the scan itself ----------------------------------------------------------------------------------


class Marker:
    """A kind that needs a look."""


def test_the_scan_passes_a_row_only_when_every_value_needs_no_work() -> None:
    module = compiled_module()
    calls: list[str] = []

    def counted(text: str) -> bool:
        calls.append(text)
        return is_timestamp(text)

    scan = module.RowScan(text_nul=True, is_timestamp=counted, utc=Marker, bounded=float, bounds={"p": 1.5})
    kinds = {"i": int, "s": str, "b": bool, "t": Marker}
    assert scan.passes({"i": INT64_MAX, "s": "x", "b": True, "gone": None, "t": "2020-01-01T00:00:00Z"}, kinds)
    assert calls == []  # the common shape is checked in C
    for misfit in ({"i": INT64_MAX + 1}, {"i": True}, {"b": 1}, {"s": "x\x00"}, {"new": 1}, {"t": 5}):
        assert not scan.passes(misfit, kinds), misfit
    assert not scan.passes({"t": "2020-01-01T00:00:00+00:00"}, kinds)  # a UTC column wants the 'Z'
    assert not scan.passes({"t": "0001-01-01T00:00:00Z"}, kinds) or calls == ["0001-01-01T00:00:00Z"]
    columns = ["i", "c", "b"]
    assert scan.take({"b": True, "i": 2}, kinds, columns) == [2, None, True]
    assert scan.take({"b": True, "i": 2, "gone": None}, kinds, columns) == [2, None, True]
    assert scan.take({"b": True, "i": 2, "new": 1}, kinds, columns) is None  # a field without a column
    assert scan.take({"b": True, "i": 2**63}, kinds, columns) is None
    kinds["i"] = bool  # changed in place after a miss: the next take sees it
    assert scan.take({"i": False}, kinds, columns) == [False, None, None]


def test_the_scan_compares_floats_with_the_columns_bound() -> None:
    scan = compiled_module().RowScan(text_nul=False, is_timestamp=is_timestamp, bounded=Marker, bounds={"p": 1.5})
    kinds = {"p": Marker}
    assert scan.passes({"p": 1.4999}, kinds) and scan.passes({"p": -1.4999}, kinds)
    for misfit in (1.5, -1.5, float("nan"), float("inf"), 1):
        assert not scan.passes({"p": misfit}, kinds), misfit


def test_buffers_take_the_compiled_path_unless_turned_off() -> None:
    compiled_module()
    assert (ChunkBuffer("t", None).fast is not None) is not speedups.pure()
    assert (DirectBuffer(direct_table()).fast is not None) is not speedups.pure()


def test_a_row_refused_after_typing_a_new_column_leaves_every_row_padded() -> None:
    # The refused row typed 'b' before 'n' failed it; the rows taken must still be full width (the
    # differential test found both paths handing over rows shorter than their columns).
    compiled, pure = pair(chunks, lambda: ChunkBuffer("t", {"n": DataType.INT64}))
    for buffer in (compiled, pure):
        assert buffer.add({"a": 1}, {}) is None
        assert buffer.add({"b": "x", "n": "twelve"}, {}) is not None
        assert buffer.add({"a": 2}, {}) is None
        types, taken, _ = buffer.take()
        assert list(types) == ["a", "b", "n"] and taken == [[1, None, None], [2, None, None]]


def test_a_kind_changed_after_a_miss_is_seen_by_the_next_row() -> None:
    # 'b' is text, then cast to varchar(3): the miss (an int) makes every value of it take the
    # check; a compiled scan still holding the old kind would pass the long text over.
    compiled, pure = pair(chunks, lambda: ChunkBuffer("t", None))
    varchar = {"b": "varchar(3)"}
    for row, casts in (({"a": 1, "b": "x"}, {}), ({"a": 2, "b": 5}, varchar), ({"a": 3, "b": "abcdef"}, varchar)):
        add_both(compiled, pure, row, casts, 0)
    assert compiled.add({"a": 4, "b": "abcdef"}, varchar) is not None
    assert same(take_chunk(compiled, False), take_chunk(pure, False))


# --- found in review: what the scan shows to Python code, and rows of a dict subclass -------------


def test_the_scan_never_shows_python_code_a_row_it_has_not_filled() -> None:
    # `take` calls back into Python (is_timestamp) midway through a row's list; a list the cycle
    # collector can find there (gc.get_referrers, gc.get_objects: a profiler, a debugger) still
    # holds NULL items, and reading one crashes the interpreter.
    module = compiled_module()
    number = int("1234567890123")  # made at run time: only the row's list refers to it
    visible: list[int] = []

    def looking(text: str) -> bool:
        visible.extend(id(found) for found in gc.get_referrers(number) if type(found) is list)
        return is_timestamp(text)

    scan = module.RowScan(text_nul=False, is_timestamp=looking, timestamp=Marker)
    kinds = {"n": int, "at": Marker, "z": int}
    row = scan.take({"n": number, "at": "0001-01-01T00:00:00Z", "z": 2}, kinds, ["n", "at", "z"])
    assert row == [number, "0001-01-01T00:00:00Z", 2]
    assert visible == [], "the half-made row was visible to the collector during the callback"


class Fields(dict):  # type: ignore[type-arg]
    """A dict subclass, as a transform or a caller might hand over."""


@pytest.mark.parametrize("keep", [True, False])
def test_a_row_of_a_dict_subclass_is_taken_as_the_loop_takes_it(keep: bool) -> None:
    table = direct_table()
    compiled, pure = pair(direct, lambda: DirectBuffer(table, keep))
    for row in ({"n": 1, "ok": True}, {"n": 2, "event_type": "x"}, {"n": 2**63}):
        add_both(compiled, pure, Fields(row), {}, 0)
    got, expected = compiled.take(), pure.take()
    assert same((got.columns, got.rows), (expected.columns, expected.rows))


@pytest.mark.parametrize("json_lines", [False, True])
def test_a_row_of_a_dict_subclass_goes_into_a_chunk_as_the_loop_puts_it(json_lines: bool) -> None:
    compiled, pure = pair(chunks, lambda: ChunkBuffer("t", None, (), json_lines))
    for row in ({"a": 1, "b": "x"}, {"a": 2, "b": "y"}, {"a": 2.5}):
        add_both(compiled, pure, Fields(row), {}, 0)
    assert same(take_chunk(compiled, json_lines), take_chunk(pure, json_lines))


class Text(str):
    pass


class Number(int):
    pass


class Real(float):
    pass


def test_values_of_subclasses_take_the_loop() -> None:
    # The loop's fast path compares exact types: a subclass (bool of int included) takes the
    # slow path there, so the scan must miss it too.
    table = direct_table()
    compiled, pure = pair(direct, lambda: DirectBuffer(table))
    for row in (
        {"n": 1, "event_type": "a", "d": 0.5, "ok": True, "at": "2020-01-01T00:00:00Z"},
        {"n": Number(2), "event_type": Text("b"), "d": Real(1.5), "ok": 1, "at": Text("2020-01-01T00:00:00Z")},
        {"n": True, "x": Real(2.5), "price": Real(1.25), "t": Text("2020-01-01T00:00:00Z")},
    ):
        add_both(compiled, pure, row, {}, 0)
    got, expected = compiled.take(), pure.take()
    assert same((got.columns, got.rows), (expected.columns, expected.rows))
    chunk, chunk_pure = pair(chunks, lambda: ChunkBuffer("t", None))
    for row in ({"a": 1, "b": "x", "c": 0.5}, {"a": Number(2), "b": Text("y"), "c": Real(1.5)}, {"a": True}):
        add_both(chunk, chunk_pure, row, {}, 0)
    assert same(take_chunk(chunk, False), take_chunk(chunk_pure, False))
