"""Go's fmt: value printing, print and printf."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventspark.steps.gotemplate.gofmt import go_float, go_value, sprint, sprintf, text_of


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (50.0, "50"),
        (2.5, "2.5"),
        (0.1, "0.1"),
        (123456.0, "123456"),
        (1e6, "1e+06"),
        (9999999.0, "9.999999e+06"),
        (1.5e16, "1.5e+16"),
        (0.0001, "0.0001"),
        (0.00001, "1e-05"),
        (-2.75, "-2.75"),
        (-0.0, "-0"),
        (float("inf"), "+Inf"),
        (float("nan"), "NaN"),
    ],
)
def test_floats_print_like_go(value: float, expected: str) -> None:
    assert go_float(value) == expected


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_float_printing_round_trips(value: float) -> None:
    assert float(go_float(value)) == value


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"b": [1, None], "a": {"y": True, "x": 1.0}}, "map[a:map[x:1 y:true] b:[1 <nil>]]"),
        ([], "[]"),
        ({}, "map[]"),
        ("text", "text"),
    ],
)
def test_composites_print_like_go(value: object, expected: str) -> None:
    assert go_value(value) == expected


def test_top_level_null_prints_null() -> None:
    assert text_of(None) == "null"
    assert go_value(None) == "<nil>"


@pytest.mark.parametrize(
    ("template", "args", "expected"),
    [
        ("%6.2f|", (3.14159,), "  3.14|"),
        ("%08.3f", (-3.14159,), "-003.142"),
        (
            "%e %E %g %G %.3g",
            (1234.5678, 1234.5678, 1234.5678, 1e21, 1234.5678),
            "1.234568e+03 1.234568E+03 1234.5678 1E+21 1.23e+03",
        ),
        ("%d %+d % d %5d|%-5d|%05d %.3d", (1, 2, 3, 4, 5, -42, 7), "1 +2  3     4|5    |-0042 007"),
        ("%x %X %#x %o %O %b %c", (255, 255, 255, 8, 8, 5, 65), "ff FF 0xff 10 0o10 101 A"),
        ("%s|%5s|%-5s|%.2s|%05s", ("ab", "ab", "ab", "abc", "ab"), "ab|   ab|ab   |ab|000ab"),
        ("%q %x %X", ('a"b\n', "hi", "hi"), '"a\\"b\\n" 6869 6869'),
        ("%q", (0x263A,), "'☺'"),
        ("%t %v", (True, False), "true false"),
        ("%v %d", ([1, 2], [1, 2]), "[1 2] [1 2]"),
        ("100%%", (), "100%"),
    ],
)
def test_printf_verbs(template: str, args: tuple[object, ...], expected: str) -> None:
    assert sprintf(template, args) == expected


@pytest.mark.parametrize(
    ("template", "args", "expected"),
    [
        ("%d", ("x",), "%!d(string=x)"),
        ("%s", (5,), "%!s(int=5)"),
        ("%t", (1.5,), "%!t(float64=1.5)"),
        ("%d", (True,), "%!d(bool=true)"),
        ("%s %v", (None, None), "%!s(<nil>) <nil>"),
        ("%d %d", (1,), "1 %!d(MISSING)"),
        ("%d", (1, "x", None), "1%!(EXTRA string=x, <nil>)"),
        ("abc%", (), "abc%!(NOVERB)"),
        ("%z", (1,), "%!z(int=1)"),
        ("%s", ({"a": 1},), "map[a:%!s(int=1)]"),
    ],
)
def test_printf_marks_bad_verbs_like_go(template: str, args: tuple[object, ...], expected: str) -> None:
    assert sprintf(template, args) == expected


def test_sprint_spaces_between_non_strings() -> None:
    assert sprint("a", 1, 2, "b", None, 3.0) == "a1 2b<nil> 3"
    assert sprint() == ""


@given(st.integers(), st.integers(min_value=0, max_value=40))
def test_integer_verbs_agree_with_python(number: int, width: int) -> None:
    assert sprintf(f"%{width}d|%x|%o", (number, number, number)) == (f"{number:{width}d}|{number:x}|{number:o}")
