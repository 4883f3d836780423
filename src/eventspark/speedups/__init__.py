"""Compiled speed-ups of the executors' hot loops, with the pure-Python steps as the reference.

Each module here (`_flatten`, `_rows`, `_copytext`, `_arenas`) is Cython built by `setup.py` when the machine
has a C compiler (`make install` builds them in place; `Extension(optional=True)`: without a
compiler the install goes on). The Python module it speeds up keeps its own implementation and
takes the compiled one when it loads (`load`); the tests run both on the same inputs and require
the same results. `EVENTSPARK_PURE_PYTHON=1` turns them all off (set it for the driver: local Spark
workers inherit it). A module built before its `.pyx` last changed (a tree updated without
`make install`) is stale: `load` leaves it out with a warning, as its code may not be what the
Python side that calls it expects.
"""

from __future__ import annotations

import importlib
import logging
import os
from pathlib import Path
from types import ModuleType

MODULES = ("flatten", "rows", "copytext", "arenas")
PURE_ENV = "EVENTSPARK_PURE_PYTHON"

log = logging.getLogger(__name__)


def pure() -> bool:
    """Whether the speed-ups are turned off (`EVENTSPARK_PURE_PYTHON` set, not "0")."""
    return os.environ.get(PURE_ENV, "") not in ("", "0")


def load(name: str) -> ModuleType | None:
    """The compiled module `_<name>`; None when turned off, not built or stale (the caller keeps
    its pure-Python implementation)."""
    if pure():
        return None
    try:
        module = importlib.import_module(f"eventspark.speedups._{name}")
    except ImportError:
        return None
    if stale(module, name):
        log.warning("eventspark.speedups._%s is older than its .pyx: not used (`make install` rebuilds it)", name)
        return None
    return module


def stale(module: ModuleType, name: str) -> bool:
    """Whether `module` was built before `_<name>.pyx` last changed. Only where the source sits
    beside it (a source tree, `pip install -e .`): a wheel ships no .pyx."""
    source = Path(__file__).with_name(f"_{name}.pyx")
    try:
        return source.stat().st_mtime > Path(module.__file__ or "").stat().st_mtime
    except OSError:
        return False


def missing() -> list[str]:
    """The speed-ups that are not in use (not built, stale, or all of them when turned off)."""
    return [name for name in MODULES if load(name) is None]
