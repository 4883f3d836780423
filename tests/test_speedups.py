"""The compiled speed-ups (`eventspark.speedups`): built by this install, optional to build, and
turned off by `EVENTSPARK_PURE_PYTHON`. Each module's results are compared with its pure-Python
reference in the tests of the step it speeds up."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from eventspark import speedups
from tests.compiled import compiled

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", speedups.MODULES)
def test_each_speedup_is_built_in_this_install(name: str) -> None:
    module = compiled(name)
    assert module.__name__ == f"eventspark.speedups._{name}"
    assert not speedups.stale(module, name), f"_{name}.pyx changed after the build: `make install` rebuilds it"


def test_a_module_built_before_its_source_changed_is_stale(tmp_path: Path) -> None:
    source = Path(speedups.__file__).with_name("_flatten.pyx").stat().st_mtime
    built = tmp_path / "_flatten.so"
    built.write_bytes(b"")
    module = ModuleType("eventspark.speedups._flatten")
    module.__file__ = str(built)
    os.utime(built, (source - 60, source - 60))
    assert speedups.stale(module, "flatten")
    os.utime(built, (source + 60, source + 60))
    assert not speedups.stale(module, "flatten")
    module.__file__ = str(tmp_path / "gone.so")  # nothing to compare: taken as built
    assert not speedups.stale(module, "flatten")


def test_the_environment_variable_turns_them_off() -> None:
    script = "from eventspark import speedups; print(','.join(speedups.missing()))"
    env = {**os.environ, speedups.PURE_ENV: "1"}
    off = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert off.stdout.strip() == ",".join(speedups.MODULES)
    env[speedups.PURE_ENV] = "0"
    on = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert on.stdout.strip() == ""


def test_a_machine_without_a_compiler_still_installs(tmp_path: Path) -> None:
    """The build goes on without a C compiler (the pure-Python steps then run): `make install`
    on a fresh machine must not depend on gcc. In place, as `pip install -e .` builds, in a copy
    of the tree (the built modules left out)."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    command = [sys.executable, "setup.py", "-q", "build_ext", "--inplace", "--build-lib", str(tmp_path / "lib")]
    command += ["--build-temp", str(tmp_path / "tmp")]
    env = {**os.environ, "CC": str(tmp_path / "no-such-compiler")}
    built = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    for name in speedups.MODULES:
        assert f"eventspark.speedups._{name} not built" in built.stderr
    assert not list(tmp_path.rglob("*.so"))
