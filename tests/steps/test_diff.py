import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventspark.steps.diff import (
    ColumnLimitError,
    Table,
    TablePatch,
    check_column_limit,
    diff,
    table_from_header,
)
from eventspark.steps.typing import BatchHeader, DataType, Field

columns = st.dictionaries(st.sampled_from("abcdefgh"), st.sampled_from(["text", "bigint", "boolean"]))
key_sets = st.lists(st.sampled_from("abcdefgh"), max_size=3, unique=True).map(tuple)


def test_missing_table_is_created_with_every_column_and_key() -> None:
    wanted = Table("events", {"id": "text", "n": "bigint"}, ("id",))
    patch = diff(None, wanted)
    assert patch == TablePatch("events", create=True, add_columns={"id": "text", "n": "bigint"}, primary_keys=("id",))
    assert not patch.is_empty


def test_created_table_without_keys_sets_none() -> None:
    assert diff(None, Table("t", {"a": "text"})).primary_keys is None


def test_only_missing_columns_are_added_and_types_never_change() -> None:
    existing = Table("events", {"a": "text", "b": "bigint", "old": "text"})
    wanted = Table("events", {"a": "text", "b": "text", "c": "boolean"})
    patch = diff(existing, wanted)
    assert patch == TablePatch("events", create=False, add_columns={"c": "boolean"}, primary_keys=None)


def test_a_table_that_fits_gives_an_empty_patch() -> None:
    existing = Table("t", {"a": "text", "b": "bigint"}, ("a",))
    assert diff(existing, Table("t", {"a": "text"}, ("a",))).is_empty
    assert diff(existing, Table("t", {"b": "bigint"})).is_empty  # no key configured: keep the existing one


def test_primary_key_changes_only_when_configured_and_different() -> None:
    existing = Table("t", {"a": "text", "b": "text"}, ("a",))
    assert diff(existing, Table("t", {}, ("a", "b"))).primary_keys == ("a", "b")
    assert diff(Table("t", {}, ("a", "b")), Table("t", {}, ("b", "a"))).primary_keys is None


@given(columns, columns, key_sets, key_sets)
def test_diff_only_adds(have: dict, want: dict, have_keys: tuple, want_keys: tuple) -> None:
    existing = Table("t", have, have_keys)
    patch = diff(existing, Table("t", want, want_keys))
    assert not patch.create
    assert set(patch.add_columns) == set(want) - set(have)
    assert all(want[name] == sql for name, sql in patch.add_columns.items())
    patched = {**patch.add_columns, **have}
    assert set(patched) >= set(want)  # every wanted column exists afterwards...
    assert all(patched[name] == sql for name, sql in have.items())  # ...and nothing existing changed
    assert existing == Table("t", have, have_keys)  # diff is pure


def test_table_from_header_uses_the_column_type_function() -> None:
    header = BatchHeader("events", {"a": Field(DataType.INT64), "b": Field(DataType.STRING, "varchar(9)")})
    table = table_from_header(header, lambda f: f.sql_type or f.type.name.lower(), ["a"])
    assert table == Table("events", {"a": "int64", "b": "varchar(9)"}, ("a",))


def test_column_limit() -> None:
    existing = Table("t", {"a": "text", "b": "text"})
    patch = diff(existing, Table("t", {"c": "text", "d": "text"}))
    check_column_limit(existing, patch, 4)
    check_column_limit(existing, patch, 0)  # 0: no limit
    with pytest.raises(ColumnLimitError, match=r"'t' would have 4 columns .*max_columns = 3"):
        check_column_limit(existing, patch, 3)
    with pytest.raises(ValueError):
        check_column_limit(None, diff(None, Table("t", {"a": "x", "b": "x"})), 1)
