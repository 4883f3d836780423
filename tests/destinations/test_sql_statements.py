"""The shared SQL of commits, markers and stream inserts (destinations/sql/statements.py)."""

from __future__ import annotations

import pytest

from eventspark.destinations.base import ORDER_COLUMN, Load, StagedChunk
from eventspark.destinations.dialect import data_type_of_sql, get_dialect
from eventspark.destinations.postgres.dialect import DIALECT
from eventspark.destinations.sql.statements import (
    cast_expr,
    copy_statements,
    group_by_non_null,
    marker_insert,
    marker_select,
    upsert_clause,
)
from eventspark.steps.diff import Table
from eventspark.steps.typing import DataType


def test_casts_go_up_the_promotion_tree() -> None:
    assert cast_expr('"b"', DataType.BOOL, "bigint") == 'CAST(CAST("b" AS INTEGER) AS bigint)'
    assert cast_expr('"b"', DataType.BOOL, "text") == 'CAST("b" AS text)'
    assert cast_expr('"t"', DataType.TIMESTAMP, "timestamp") == 'CAST(CAST("t" AS TIMESTAMPTZ) AS timestamp)'
    assert cast_expr('"n"', DataType.INT64, "numeric(38,18)") == 'CAST("n" AS numeric(38,18))'


@pytest.mark.parametrize(
    ("sql_type", "expected"),
    [
        ("bigint", DataType.INT64),
        ("numeric(38,18)", DataType.FLOAT64),
        ("double precision", DataType.FLOAT64),
        ("timestamp without time zone", DataType.TIMESTAMP),
        ("TIMESTAMP WITH TIME ZONE", DataType.TIMESTAMP),
        ("character varying(256)", DataType.STRING),
        ("VARCHAR", DataType.STRING),
        ("boolean", DataType.BOOL),
        ("jsonb", None),
        ("uuid", None),
    ],
)
def test_sql_types_map_back_to_data_types(sql_type: str, expected: DataType | None) -> None:
    assert data_type_of_sql(sql_type) is expected


def test_upsert_dedupes_on_the_key_by_order() -> None:
    table = Table("t", {"id": "text", "n": "bigint", "old": "text"}, ("id",))
    chunks = [
        StagedChunk("s1", {"id": DataType.STRING, ORDER_COLUMN: DataType.INT64}, 1),
        StagedChunk("s2", {"id": DataType.STRING, "n": DataType.BOOL, ORDER_COLUMN: DataType.INT64}, 1),
    ]
    load = Load("d", table, chunks, ["f"], ordered=True)
    (sql,) = copy_statements(load, "on_conflict", DIALECT.quote, '"x"."t"', lambda c: c.ref, cast_expr)
    assert sql.startswith('INSERT INTO "x"."t" ("id", "n") SELECT DISTINCT ON ("id") "id", "n" FROM (')
    assert 'CAST(NULL AS bigint) AS "n", "_es_seq" AS "_es_seq" FROM s1 UNION ALL' in sql
    assert sql.endswith('ORDER BY "id", "_es_seq" DESC ON CONFLICT ("id") DO UPDATE SET "n" = EXCLUDED."n"')
    assert '"old"' not in sql


def test_loading_a_column_the_table_lacks_is_refused() -> None:
    load = Load("d", Table("t", {"a": "text"}), [StagedChunk("s", {"b": DataType.STRING}, 1)], [])
    with pytest.raises(ValueError, match="no column 'b'"):
        copy_statements(load, "on_conflict", DIALECT.quote, "t", lambda c: c.ref, cast_expr)


def test_without_a_key_each_chunk_is_its_own_insert() -> None:
    table = Table("t", {"a": "text"})
    chunks = [StagedChunk(f"s{i}", {"a": DataType.STRING}, 1) for i in range(3)]
    statements = copy_statements(
        Load("d", table, chunks, []), "on_conflict", DIALECT.quote, "t", lambda c: c.ref, cast_expr
    )
    assert [s.split(" FROM ")[-1] for s in statements] == ["s0", "s1", "s2"]
    assert not any("UNION" in s or "CONFLICT" in s for s in statements)


@pytest.mark.parametrize(
    ("style", "expected"),
    [
        ("on_conflict", ' ON CONFLICT ("id") DO UPDATE SET "v" = EXCLUDED."v"'),
        ("on_duplicate_key", ' ON DUPLICATE KEY UPDATE "v" = VALUES("v")'),
        ("replacing_engine", ""),
    ],
)
def test_upsert_clause_by_style(style: str, expected: str) -> None:
    assert upsert_clause(style, DIALECT.quote, ["id", "v"], ["id"]) == expected  # type: ignore[arg-type]
    assert upsert_clause(style, DIALECT.quote, ["id", "v"], []) == ""  # type: ignore[arg-type]


def test_upsert_with_only_key_columns_keeps_the_row() -> None:
    assert upsert_clause("on_conflict", DIALECT.quote, ["id"], ["id"]) == ' ON CONFLICT ("id") DO NOTHING'
    assert upsert_clause("on_duplicate_key", DIALECT.quote, ["id"], ["id"]) == ' ON DUPLICATE KEY UPDATE "id" = "id"'


@pytest.mark.parametrize("dialect", ["postgres", "mysql", "clickhouse", "duckdb"])
def test_markers_quote_hostile_file_names(dialect: str) -> None:
    literal = get_dialect(dialect).literal
    load = Load("d'x", Table("t'); DROP TABLE y; --"), [], ["a\\'b", "c"])
    sql = marker_insert("loads", literal, load)
    assert sql is not None and sql.count("),") == 1
    assert literal("a\\'b") in sql and literal("t'); DROP TABLE y; --") in sql
    assert marker_insert("loads", literal, Load("d", Table("t"), [], [])) is None
    assert f"file IN ({literal('x')}, {literal('y')})" in marker_select("loads", literal, "d", ["x", "y"])
    with pytest.raises(ValueError, match="control character"):
        literal("a\x00b")


def test_stream_rows_group_by_their_non_null_columns() -> None:
    rows = [{"a": 1, "b": None}, {"a": 2}, {"a": None, "b": 3}]
    assert group_by_non_null(rows) == {("a",): rows[:2], ("b",): rows[2:]}
