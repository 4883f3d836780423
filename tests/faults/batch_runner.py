"""A batch pass in a process of its own, killed with SIGKILL at a named step (tests/faults/test_batch_kill.py).

    python -m tests.faults.batch_runner CONFIG STEP SIGNALS

STEP is a name the pass's Fault hook is called with ("staged", "pair committed", "task committed",
"committed"):
the process kills itself there, the way a `kill -9` would stop it, with no `finally` run. STEP
"executors" leaves the hook alone: the first Spark task that finishes staging its rows writes
SIGNALS/task-staged and then holds its task open, so that the test kills the process group from
outside while a task is in progress. STEP "executor:<fault>" sets the job plan's
`executor_fault` (`kill-before-commit:<n>`, `kill-after-commit:<n>`): an executor kills itself
around a direct split commit, and the pass fails (local Spark does not retry a lost task); the
runner then exits 1 with the job's error. The pass runs on a SparkSession of its own
(`local[1]`), with splits of `SPLIT_BYTES` (environment) when set. A pass that ends without being
killed exits 3.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from eventspark.batch import job, splits
from eventspark.batch.partition import process_splits
from eventspark.batch.process import run_pass
from eventspark.batch.session import get_session
from eventspark.config import load_config
from eventspark.config.models import SparkConfig
from eventspark.coordination import MemoryCoordination

HOLD_SECONDS = 120
"""How long a task that staged its rows waits for the test's kill (far longer than the test waits)."""


def kill_me(step: str) -> Any:
    """The pass's Fault hook: SIGKILL of this very process at `step`."""

    def fault(at: str) -> None:
        if at == step:
            os.kill(os.getpid(), signal.SIGKILL)

    return fault


def hold_after_staging(signals: str) -> Any:
    """Replaces the executors' entry point: stages as usual, then says so and keeps the task open.

    Defined in __main__, so Spark pickles it by value to its Python worker."""

    def staged_then_hold(plan: Any, index: int, splits: Any) -> list[Any]:
        rows = process_splits(plan, index, splits)
        Path(signals, "task-staged").write_text(str(index))
        time.sleep(HOLD_SECONDS)
        return rows

    return staged_then_hold


def with_executor_fault(fault: str) -> Any:
    """Replaces `BatchJob._plan`: the plan it builds, with `executor_fault` set."""
    planned = job.BatchJob._plan

    def plan(self: Any, *args: Any, **kwargs: Any) -> Any:
        made = planned(self, *args, **kwargs)
        made.executor_fault = fault
        return made

    return plan


def main(config_path: str, step: str, signals: str) -> int:
    loaded = load_config(Path(config_path))
    fault = None
    if "SPLIT_BYTES" in os.environ:
        splits.SPLIT_BYTES = int(os.environ["SPLIT_BYTES"])
    if step == "executors":
        job.process_splits = hold_after_staging(signals)  # type: ignore[assignment]
    elif step.startswith("executor:"):
        job.BatchJob._plan = with_executor_fault(step.removeprefix("executor:"))  # type: ignore[method-assign]
    else:
        fault = kill_me(step)
    session = get_session(SparkConfig(master="local[1]", conf={"spark.sql.shuffle.partitions": "1"}))
    Path(signals, "started").write_text(str(os.getpid()))
    run_pass(loaded, MemoryCoordination("runner"), fault=fault, session=session)
    return 3  # never killed: the step was not reached


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
