"""What each session policy costs on the test cluster: the wall time of a batch pass (`run_pass`, a
~1 kB log into DuckDB) with a cold driver, a warm driver whose executors were released, and a warm
driver with warm executors. Run from the repository root (it starts its own cluster, ~3 minutes):

    .venv/bin/python -m tests.cluster.session_costs [--passes 3]

The figures are in docs/spark-clusters.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from eventspark.batch.process import run_pass
from eventspark.batch.session import stop_session
from eventspark.coordination import build_coordination
from tests.batch.helpers import FIXTURE_LOG, duckdb_destination, make_config, put_log
from tests.spark_cluster import StandaloneCluster

IDLE_SEC = 15.0
"""Between passes: longer than the executors' idle timeout (10 s), as between a serve node's passes."""
POLICIES = {
    "cold driver (keep_session: never)": {"keep_session": "never"},
    "warm driver, executors released (auto, dynamic allocation)": {"keep_session": "auto"},
    "warm driver and executors (always, dynamic allocation off)": {
        "keep_session": "always",
        "conf": {"spark.dynamicAllocation.enabled": "false"},
    },
}


def time_passes(master: str, spark: dict[str, object], passes: int) -> list[float]:
    """Seconds per pass; the first pass of every policy is left out (it starts the driver)."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        loaded = make_config(root, {"dd": duckdb_destination()}, spark={"master": master, **spark})
        coordination = build_coordination(None, "bench")
        timings = []
        for number in range(passes + 1):
            put_log(root, FIXTURE_LOG)
            started = time.monotonic()
            result = run_pass(loaded, coordination)
            assert result.ok and result.archived, result
            timings.append(time.monotonic() - started)
            if number < passes:
                time.sleep(IDLE_SEC)
        coordination.close()
        stop_session()
        return timings[1:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--passes", type=int, default=3)
    passes = parser.parse_args().passes
    with StandaloneCluster(workers=2) as cluster:
        print(
            f"standalone cluster {cluster.master_url}: 2 workers x 1 core, {passes} passes each, {IDLE_SEC:g} s apart"
        )
        for name, spark in POLICIES.items():
            timings = time_passes(cluster.master_url, spark, passes)
            shown = ", ".join(f"{t:.1f}" for t in timings)
            print(f"{name:60s} median {statistics.median(timings):5.1f} s  ({shown})", flush=True)


if __name__ == "__main__":
    main()
