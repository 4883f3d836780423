"""Compiled speed-ups of the executors' hot loops, with the pure-Python steps as the reference.

Each module here (`_flatten`, `_rows`, `_copytext`) is Cython built by `setup.py` when the machine
has a C compiler (`make install` builds them in place; `Extension(optional=True)`: without a
compiler the install goes on). The Python module it speeds up keeps its own implementation and
takes the compiled one when it loads (`load`); the tests run both on the same inputs and require
the same results. `EVENTSPARK_PURE_PYTHON=1` turns them all off (set it for the driver: local Spark
workers inherit it).
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

MODULES = ("flatten", "rows", "copytext")
PURE_ENV = "EVENTSPARK_PURE_PYTHON"

log = logging.getLogger(__name__)


def pure() -> bool:
    """Whether the speed-ups are turned off (`EVENTSPARK_PURE_PYTHON` set, not "0")."""
    return os.environ.get(PURE_ENV, "") not in ("", "0")


def load(name: str) -> ModuleType | None:
    """The compiled module `_<name>`; None when turned off or not built (the caller keeps its
    pure-Python implementation)."""
    if pure():
        return None
    try:
        return importlib.import_module(f"eventspark.speedups._{name}")
    except ImportError:
        return None


def missing() -> list[str]:
    """The speed-ups that are not in use (not built, or all of them when turned off)."""
    return [name for name in MODULES if load(name) is None]
