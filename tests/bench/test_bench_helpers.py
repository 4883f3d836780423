"""The benchmarks' own measuring helpers (bench/common.py, bench/batch.py): what they report must
be right for the figures in docs/performance.md to mean anything."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import batch
import common

# A child that holds 200 MB (written, so resident) until killed.
ALLOCATE = "import sys, time; block = b'x' * 200_000_000; print('ready', flush=True); time.sleep(30)"


def test_tree_rss_counts_the_children_of_the_process() -> None:
    alone = common.tree_rss(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", ALLOCATE], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        with_child = common.tree_rss(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert with_child - alone >= 200_000_000


def test_peak_rss_keeps_the_highest_sample() -> None:
    with common.PeakRss(interval=0.01) as rss:
        child = subprocess.Popen([sys.executable, "-c", ALLOCATE], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        time.sleep(0.1)  # a few samples while the child holds its memory
        child.kill()
        child.wait()
    assert rss.peak - common.tree_rss(os.getpid()) >= 200_000_000


@pytest.mark.parametrize(
    ("sql_type", "value", "expected"),
    [
        ("numeric(38,18)", 12.5, Decimal("12.5")),
        ("numeric(38,18)", 3, Decimal("3.0")),
        ("double precision", 0.25, 0.25),
        ("bigint", 7, 7),
        ("boolean", True, True),
        ("text", "a", "a"),
        # A `timestamp` column takes the instant in UTC, without its offset (Postgres drops it).
        ("timestamp without time zone", "2026-11-01T01:00:00+01:00", datetime(2026, 11, 1)),
        (
            "timestamp with time zone",
            datetime(2026, 11, 1, 1, tzinfo=timezone(timedelta(hours=1))),
            datetime(2026, 11, 1, tzinfo=UTC),
        ),
    ],
)
def test_floor_converts_values_to_the_python_type_of_their_column(
    sql_type: str, value: object, expected: object
) -> None:
    converted = batch._converter(sql_type)(value)
    assert converted == expected
    assert type(converted) is type(expected)
