"""The measures of bench/scale.py (`common.tree_cpu`, `scale.machine_busy`) and its --masters: the model's cost
per event comes from them, so they must count a child's CPU and the machine's busy time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import common
import scale

# A child that burns 0.5 s of CPU, then waits to be killed (alive: its time is its own, not reaped).
SPIN = (
    "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\n"
    "print('done', flush=True)\ntime.sleep(30)"
)


def test_tree_cpu_counts_the_cpu_of_a_child() -> None:
    before = common.tree_cpu(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "done\n"
        after = common.tree_cpu(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert after - before >= 0.45


def test_machine_busy_grows_at_least_by_the_cpu_spent_here() -> None:
    before = scale.machine_busy()
    child = subprocess.run([sys.executable, "-c", SPIN.replace("time.sleep(30)", "")], check=True, timeout=30)
    assert child.returncode == 0
    assert scale.machine_busy() - before >= 0.45


def test_masters_are_split_at_the_commas_outside_brackets() -> None:
    assert scale.masters("local[1],local-cluster[2,1,1024],standalone") == [
        "local[1]",
        "local-cluster[2,1,1024]",
        "standalone",
    ]
