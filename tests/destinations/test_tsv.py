"""TSV encoding of stage rows, as ClickHouse and MySQL read it back."""

from __future__ import annotations

import pytest

from eventspark.destinations.tsv import NULL, STAGE_ENCODERS, encode_rows, escape
from eventspark.steps.typing import DataType

TEXT = STAGE_ENCODERS[DataType.STRING]


def test_plain_columns_are_kept_as_they_are() -> None:
    assert TEXT(["a", None, "b c", ""]) == ["a", NULL, "b c", ""]
    assert encode_rows(
        [["a", 1, True], [None, None, False]], [TEXT, STAGE_ENCODERS[DataType.INT64], STAGE_ENCODERS[DataType.BOOL]]
    ) == (b"a\t1\t1\n\\N\t\\N\t0\n")


@pytest.mark.parametrize("special", ["\t", "\n", "\r", "\x00", "\\", "\\N"])
def test_a_special_character_anywhere_in_the_column_escapes_that_value(special: str) -> None:
    # Among plain values and NULLs, so that the whole-column check cannot mistake it for a NULL
    # or a separator.
    values = ["plain", None, f"x{special}y", None, "z"]
    assert TEXT(values) == ["plain", NULL, escape(f"x{special}y"), NULL, "z"]
    assert escape(f"x{special}y") != f"x{special}y"
    assert TEXT([special]) == [escape(special)]


def test_escapes_are_the_ones_both_warehouses_read() -> None:
    assert escape("a\\b\tc\nd\re\x00f") == "a\\\\b\\tc\\nd\\re\\0f"
    assert TEXT(["\\N"]) == ["\\\\N"]  # the text "\\N", not a NULL
    assert TEXT([]) == []
