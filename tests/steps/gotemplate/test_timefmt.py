"""Go reference-date layouts and RFC 3339 parsing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventspark.steps.gotemplate.timefmt import compile_layout, go_time_string, parse_rfc3339

STAMP = "2020-08-02T18:23:56.291383Z"  # a Sunday, day 215 of a leap year
PST = timezone(timedelta(hours=-8), "PST")


def fmt(layout: str, when: datetime | None = None) -> str:
    return compile_layout(layout)(when or parse_rfc3339(STAMP))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ("2006_01", "2020_08"),
        ("2006-01-02", "2020-08-02"),
        ("Jan 2, 2006 at 3:04pm (MST)", "Aug 2, 2020 at 6:23pm (UTC)"),
        ("Mon, 02 Jan 2006 15:04:05 MST", "Sun, 02 Aug 2020 18:23:56 UTC"),  # time.RFC1123
        ("Mon Jan _2 15:04:05 2006", "Sun Aug  2 18:23:56 2020"),  # time.ANSIC
        ("02 Jan 06 15:04 -0700", "02 Aug 20 18:23 +0000"),  # time.RFC822Z
        ("2006-01-02T15:04:05Z07:00", "2020-08-02T18:23:56Z"),  # time.RFC3339
        ("2006-01-02T15:04:05.999999999Z07:00", "2020-08-02T18:23:56.291383Z"),  # time.RFC3339Nano
        ("Jan _2 15:04:05.000000", "Aug  2 18:23:56.291383"),  # time.StampMicro
        ("Jan _2 15:04:05.000000000", "Aug  2 18:23:56.291383000"),  # time.StampNano
        ("3:04PM", "6:23PM"),  # time.Kitchen
        ("January Monday", "August Sunday"),
        ("03 3 PM pm", "06 6 PM pm"),
        ("1/2/06 4:5", "8/2/20 23:56"),
        ("002 __2", "215 215"),
        ("15:04:05,000", "18:23:56,291"),
        ("05.9 05.99", "56.2 56.29"),
        ("_2006", "_2020"),
        ("Janet Monthly", "Janet Monthly"),  # Jan/Mon followed by a lower-case letter are text
        ("%d {x} 100%", "%d {x} 800%"),  # "1" is the month, as in Go
        (".0001", ".0008"),  # digits after the zeros: not a fraction, so "01" is the month
        ("no tokens here", "no tokens here"),
    ],
)
def test_go_layouts(layout: str, expected: str) -> None:
    assert fmt(layout) == expected


def test_go_documentation_long_form_round_trip() -> None:
    # From Go's time.Parse documentation: longForm parses "Feb 3, 2013 at 7:54pm (PST)".
    when = datetime(2013, 2, 3, 19, 54, tzinfo=PST)
    assert fmt("Jan 2, 2006 at 3:04pm (MST)", when) == "Feb 3, 2013 at 7:54pm (PST)"


@pytest.mark.parametrize(
    ("offset", "layout", "expected"),
    [
        (timedelta(hours=2), "-0700|-07:00|-07|Z07:00|Z0700|MST", "+0200|+02:00|+02|+02:00|+0200|+0200"),
        (timedelta(hours=-7, minutes=-30), "-0700|Z07:00", "-0730|-07:30"),
        (timedelta(hours=5, seconds=30), "-070000|-07:00:00|Z07:00:00", "+050030|+05:00:30|+05:00:30"),
        (timedelta(0), "-0700|Z07|Z070000", "+0000|Z|Z"),
    ],
)
def test_zone_offsets(offset: timedelta, layout: str, expected: str) -> None:
    when = datetime(2020, 1, 1, tzinfo=timezone(offset))
    assert fmt(layout, when) == expected


def test_midnight_and_noon_on_the_twelve_hour_clock() -> None:
    assert fmt("3PM 03pm", datetime(2020, 1, 1, 0, 5, tzinfo=UTC)) == "12AM 12am"
    assert fmt("3PM 03pm", datetime(2020, 1, 1, 12, 5, tzinfo=UTC)) == "12PM 12pm"


def test_trimmed_fraction_vanishes_when_zero() -> None:
    assert fmt("05.999|05.000", datetime(2020, 1, 1, 0, 0, 7, tzinfo=UTC)) == "07|07.000"


@given(st.datetimes(min_value=datetime(1000, 1, 1), max_value=datetime(9999, 12, 31)))
def test_layouts_agree_with_strftime(when: datetime) -> None:
    # strftime in the C locale is an independent oracle for the tokens both know.
    layout = "2006-01-02 15:04:05 Jan January Mon Monday 002 PM 03"
    assert fmt(layout, when) == when.strftime("%Y-%m-%d %H:%M:%S %b %B %a %A %j %p %I")


def test_go_time_string() -> None:
    assert go_time_string(parse_rfc3339(STAMP)) == "2020-08-02 18:23:56.291383 +0000 UTC"  # type: ignore[arg-type]
    assert go_time_string(datetime(2015, 2, 25, 11, 6, 39, tzinfo=PST)) == "2015-02-25 11:06:39 -0800 PST"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (STAMP, datetime(2020, 8, 2, 18, 23, 56, 291383, tzinfo=UTC)),
        ("2020-08-02T18:23:56Z", datetime(2020, 8, 2, 18, 23, 56, tzinfo=UTC)),
        ("2020-08-02t18:23:56.5z", datetime(2020, 8, 2, 18, 23, 56, 500000, tzinfo=UTC)),
        ("2020-08-02T18:23:56.123456789+02:00", datetime(2020, 8, 2, 16, 23, 56, 123456, tzinfo=UTC)),
    ],
)
def test_parse_rfc3339(text: str, expected: datetime) -> None:
    assert parse_rfc3339(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "user",
        "2020-08-02",
        "2020-08-02T18:23:56",  # no zone
        "2020-08-02T18:23Z",  # no seconds
        "20200802T182356Z",  # ISO 8601 basic form
        "2020-W31-7T18:23:56Z",  # week date
        "2020-13-02T18:23:56Z",
        "2020-08-02T25:00:00Z",
    ],
)
def test_parse_rfc3339_rejects(text: str) -> None:
    assert parse_rfc3339(text) is None
