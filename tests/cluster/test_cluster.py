"""The standalone cluster of the tests: two ALIVE workers, and an application's tasks run on both."""

from __future__ import annotations

import pytest

from tests.cluster.helpers import run_app
from tests.spark_cluster import StandaloneCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_two_workers_are_alive_and_run_an_applications_tasks(spark_cluster: StandaloneCluster) -> None:
    assert spark_cluster.master_url.startswith("spark://127.0.0.1:")
    assert spark_cluster.workers_alive() == 2
    # 8 one-second tasks: with dynamic allocation (the cluster default) the backlog asks for a
    # second executor within a few seconds, and both take tasks.
    report = run_app(spark_cluster.master_url, "--partitions", "8", "--task-sec", "1")
    assert report["tasks"] == 8
    assert report["executors"] == ["0", "1"], report
    assert all(app["id"] != report["app_id"] for app in spark_cluster.active_apps())  # it ended
