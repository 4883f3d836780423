"""Two applications on one cluster (issue 20, item 2): a serve node's warm session, idle between
passes, must not keep the cluster's cores from another node's pass. Without the cluster defaults of
`eventspark.batch.session` (dynamic allocation, executors released when idle) the first application
keeps both workers' cores for as long as it lives, and the second waits for ever."""

from __future__ import annotations

import gzip
import time
from pathlib import Path

import pytest

from tests.batch.helpers import FIXTURE_LOG, duck_rows, duckdb_destination, make_config, put_log, run_cli
from tests.cluster.helpers import IdleApp, wait_until
from tests.spark_cluster import StandaloneCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PASS_TIMEOUT_SEC = 120
"""A pass on the cluster takes ~20 s here (a driver JVM, executors, the load); starved, it never ends."""


def test_a_pass_completes_while_another_applications_session_idles(
    spark_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    idle = IdleApp(spark_cluster.master_url, "--partitions", "4", "--task-sec", "0.5")
    try:
        first = idle.wait_idle()
        assert first["executors"], first  # it had executors, so it held the cluster's cores
        make_config(tmp_path, {"dd": duckdb_destination()}, spark={"master": spark_cluster.master_url})
        log = put_log(tmp_path, FIXTURE_LOG)
        content = log.read_bytes()
        started = time.monotonic()
        done = run_cli(tmp_path, "process", timeout=PASS_TIMEOUT_SEC)
        took = time.monotonic() - started
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        assert "1 log(s) archived" in done.stdout
        # Archived whole (a log this small is gzipped by the driver: `EXECUTOR_ARCHIVE_BYTES`).
        (archived,) = (tmp_path / "events" / "archive").glob(f"*/{log.name}.gz")
        assert gzip.decompress(archived.read_bytes()) == content and not log.exists()
        assert duck_rows(tmp_path, 'SELECT count(*) FROM "user_2020_08"') == [(3,)]
        assert idle.alive(), idle.stderr_tail()  # the first session lived through the second's pass

        def first_holds_no_cores() -> bool:
            apps = {app["id"]: app for app in spark_cluster.active_apps()}
            return first["app_id"] in apps and apps[first["app_id"]]["cores"] == 0

        released = wait_until(first_holds_no_cores, timeout=30)
        print(f"second application's pass: {took:.1f} s while the first idled; its cores freed {released:.1f} s later")
    finally:
        idle.close()
