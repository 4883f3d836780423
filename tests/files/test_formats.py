"""Object names, table names as folders and the encoders, without Spark or a store."""

from __future__ import annotations

import csv
import gzip
import io

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eventspark.destinations.files.formats import EventBuffer, FlatBuffer, encode
from eventspark.destinations.files.naming import OBJECT_NAMES, log_prefix, object_key, stale
from eventspark.destinations.gcs.configuration import GcsDestination
from eventspark.destinations.gcs.load import build as build_gcs
from eventspark.destinations.s3.configuration import S3Destination
from eventspark.destinations.s3.load import build as build_s3

LOG = "incoming.tok=web-2026-11-24T10-00-00.000.log"


def test_object_names_follow_the_log_and_the_split() -> None:
    assert object_key("lake", "click", LOG, 0, True, "json", "gzip") == (
        "lake/click/incoming.tok=web-2026-11-24T10-00-00.000.ndjson.gz"
    )
    assert object_key("", "click", LOG, 4096, False, "csv", "") == (
        "click/incoming.tok=web-2026-11-24T10-00-00.000.part-000000004096.csv"
    )
    # Parquet compresses inside the file: no .gz
    assert object_key("", "t", LOG, 0, True, "parquet", "gzip").endswith(".000.parquet")


def test_stale_objects_are_only_this_logs_in_this_table() -> None:
    prefix = log_prefix("lake", "t", LOG)
    written = {object_key("lake", "t", LOG, 0, True, "json", "")}
    listed = [
        *written,
        object_key("lake", "t", LOG, 0, False, "json", ""),
        object_key("lake", "t", LOG, 512, False, "json", ""),
        object_key("lake", "t", LOG, 0, True, "json", "gzip"),  # the same format, gzipped before
        object_key("lake", "t", LOG, 0, True, "csv", "gzip"),  # another format's: never removed
        object_key("lake", "t", LOG, 0, False, "parquet", ""),
        prefix + "notes.txt",  # not an object eventspark writes: kept
    ]
    assert stale(prefix, listed, written, "json") == sorted(listed[1:4])
    assert stale(prefix, listed, set(), "csv") == [listed[4]]


@pytest.mark.parametrize("name", ["a/b", "..", ".", "", "x\x00y", "tab\tname", "\\", "é" * 200])
def test_table_names_that_are_not_one_folder_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        OBJECT_NAMES.quote(name)


def test_table_names_are_kept_as_they_are() -> None:
    assert OBJECT_NAMES.quote("user 2020_08 ünïcode 'quoted'") == "user 2020_08 ünïcode 'quoted'"


def _flat_buffer_promoting_across_parts() -> FlatBuffer:
    buffer = FlatBuffer("t")
    assert buffer.add({"n": 1, "f": 1, "b": True, "_timestamp": "2026-11-24T10:00:00.5Z"}, {}) is None
    buffer.spill()  # as the executor does every chunk_rows rows
    assert buffer.add({"n": "x", "f": 2.5, "s": 'a,"b"\nc'}, {}) is None
    assert buffer.add({"n": None, "f": 3}, {}) is None
    return buffer


def test_flat_json_converts_the_values_of_promoted_columns() -> None:
    data, header = encode(_flat_buffer_promoting_across_parts(), "flat_json", "")
    rows = [orjson.loads(line) for line in data.splitlines()]
    assert [row.get("n") for row in rows] == ["1", "x", None]
    assert [row["f"] for row in rows] == [1, 2.5, 3]
    assert header.fields["n"].type.name == "STRING" and header.fields["f"].type.name == "FLOAT64"


def test_csv_has_a_header_row_and_every_row_in_its_columns() -> None:
    data, _header = encode(_flat_buffer_promoting_across_parts(), "csv", "gzip")
    rows = list(csv.reader(io.StringIO(gzip.decompress(data).decode())))
    assert rows[0] == ["n", "f", "b", "_timestamp", "s"]
    assert rows[1] == ["1", "1.0", "true", "2026-11-24T10:00:00.500000Z", ""]
    assert rows[2] == ["x", "2.5", "", "", 'a,"b"\nc']
    assert rows[3] == ["", "3.0", "", "", ""]


