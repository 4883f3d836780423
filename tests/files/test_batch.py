"""Batch passes on the shared SparkSession into moto S3 and fake-gcs-server: every format read
back by a real reader, table folders, failed events, reruns after a crash, secrets."""

from __future__ import annotations

import csv
import gzip
import io
import logging
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eventspark.batch import splits as splits_module
from eventspark.batch.job import JobResult
from eventspark.batch.load import Fault
from eventspark.batch.process import run_pass
from eventspark.config import LoadedConfig
from eventspark.coordination import MemoryCoordination
from eventspark.logs.status import read_status, status_path
from tests.batch.helpers import event, failed_lines, make_config, put_log
from tests.files.stores import GcsStore, S3Store

pytestmark = pytest.mark.spark

FORMATS = ("json", "flat_json", "csv", "parquet")
EXT = {"json": "ndjson", "flat_json": "ndjson", "csv": "csv", "parquet": "parquet"}


@pytest.fixture(params=["s3", "gcs"])
def store(request: pytest.FixtureRequest) -> S3Store | GcsStore:
    if request.param == "s3":
        return S3Store(request.getfixturevalue("moto_s3"), request.getfixturevalue("s3_bucket"))
    return GcsStore(request.getfixturevalue("fake_gcs"), request.getfixturevalue("gcs_bucket"))


def run(spark: Any, loaded: LoadedConfig, fault: Fault | None = None) -> JobResult:
    return run_pass(loaded, MemoryCoordination("test"), fault=fault, session=spark)


def stem(log: Path) -> str:
    return log.name.removesuffix(".log")


EVENTS = [
    event("1", event_type="click", user={"id": 7, "name": "ann"}, n=1, amount=1, flag=True),
    event("2", event_type="click", user={"id": 8}, n="x", amount=2.5, tags=["a", "b"]),
    event("3", event_type="view", page={"path": '/p,"q"\n'}),
    event("4", event_type=""),  # skipped: the template renders empty
    event("5", event_type="bad", broken={"deeper": 1}),  # fails the template
]
TEMPLATE = "{{.event_type}}{{if .broken}}{{.broken.deeper.Format}}{{end}}"


@pytest.mark.parametrize("compression", ["", "gzip"])
def test_every_format_is_written_once_per_log_and_table_and_read_back(
    spark: Any, tmp_path: Path, store: S3Store | GcsStore, compression: str
) -> None:
    destinations = {
        fmt: store.destination(fmt, compression, folder=f"lake/{fmt}/", template=TEMPLATE) for fmt in FORMATS
    }
    loaded = make_config(tmp_path, destinations)
    log = put_log(tmp_path, EVENTS)

    result = run(spark, loaded)

    assert result.ok, result.pairs
    assert not log.exists()  # every pair uploaded: archived
    objects = store.objects()
    gz = ".gz" if compression else ""
    expected = {
        f"lake/{fmt}/{table}/{stem(log)}.{EXT[fmt]}{gz if fmt != 'parquet' else ''}"
        for fmt in FORMATS
        for table in ("click", "view")
    }
    assert set(objects) == expected

    def body(fmt: str, table: str) -> bytes:
        data = objects[f"lake/{fmt}/{table}/{stem(log)}.{EXT[fmt]}{gz if fmt != 'parquet' else ''}"]
        return gzip.decompress(data) if compression and fmt != "parquet" else data

    # json: the events as received, nested, one per line, after the default enrichment (ip_lookup
    # into eventn_ctx.location: null, as no GeoIP database is configured).
    enriched = [{**e, "eventn_ctx": {**e["eventn_ctx"], "location": None}} for e in EVENTS]
    assert [orjson.loads(line) for line in body("json", "click").splitlines()] == enriched[:2]
    assert [orjson.loads(line) for line in body("json", "view").splitlines()] == [enriched[2]]
    # flat_json: flattened, typed: n promoted to text within the object.
    rows = [orjson.loads(line) for line in body("flat_json", "click").splitlines()]
    assert [(r["eventn_ctx_event_id"], r["user_id"], r["n"]) for r in rows] == [("1", 7, "1"), ("2", 8, "x")]
    assert rows[0]["user_name"] == "ann" and "user" not in rows[0]
    # csv: a header row, then the flattened rows; a field with a comma, quotes and a newline.
    view = list(csv.DictReader(io.StringIO(body("csv", "view").decode())))
    assert view == [
        {
            "_timestamp": "2020-08-02T18:23:56.291383Z",
            "eventn_ctx_event_id": "3",
            "event_type": "view",
            "page_path": '/p,"q"\n',
        }
    ]
    click = list(csv.DictReader(io.StringIO(body("csv", "click").decode())))
    assert [(r["n"], r["amount"], r["flag"]) for r in click] == [("1", "1.0", "true"), ("x", "2.5", "")]
    # parquet: typed columns from the batch header.
    table = pq.read_table(pa.BufferReader(body("parquet", "click")))
    types = {field.name: field.type for field in table.schema}
    assert types["_timestamp"] == pa.timestamp("us", tz="UTC")
    assert types["user_id"] == pa.int64() and types["amount"] == pa.float64() and types["flag"] == pa.bool_()
    assert types["n"] == pa.string()
    assert table.column("eventn_ctx_event_id").to_pylist() == ["1", "2"]
    assert table.column("amount").to_pylist() == [1.0, 2.5]
    # The template failure went to events/failed once per destination; the skip is counted.
    for fmt in FORMATS:
        (failure,) = failed_lines(tmp_path, fmt)
        assert failure["event_id"] == "5" and "table_name_template" in failure["error"]
        assert result.pairs[fmt, ""].skipped == 1


