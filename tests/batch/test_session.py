"""Preparing a machine for Spark: environment and the Java check."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from eventspark.batch.session import SparkSetupError, check_java, java_major_version, prepare_environment


def test_java_versions_are_read_from_both_numbering_schemes() -> None:
    assert java_major_version('openjdk version "17.0.15" 2025-04-15') == 17
    assert java_major_version('java version "1.8.0_292"') == 8
    assert java_major_version('openjdk version "21" 2023-09-19') == 21
    assert java_major_version("garbage") == 0


def test_missing_java_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SparkSetupError, match="Java 17 or newer is needed"):
        check_java({"JAVA_HOME": str(tmp_path)})


def test_old_java_is_refused(tmp_path: Path) -> None:
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("#!/bin/sh\necho 'java version \"1.8.0_292\"' >&2\n")
    java.chmod(0o755)
    with pytest.raises(SparkSetupError, match="is Java 8"):
        check_java({"JAVA_HOME": str(tmp_path)})


def test_environment_defaults_keep_what_is_set() -> None:
    env = {"SPARK_LOCAL_IP": "10.0.0.5"}
    prepare_environment(env)
    assert env["PYSPARK_PYTHON"] == sys.executable == env["PYSPARK_DRIVER_PYTHON"]
    assert env["SPARK_LOCAL_IP"] == "10.0.0.5"
