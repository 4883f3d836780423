"""The SparkSession of the batch job: built once per process from `config.spark` and kept warm.

Starting a session costs 10-15 s (a JVM and its classpath), so the uploader and the tests reuse one.

On a cluster master (spark://, k8s://, yarn, ...) a warm session must not keep the cluster's cores
while it idles between passes, or another node's pass waits for ever (issue 20): there the session
asks for executors only while a pass runs and gives them back soon after (dynamic allocation,
`CLUSTER_DEFAULT_CONF`), and `spark.keep_session` says when to stop it after a pass instead
(docs/spark-clusters.md has the measurements behind these defaults).

Before the first start the environment is made to work on a fresh machine: executors run the same
Python as the driver, Spark binds to the loopback address unless told otherwise, and Java 17+ is
checked with a message that says what to install.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import threading
from typing import TYPE_CHECKING

from eventspark import speedups
from eventspark.config.models import SparkConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

MIN_JAVA = 17

# Defaults a user's `spark.conf` may override: the UI is of little use for short batch jobs and
# costs start-up time; reused Python workers keep the steps' caches (UA parser, GeoIP) warm.
DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.python.worker.reuse": "true",
}

# Defaults on cluster masters only (never local[*] or local-cluster[...]), each overridable by
# `spark.conf`: executors are requested while tasks wait and released after 10 s idle, so an idle
# serve node holds no cores. Shuffle tracking stands in for an external shuffle service (none on
# standalone or Kubernetes by default); its timeout and the cached one are bounded because by default
# an executor holding shuffle files or cached blocks would never be released.
CLUSTER_DEFAULT_CONF: dict[str, str] = {
    "spark.dynamicAllocation.enabled": "true",
    "spark.dynamicAllocation.shuffleTracking.enabled": "true",
    "spark.dynamicAllocation.minExecutors": "0",
    "spark.dynamicAllocation.executorIdleTimeout": "10s",
    "spark.dynamicAllocation.shuffleTracking.timeout": "10s",
    "spark.dynamicAllocation.cachedExecutorIdleTimeout": "30s",
}

_lock = threading.Lock()
_session: SparkSession | None = None
_session_key: tuple[str, str, tuple[tuple[str, str], ...]] | None = None


class SparkSetupError(RuntimeError):
    """Spark cannot start on this machine (no Java, an old Java, pyspark missing)."""


def get_session(config: SparkConfig) -> SparkSession:
    """The process's SparkSession for `config`, started on first use and reused afterwards.

    A different master or conf than the running session's stops it and starts a new one.
    """
    global _session, _session_key
    key = (config.master, config.app_name, tuple(sorted(config.conf.items())))
    with _lock:
        if _session is not None and _session_key == key and _is_alive(_session):
            return _session
        if _session is not None:
            _session.stop()
            _session = None
        prepare_environment()
        _session = _build(config)
        _session_key = key
        _log_speedups()
        return _session


def _log_speedups() -> None:
    """Says, once per session, whether the executors run the compiled speed-ups
    (`eventspark.speedups`): without them a pass costs about twice the CPU per event."""
    missing = speedups.missing()
    if not missing:
        log.info("compiled speed-ups in use: %s", ", ".join(speedups.MODULES))
    elif speedups.pure():
        log.info("compiled speed-ups turned off (%s): pure-Python steps", speedups.PURE_ENV)
    else:
        log.warning(
            "compiled speed-ups not built or out of date (%s): pure-Python steps, about twice the CPU per event; "
            "`make install` on a machine with a C compiler builds them",
            ", ".join(missing),
        )


def is_cluster_master(master: str) -> bool:
    """True for a master whose cores other applications share: anything but `local...` (local,
    local[N], local[*], local-cluster[...] all live inside this one process's reach)."""
    return not master.strip().lower().startswith("local")


def session_conf(config: SparkConfig) -> dict[str, str]:
    """The conf a session is built with: the defaults, the cluster defaults on a cluster master,
    then the user's `spark.conf`, which wins."""
    cluster = CLUSTER_DEFAULT_CONF if is_cluster_master(config.master) else {}
    return {**DEFAULT_CONF, **cluster, **config.conf}


def keeps_session(config: SparkConfig) -> bool:
    """Whether the session stays warm after a pass (`spark.keep_session`). `auto` keeps it unless
    it would hold a cluster's cores while idle: a cluster master without dynamic allocation."""
    if config.keep_session != "auto":
        return config.keep_session == "always"
    if not is_cluster_master(config.master):
        return True
    return session_conf(config).get("spark.dynamicAllocation.enabled", "false").lower() == "true"


def release_after_pass(config: SparkConfig) -> None:
    """Called after every pass that used `get_session`: stops the session unless `keeps_session`."""
    if not keeps_session(config):
        log.info("stopping the SparkSession after the pass (spark.keep_session: %s)", config.keep_session)
        stop_session()


def stop_session() -> None:
    """Stops the warm session (at shutdown); the next `get_session` starts a new one."""
    global _session, _session_key
    with _lock:
        if _session is not None:
            _session.stop()
        _session, _session_key = None, None


def prepare_environment(environ: dict[str, str] | os._Environ[str] | None = None) -> None:
    """Sets what pyspark needs and a fresh machine lacks; values already set are kept."""
    env = os.environ if environ is None else environ
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Without it Spark resolves the host name, which on laptops and containers often points nowhere.
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    check_java(env)


def check_java(env: dict[str, str] | os._Environ[str]) -> int:
    """The major version of the Java that Spark will use; SparkSetupError when missing or < 17."""
    java_home = env.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise SparkSetupError(
            f"Java {MIN_JAVA} or newer is needed to run Spark, and none was found "
            f"({'JAVA_HOME=' + java_home if java_home else 'no java on PATH'}). "
            "Install a JDK (e.g. `apt install openjdk-17-jre-headless`) or set JAVA_HOME."
        )
    major = java_major_version(_java_version_text(java))
    if major < MIN_JAVA:
        raise SparkSetupError(
            f"Spark needs Java {MIN_JAVA} or newer; {java} is Java {major}. "
            "Install a newer JDK or point JAVA_HOME at one."
        )
    return major


def _java_version_text(java: str) -> str:
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False)
    except OSError as exc:
        raise SparkSetupError(f"cannot run {java}: {exc}") from exc
    return done.stderr + done.stdout


def java_major_version(text: str) -> int:
    """Parses `java -version` output: '1.8.0_292' is 8, '17.0.15' is 17; 0 when unreadable."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if match is None:
        return 0
    first = int(match.group(1))
    return int(match.group(2) or 0) if first == 1 else first


def _build(config: SparkConfig) -> SparkSession:
    try:
        from pyspark.sql import SparkSession
    except ModuleNotFoundError as exc:
        raise SparkSetupError("pyspark is not installed: pip install pyspark") from exc
    # py4j logs every gateway call at DEBUG, which drowns `--verbose` output.
    logging.getLogger("py4j").setLevel(max(logging.INFO, logging.getLogger("py4j").getEffectiveLevel()))
    builder = SparkSession.builder.master(config.master).appName(config.app_name)
    for name, value in session_conf(config).items():
        builder = builder.config(name, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def _is_alive(session: SparkSession) -> bool:
    context = session.sparkContext
    return context._jsc is not None and not context._jsc.sc().isStopped()