def test_table_name_template_makes_folders_and_unsafe_names_fail_alone(
    spark: Any, tmp_path: Path, moto_s3: str, s3_bucket: str
) -> None:
    s3 = S3Store(moto_s3, s3_bucket)
    destination = s3.destination("flat_json", folder="/lake/events/", template="{{.app}}_{{.event_type}}")
    loaded = make_config(tmp_path, {"d": destination})
    events = [
        event("1", app="web", event_type="a"),
        event("2", app="web", event_type="b"),
        event("3", app="x/../../etc", event_type="c"),  # the template engine makes it x_______etc_c
        event("4", app="a" * 300, event_type="c"),  # longer than a folder name may be
    ]
    log = put_log(tmp_path, events)

    assert run(spark, loaded).ok

    folders = ["web_a", "web_b", "x_______etc_c"]
    assert sorted(s3.objects()) == [f"lake/events/{folder}/{stem(log)}.ndjson" for folder in folders]
    (failure,) = failed_lines(tmp_path, "d")
    assert failure["event_id"] == "4" and "longer than 255 bytes" in failure["error"]


def _crash_at(point: str) -> Fault:
    def crash(at: str) -> None:
        if at == point:
            raise SystemExit(f"crash at {at}")  # not an Exception: nothing may catch it

    return crash


@pytest.mark.parametrize("resplit", [False, True], ids=["same-splits", "other-splits"])
def test_a_rerun_after_a_crash_leaves_one_object_per_log_and_table(
    spark: Any, tmp_path: Path, store: S3Store | GcsStore, monkeypatch: pytest.MonkeyPatch, resplit: bool
) -> None:
    loaded = make_config(tmp_path, {"d": store.destination("json", "gzip", template=TEMPLATE)})
    events = [event(str(i), event_type="ab"[i % 2], n=i) for i in range(40)]
    first = put_log(tmp_path, [*events[:30], EVENTS[4]])
    second = put_log(tmp_path, events[30:])
    # The first pass cuts the logs into small splits: several objects per log and table.
    monkeypatch.setattr(splits_module, "SPLIT_BYTES", 600)

    with pytest.raises(SystemExit):
        run(spark, loaded, fault=_crash_at("pair committed"))  # after the executors wrote every object
    assert first.exists() and not status_path(first).exists()
    parts = store.objects()
    assert sum(".part-" in key for key in parts) > 4

    if resplit:
        monkeypatch.undo()  # the rerun reads each log whole
    result = run(spark, loaded)

    assert result.ok and not first.exists() and not second.exists()
    objects = store.objects()
    if resplit:
        expected = {f"{t}/{stem(log)}.ndjson.gz" for t in "ab" for log in (first, second)}
        assert set(objects) == expected  # the parts of the killed pass are gone
    else:
        assert set(objects) == set(parts)  # the same names, overwritten
    written = [orjson.loads(line) for data in objects.values() for line in gzip.decompress(data).splitlines()]
    assert sorted(e["n"] for e in written) == list(range(40))  # each event once
    assert [f["event_id"] for f in failed_lines(tmp_path, "d")] == ["5"]


