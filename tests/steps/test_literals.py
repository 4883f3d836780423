"""Checks of staged text against literal SQL types of mapping casts."""

from __future__ import annotations

import pytest

from eventspark.steps.literals import literal_check


@pytest.mark.parametrize(
    ("sql_type", "good", "bad"),
    [
        (
            "numeric(12,2)",
            ["1.25", "-9999999999.99", "0", "1e3", "0.001"],
            ["abc", "1_000", "NaN", "1e10", "12345678901"],
        ),
        ("NUMERIC( 5 , 5 )", ["0.12345", "-0.5", "0"], ["1", "0.999999"]),  # 0.999999 rounds to 1.00000
        ("decimal", ["9999999999"], ["10000000000", "1e400"]),  # MySQL's default DECIMAL(10,0)
        ("varchar(3)", ["abc", "é€x", ""], ["abcd"]),
        ("character varying(2)", ["ab"], ["abc"]),
        ("FixedString(2)", ["ab"], ["é€"]),  # ClickHouse counts bytes
        ("smallint", ["32767", " -32768 ", "+5", "0" * 5000 + "1"], ["32768", "1.5", "x", "9" * 5000, "１"]),
        ("int", ["2147483647"], ["2147483648"]),
        ("UInt8", ["0", "255"], ["-1", "256"]),
        ("Int64", [str(2**63 - 1)], [str(2**63)]),
        ("double precision", ["1.5", "-2e300", " 3 ", ".5", "5."], ["x", "inf", "nan", "1_0", "１", "1e999"]),
        ("uuid", ["7f1c9a06-1b3e-4c4f-9d55-1b1a2f6f0a11"], ["not-a-uuid"]),
    ],
)
def test_values_that_every_warehouse_takes_pass(sql_type: str, good: list[str], bad: list[str]) -> None:
    check = literal_check(sql_type)
    assert check is not None
    for text in good:
        assert check(text) is None, text
    for text in bad:
        error = check(text)
        assert error is not None and repr(text[:10])[:-1] in error, text


@pytest.mark.parametrize("sql_type", ["jsonb", "date", "LowCardinality(String)", "numeric(2,5)", "text"])
def test_unknown_types_are_left_to_the_warehouse(sql_type: str) -> None:
    assert literal_check(sql_type) is None
