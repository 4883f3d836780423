"""The compiled speed-ups (`eventspark.speedups`) for the tests that compare them with their
pure-Python references: imported directly rather than through `speedups.load`, so that both paths
are compared even when `EVENTSPARK_PURE_PYTHON` turns the compiled one off for the code under test."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

from eventspark import speedups


def compiled(name: str) -> ModuleType:
    """`eventspark.speedups._<name>`; the test fails (not skips) when it is not built."""
    rebuild = "`make install` builds it (or `.venv/bin/python setup.py build_ext --inplace`)"
    try:
        module = importlib.import_module(f"eventspark.speedups._{name}")
    except ImportError as exc:
        pytest.fail(f"eventspark.speedups._{name} is not built in this install: {rebuild} ({exc})")
    if speedups.stale(module, name):
        pytest.fail(f"eventspark.speedups._{name} is older than _{name}.pyx: {rebuild}")
    return module