def test_parquet_columns_are_typed_from_the_merged_header() -> None:
    data, _header = encode(_flat_buffer_promoting_across_parts(), "parquet", "gzip")
    table = pq.read_table(pa.BufferReader(data))
    assert table.schema.field("n").type == pa.string()
    assert table.schema.field("f").type == pa.float64()
    assert table.schema.field("b").type == pa.bool_()
    assert table.schema.field("_timestamp").type == pa.timestamp("us", tz="UTC")
    assert table.column("f").to_pylist() == [1.0, 2.5, 3.0]
    assert table.column("_timestamp").to_pylist()[0].isoformat() == "2026-11-24T10:00:00.500000+00:00"
    metadata = pq.ParquetFile(pa.BufferReader(data)).metadata
    assert metadata.num_row_groups == 2  # one per part: the executor holds one part's columns at a time
    assert metadata.row_group(0).column(0).compression == "GZIP"


def test_gzip_objects_are_the_same_bytes_on_a_rerun() -> None:
    def once() -> bytes:
        buffer = EventBuffer("t")
        buffer.add({"a": {"b": [1, 2]}}, {})
        return encode(buffer, "json", "gzip")[0]

    first = once()
    assert first == once()
    assert orjson.loads(gzip.decompress(first)) == {"a": {"b": [1, 2]}}


def test_secrets_are_not_in_reprs() -> None:
    s3 = S3Destination.model_validate(
        {"type": "s3", "s3": {"access_key_id": "AKIDSECRET1", "secret_access_key": "SECRET-s3-xyz", "bucket": "b"}}
    )
    key = {"type": "service_account", "private_key": "-----SECRET-KEY-----", "client_email": "a@b.c"}
    gcs = GcsDestination.model_validate({"type": "gcs", "google": {"gcs_bucket": "b", "key_file": key}})
    adapters = [build_s3("d", s3, None), build_gcs("g", gcs, None)]  # type: ignore[arg-type]
    texts = [repr(s3), repr(gcs), *map(repr, adapters), *(repr(a.stage_target("j")) for a in adapters)]
    for text in texts:
        for secret in ("AKIDSECRET1", "SECRET-s3-xyz", "SECRET-KEY"):
            assert secret not in text
    assert "s3://b/" in repr(adapters[0]) and "gs://b/" in repr(adapters[1])


def _buffer_with_offsets_and_empty_strings() -> FlatBuffer:
    buffer = FlatBuffer("t")
    assert buffer.add({"_timestamp": "2026-11-24T12:00:00.123456789+02:00", "s": "", "n": None}, {}) is None
    assert buffer.add({"_timestamp": "2026-11-24T10:00:00Z", "s": None, "n": 1}, {}) is None
    return buffer


def test_flat_json_and_csv_write_timestamps_in_utc_like_the_warehouses_stage() -> None:
    expected = ["2026-11-24T10:00:00.123456Z", "2026-11-24T10:00:00.000000Z"]
    data, _header = encode(_buffer_with_offsets_and_empty_strings(), "flat_json", "")
    assert [orjson.loads(line)["_timestamp"] for line in data.splitlines()] == expected
    data, _header = encode(_buffer_with_offsets_and_empty_strings(), "csv", "")
    assert [row["_timestamp"] for row in csv.DictReader(io.StringIO(data.decode(), newline=""))] == expected


def test_csv_lines_end_with_crlf_and_null_differs_from_an_empty_string() -> None:
    data, _header = encode(_buffer_with_offsets_and_empty_strings(), "csv", "")
    assert data.split(b"\r\n") == [
        b"_timestamp,s,n",
        b'2026-11-24T10:00:00.123456Z,"",',  # "" quoted, NULL unquoted empty (as PostgreSQL's COPY)
        b"2026-11-24T10:00:00.000000Z,,1",
        b"",
    ]


@pytest.mark.parametrize("fmt", ["json", "parquet"])
def test_a_buffer_spills_a_part_once_its_lines_take_part_bytes(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import eventspark.destinations.files.formats as formats

    monkeypatch.setattr(formats, "PART_BYTES", 1000)
    buffer = formats.new_buffer(fmt, "t")
    for i in range(100):  # about 40 bytes a row: a part every 25 rows or so, with no spill() call
        assert buffer.add({"i": i, "s": "x" * 20}, {}) is None
    assert len(buffer) < 30 and buffer.total == 100
    data, _header = encode(buffer, fmt, "")
    if fmt == "json":
        assert [orjson.loads(line)["i"] for line in data.splitlines()] == list(range(100))
    else:
        metadata = pq.ParquetFile(pa.BufferReader(data)).metadata
        assert metadata.num_rows == 100 and metadata.num_row_groups >= 4
