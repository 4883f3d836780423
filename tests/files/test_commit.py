"""The driver's commit of a files pair: any error of the store's client fails the pair, never the pass."""

from __future__ import annotations

from typing import Any

from eventspark.batch.load import PairLoad, commit_objects
from eventspark.destinations.base import StagedChunk
from eventspark.destinations.files.target import FilesDestination
from eventspark.destinations.gcs.client import GcsSettings
from eventspark.destinations.s3.client import S3Settings
from eventspark.steps.typing import BatchHeader

LOG = "incoming.tok=web-2026-11-24T10-00-00.000.log"


def _pair() -> PairLoad:
    chunk = StagedChunk(f"events/{LOG[:-4]}.ndjson", {}, 1)
    return PairLoad("d", "events", BatchHeader("events"), [chunk], {LOG})


def test_a_store_that_cannot_be_opened_fails_the_commit_with_the_reason() -> None:
    for settings in (S3Settings("lake", endpoint="not a url"), GcsSettings("lake", endpoint="not a url")):
        adapter = FilesDestination("d", settings, "", "json", "")
        error = commit_objects(adapter, _pair())
        assert error.startswith(f"{settings.service}: ") and "not a url" in error, error


def test_an_untranslated_error_of_the_commit_is_the_pairs_error() -> None:
    class Broken(FilesDestination):
        def commit(self, load: Any) -> None:
            raise RuntimeError("a client bug")

    adapter = Broken("d", S3Settings("lake"), "", "json", "")
    assert commit_objects(adapter, _pair()) == "RuntimeError: a client bug"
