"""`eventspark process` (its own process and Spark, a YAML config) and `serve`'s uploader, into moto S3."""

from __future__ import annotations

import gzip
import time
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from eventspark.batch.uploader import Uploader
from eventspark.logs.incoming import live_log_name
from tests.batch.helpers import event, make_config, put_log, run_cli
from tests.emulators.s3 import S3_KEY_ID
from tests.files.stores import S3Store

pytestmark = pytest.mark.spark
SECRET = "cli-SECRET-5b1e0c"


def test_eventspark_process_writes_objects_from_a_yaml_config(tmp_path: Path, moto_s3: str, s3_bucket: str) -> None:
    config = f"""
log:
  path: {tmp_path / "events"}
spark:
  master: local[2]
api_keys:
  - id: web
    client_secret: web-js
destinations:
  lake:
    type: s3
    s3:
      access_key_id: {S3_KEY_ID}
      secret_access_key: {SECRET}
      bucket: {s3_bucket}
      region: us-east-1
      endpoint: {moto_s3}
      folder: raw
      format: parquet
      compression: gzip
    data_layout:
      table_name_template: "{{{{.event_type}}}}"
"""
    (tmp_path / "eventspark.yaml").write_text(config)
    assert yaml.safe_load(config)["destinations"]["lake"]["data_layout"]["table_name_template"] == "{{.event_type}}"
    incoming = tmp_path / "events" / "incoming"
    incoming.mkdir(parents=True)
    lines = [event(str(i), event_type="click", n=i) for i in range(5)]
    (incoming / live_log_name("web")).write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in lines))

    result = run_cli(tmp_path, "process")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "lake" in result.stdout and "click" in result.stdout and "1 log(s) archived" in result.stdout
    assert SECRET not in result.stdout + result.stderr  # moto takes any secret
    ((key, data),) = S3Store(moto_s3, s3_bucket).objects().items()
    assert key.startswith("raw/click/incoming.tok=web-") and key.endswith(".parquet")
    table = pq.read_table(pa.BufferReader(data))
    assert table.column("n").to_pylist() == [0, 1, 2, 3, 4]
    assert table.schema.field("_timestamp").type == pa.timestamp("us", tz="UTC")


def test_the_uploader_of_serve_writes_objects(spark: Any, tmp_path: Path, moto_s3: str, s3_bucket: str) -> None:
    s3 = S3Store(moto_s3, s3_bucket)
    loaded = make_config(tmp_path, {"lake": s3.destination("json", "gzip")}, log={"uploader_period_sec": 0.2})
    loaded.config.log.path = str(tmp_path / "events")
    uploader = Uploader(loaded)
    uploader.start()
    try:
        log = put_log(tmp_path, [event(str(i)) for i in range(10)])
        deadline = time.monotonic() + 60
        while log.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        uploader.stop(stop_spark=False)  # the session is shared by the whole test run
    assert not log.exists()
    ((key, data),) = s3.objects().items()
    assert key == f"events/{log.name.removesuffix('.log')}.ndjson.gz"
    assert [orjson.loads(line)["eventn_ctx"]["event_id"] for line in gzip.decompress(data).splitlines()] == [
        str(i) for i in range(10)
    ]
