"""Which conf a session gets and whether it outlives a pass: cluster masters get dynamic allocation
(an idle session holds no cores, issue 20) and local masters nothing new; `spark.conf` wins."""

from __future__ import annotations

import pytest

from eventspark.batch.session import CLUSTER_DEFAULT_CONF, is_cluster_master, keeps_session, session_conf
from eventspark.config.models import SparkConfig

CLUSTER_MASTERS = ["spark://127.0.0.1:7077", "k8s://https://10.0.0.1:6443", "yarn", "mesos://m:5050"]
LOCAL_MASTERS = ["local", "local[2]", "local[*]", "local-cluster[2,1,1024]", " LOCAL[4] "]


@pytest.mark.parametrize("master", CLUSTER_MASTERS)
def test_cluster_masters_release_executors_when_idle(master: str) -> None:
    conf = session_conf(SparkConfig(master=master))
    assert is_cluster_master(master)
    assert conf["spark.dynamicAllocation.enabled"] == "true"
    assert conf["spark.dynamicAllocation.shuffleTracking.enabled"] == "true"
    assert conf["spark.dynamicAllocation.minExecutors"] == "0"
    assert conf["spark.ui.enabled"] == "false"  # the general defaults still apply
    assert keeps_session(SparkConfig(master=master))  # the driver stays warm; its executors go


@pytest.mark.parametrize("master", LOCAL_MASTERS)
def test_local_masters_get_no_cluster_defaults(master: str) -> None:
    conf = session_conf(SparkConfig(master=master))
    assert not is_cluster_master(master)
    assert not set(CLUSTER_DEFAULT_CONF) & set(conf)
    assert keeps_session(SparkConfig(master=master))


def test_the_users_conf_wins_over_the_cluster_defaults() -> None:
    config = SparkConfig(
        master="spark://h:7077", conf={"spark.dynamicAllocation.executorIdleTimeout": "120s", "spark.cores.max": 4}
    )
    conf = session_conf(config)
    assert conf["spark.dynamicAllocation.executorIdleTimeout"] == "120s"
    assert conf["spark.cores.max"] == "4"


def test_auto_stops_a_cluster_session_without_dynamic_allocation() -> None:
    off = {"spark.dynamicAllocation.enabled": "false"}
    assert not keeps_session(SparkConfig(master="spark://h:7077", conf=off))
    assert keeps_session(SparkConfig(master="local[2]", conf=off))
    assert keeps_session(SparkConfig(master="spark://h:7077", conf=off, keep_session="always"))


def test_never_stops_every_session_and_bad_values_are_refused() -> None:
    assert not keeps_session(SparkConfig(master="local[2]", keep_session="never"))
    assert not keeps_session(SparkConfig(master="spark://h:7077", keep_session="never"))
    with pytest.raises(ValueError, match="keep_session"):
        SparkConfig(keep_session="sometimes")
