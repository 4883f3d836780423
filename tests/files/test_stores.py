"""The two stores' clients on their own: an object larger than what is kept in memory (and than
GCS's multipart limit: a resumable upload) goes up from its spooled file and reads back whole."""

from __future__ import annotations

import gzip
import os

import orjson
import pytest

from eventspark.destinations.files.formats import SPOOL_BYTES, EventBuffer, encode_file
from eventspark.destinations.gcs.client import GcsSettings
from eventspark.destinations.s3.client import S3Settings
from tests.emulators.s3 import S3_KEY_ID, S3_REGION, S3_SECRET
from tests.files.stores import GcsStore, S3Store


@pytest.mark.parametrize("kind", ["s3", "gcs"])
def test_an_object_larger_than_the_spool_goes_up_from_its_file(kind: str, request: pytest.FixtureRequest) -> None:
    if kind == "s3":
        endpoint, bucket = request.getfixturevalue("moto_s3"), request.getfixturevalue("s3_bucket")
        settings: S3Settings | GcsSettings = S3Settings(bucket, S3_REGION, endpoint, S3_KEY_ID, S3_SECRET)
        store: S3Store | GcsStore = S3Store(endpoint, bucket)
    else:
        endpoint, bucket = request.getfixturevalue("fake_gcs"), request.getfixturevalue("gcs_bucket")
        settings, store = GcsSettings(bucket, endpoint), GcsStore(endpoint, bucket)
    buffer = EventBuffer("t")
    for i in range(2400):
        assert buffer.add({"i": i, "noise": os.urandom(4096).hex()}, {}) is None  # incompressible
        if len(buffer) >= 500:
            buffer.spill()
    data, size, _header = encode_file(buffer, "json", "gzip")
    assert size > SPOOL_BYTES + 1024 * 1024
    opened = settings.open()
    try:
        with data:
            opened.put("big/object.ndjson.gz", data, size, "application/x-ndjson")
    finally:
        opened.close()
        buffer.close()

    (body,) = store.objects().values()
    assert len(body) == size
    assert [orjson.loads(line)["i"] for line in gzip.decompress(body).splitlines()] == list(range(2400))
