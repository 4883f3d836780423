"""The Spark standalone cluster of these tests (tests/spark_cluster.py): one master and two workers
(1 core, 1 GiB each) on 127.0.0.1, started once per session and stopped with every JVM at the end.

Applications on it run in subprocesses: pytest's own process keeps the shared `local[2]` session.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.spark_cluster import ClusterError, StandaloneCluster


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(workers=2, cores=1, memory="1g", root=tmp_path_factory.mktemp("spark-cluster"))
    try:
        cluster.start()
    except ClusterError as exc:  # fails, never skips: the cluster is what these tests are about
        pytest.fail(f"the standalone Spark cluster did not start: {exc}", pytrace=False)
    yield cluster
    cluster.stop()
