"""The INSERT ... SELECT that moves staged chunks into a target."""

from __future__ import annotations

import pytest

from eventspark.destinations.base import ORDER_COLUMN, Load, StagedChunk, data_type_of_sql
from eventspark.destinations.load_sql import cast_expr, insert_select
from eventspark.destinations.postgres.dialect import DIALECT
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
    sql = insert_select(Load("d", table, chunks, ["f"], ordered=True), DIALECT.quote, '"x"."t"', lambda c: c.ref)
    assert sql.startswith('INSERT INTO "x"."t" ("id", "n") SELECT DISTINCT ON ("id") "id", "n" FROM (')
    assert 'CAST(NULL AS bigint) AS "n", "_es_seq" FROM s1 UNION ALL' in sql
    assert sql.endswith('ORDER BY "id", "_es_seq" DESC ON CONFLICT ("id") DO UPDATE SET "n" = EXCLUDED."n"')
    assert '"old"' not in sql


def test_loading_a_column_the_table_lacks_is_refused() -> None:
    load = Load("d", Table("t", {"a": "text"}), [StagedChunk("s", {"b": DataType.STRING}, 1)], [])
    with pytest.raises(ValueError, match="no column 'b'"):
        insert_select(load, DIALECT.quote, "t", lambda c: c.ref)