def test_secrets_stay_out_of_errors_logs_and_status_files(
    spark: Any, tmp_path: Path, moto_s3: str, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "SECRET-do-not-print-7f3a"
    destination = S3Store(moto_s3, "no-such-bucket-here").destination("csv")
    destination["s3"] |= {"access_key_id": "AKIDSECRET9", "secret_access_key": secret}
    loaded = make_config(tmp_path, {"d": destination})
    log = put_log(tmp_path, [event("1")])

    with caplog.at_level(logging.DEBUG, logger="eventspark"):
        result = run(spark, loaded)

    assert not result.ok
    error = result.pairs["d", "events"].error
    assert "NoSuchBucket" in error and "s3://no-such-bucket-here/" in error
    status = read_status(log)["d"]["events"]
    assert not status.uploaded
    texts = [error, caplog.text, status_path(log).read_text(), repr(loaded.config)]
    failed = tmp_path / "events" / "failed"
    texts += [p.read_text() for p in failed.rglob("*") if p.is_file()] if failed.exists() else []
    for text in texts:
        assert secret not in text and "AKIDSECRET9" not in text


def test_a_rerun_in_another_format_leaves_the_old_formats_objects(
    spark: Any, tmp_path: Path, store: S3Store | GcsStore
) -> None:
    """The driver removes only parts of its own extension: objects of another format in the folder
    (an earlier format of the destination, or anything else) are never its to delete."""
    log = put_log(tmp_path, [event(str(i), event_type="a") for i in range(3)])
    with pytest.raises(SystemExit):
        run(spark, make_config(tmp_path, {"d": store.destination("csv")}), fault=_crash_at("pair committed"))
    assert set(store.objects()) == {f"events/{stem(log)}.csv"}

    result = run(spark, make_config(tmp_path, {"d": store.destination("parquet")}))

    assert result.ok and not log.exists()
    assert set(store.objects()) == {f"events/{stem(log)}.csv", f"events/{stem(log)}.parquet"}


@pytest.mark.parametrize("kind", ["s3", "gcs"])
def test_a_files_destination_that_cannot_open_its_store_fails_its_pairs_alone(
    spark: Any, tmp_path: Path, kind: str
) -> None:
    """An endpoint that gets past the config check and still makes the client raise a non-service
    error (here one set after validation) fails the pair, not the pass: DuckDB beside it loads."""
    from tests.batch.helpers import duck_rows, duckdb_destination

    store = S3Store("http://127.0.0.1:9", "lake") if kind == "s3" else GcsStore("http://127.0.0.1:9", "lake")
    loaded = make_config(tmp_path, {"duck": duckdb_destination("events"), "lake": store.destination("json")})
    block = loaded.config.destinations["lake"].s3 if kind == "s3" else loaded.config.destinations["lake"].google
    setattr(block, "endpoint" if kind == "s3" else "gcs_endpoint", "not a url")
    log = put_log(tmp_path, [event(str(i)) for i in range(3)])

    result = run(spark, loaded)

    assert duck_rows(tmp_path, "select count(*) from events") == [(3,)]
    assert result.pairs["duck", "events"].error == ""
    error = result.pairs["lake", "events"].error
    assert error and "not a url" in error, error
    assert log.exists()  # kept for the next pass
    assert not read_status(log)["lake"]["events"].uploaded and read_status(log)["duck"]["events"].uploaded


@pytest.fixture
def faulty(store: S3Store | GcsStore) -> Any:
    from tests.files.faulty import FaultyStore

    proxy = FaultyStore(store.endpoint, store.type_name)
    yield proxy
    proxy.close()


def test_throttling_and_5xx_answers_to_an_upload_are_retried_within_the_pass(
    spark: Any, tmp_path: Path, store: S3Store | GcsStore, faulty: Any
) -> None:
    through = type(store)(faulty.endpoint, store.bucket)
    loaded = make_config(tmp_path, {"d": through.destination("json")})
    log = put_log(tmp_path, [event(str(i)) for i in range(3)])
    faulty.answers = [503, 429] if store.type_name == "gcs" else [503, 500]

    result = run(spark, loaded)

    assert result.ok, result.pairs
    assert faulty.writes()[-3:] == [*([503, 429] if store.type_name == "gcs" else [503, 500]), 200]
    (data,) = store.objects().values()
    assert [orjson.loads(line)["eventn_ctx"]["event_id"] for line in data.splitlines()] == ["0", "1", "2"]
    assert not log.exists()


def test_a_failed_upload_keeps_the_pair_and_the_next_pass_writes_it_once(
    spark: Any, tmp_path: Path, store: S3Store | GcsStore, faulty: Any
) -> None:
    """S3: 503 on every attempt (boto3's six), a transient error after the retries. GCS: a 403,
    refused at once (its retries of a 5xx go on for five minutes)."""
    through = type(store)(faulty.endpoint, store.bucket)
    loaded = make_config(tmp_path, {"d": through.destination("csv", template=TEMPLATE)})
    log = put_log(tmp_path, EVENTS)
    # Two objects (click, view): S3 gives each six attempts (boto3's max_attempts 5 counts retries), GCS one.
    faulty.answers = [503] * 12 if store.type_name == "s3" else [403, 403]

    first = run(spark, loaded)

    assert faulty.answers == [] and faulty.writes() == ([503] * 12 if store.type_name == "s3" else [403, 403])
    expected = "ServiceUnavailable" if store.type_name == "s3" else "403"
    for table in ("click", "view"):
        assert expected in first.pairs["d", table].error, first.pairs
        assert not read_status(log)["d"][table].uploaded
    assert log.exists() and store.objects() == {}

    second = run(spark, loaded)

    assert second.ok and not log.exists()
    objects = store.objects()
    assert set(objects) == {f"{table}/{stem(log)}.csv" for table in ("click", "view")}
    rows = [r for data in objects.values() for r in csv.DictReader(io.StringIO(data.decode()))]
    assert sorted(r["eventn_ctx_event_id"] for r in rows) == ["1", "2", "3"]
    assert [f["event_id"] for f in failed_lines(tmp_path, "d")] == ["5"]  # once, from the first pass


def test_a_missing_bucket_fails_the_pair_with_the_services_answer(
    spark: Any, tmp_path: Path, store: S3Store | GcsStore
) -> None:
    missing = type(store)(store.endpoint, "no-such-bucket-here")
    loaded = make_config(tmp_path, {"d": missing.destination("parquet")})
    log = put_log(tmp_path, [event("1")])

    result = run(spark, loaded)

    error = result.pairs["d", "events"].error
    assert ("NoSuchBucket" if store.type_name == "s3" else "404") in error, error
    assert log.exists() and not read_status(log)["d"]["events"].uploaded


def test_parquet_promotes_a_column_across_the_parts_of_an_object_in_a_real_pass(
    spark: Any, tmp_path: Path, store: S3Store | GcsStore
) -> None:
    loaded = make_config(tmp_path, {"d": store.destination("parquet", "gzip")})
    # Two rows a part: n is an integer in the first part, text in the second, a float in the third.
    events = [event("1", n=1), event("2", n=2), event("3", n="x"), event("4", n=4), event("5", n=1.5)]
    log = put_log(tmp_path, events)

    result = run_pass(loaded, MemoryCoordination("test"), chunk_rows=2, session=spark)

    assert result.ok, result.pairs
    (data,) = store.objects().values()
    parquet = pq.ParquetFile(pa.BufferReader(data))
    assert parquet.metadata.num_row_groups == 3  # one per part
    table = parquet.read()
    assert table.schema.field("n").type == pa.string()
    assert table.column("n").to_pylist() == ["1", "2", "x", "4", "1.5"]
    assert table.column("eventn_ctx_event_id").to_pylist() == ["1", "2", "3", "4", "5"]
    assert not log.exists()
