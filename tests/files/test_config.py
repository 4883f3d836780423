"""Config checks of the files family: two destinations may not share a bucket folder, endpoints
are http(s) URLs, folders leave room for the rest of an object name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eventspark.config.loading import ConfigError
from tests.batch.helpers import make_config
from tests.files.stores import GcsStore, S3Store

S3 = S3Store("http://127.0.0.1:9", "lake")
GCS = GcsStore("http://127.0.0.1:9", "lake")


@pytest.mark.parametrize("store", [S3, GCS], ids=["s3", "gcs"])
@pytest.mark.parametrize(
    ("first", "second"),
    [(("json", "lake"), ("csv", "/lake/")), (("parquet", ""), ("parquet", "")), (("json", "a/b"), ("json", "a/b/"))],
)
def test_two_files_destinations_writing_the_same_folder_are_refused(
    tmp_path: Path, store: S3Store | GcsStore, first: tuple[str, str], second: tuple[str, str]
) -> None:
    destinations = {
        "first": store.destination(first[0], folder=first[1]),
        "second": store.destination(second[0], folder=second[1]),
    }
    with pytest.raises(ConfigError) as raised:
        make_config(tmp_path, destinations)
    message = str(raised.value)
    assert "destinations.first" in message and "destinations.second" in message
    assert "same bucket and folder" in message


def test_files_destinations_in_other_folders_buckets_endpoints_or_types_are_accepted(tmp_path: Path) -> None:
    destinations: dict[str, Any] = {
        "a": S3.destination("json", folder="lake"),
        "b": S3.destination("json", folder="lake/sub"),
        "c": S3Store(S3.endpoint, "other").destination("json", folder="lake"),
        "d": S3Store("http://127.0.0.1:10", "lake").destination("json", folder="lake"),
        "e": GCS.destination("json", folder="lake"),
    }
    assert set(make_config(tmp_path, destinations).config.destinations) == set(destinations)


@pytest.mark.parametrize("store", [S3, GCS], ids=["s3", "gcs"])
@pytest.mark.parametrize("endpoint", ["not a url", "ftp://host", "http://", "127.0.0.1:9000", "http://a b"])
def test_endpoints_that_are_not_http_urls_are_refused(tmp_path: Path, store: S3Store | GcsStore, endpoint: str) -> None:
    destination = type(store)(endpoint, "lake").destination("json")
    with pytest.raises(ConfigError, match="endpoint"):
        make_config(tmp_path, {"d": destination})


@pytest.mark.parametrize("store", [S3, GCS], ids=["s3", "gcs"])
def test_a_folder_too_long_for_object_names_is_refused(tmp_path: Path, store: S3Store | GcsStore) -> None:
    with pytest.raises(ConfigError, match="folder"):
        make_config(tmp_path, {"d": store.destination("json", folder="f" * 500)})
    assert make_config(tmp_path, {"d": store.destination("json", folder="/" + "f" * 400 + "/")})
