"""BigQuery client (google-cloud-bigquery, google-cloud-storage): credentials, statements as query
jobs, the table API calls the load needs, error classification, and the executors' stage writer
(newline-delimited JSON files, on GCS or under the staging folder).

Nothing here logs a credential: keys travel in `GoogleSettings`, whose `key_info` is left out of
its repr, and error messages carry the API's text only.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

import orjson
import requests
from google.api_core import exceptions as api_errors
from google.api_core.client_options import ClientOptions
from google.auth import exceptions as auth_errors
from google.auth.credentials import Credentials
from google.cloud import bigquery
from google.cloud.bigquery.retry import DEFAULT_RETRY

from eventspark.destinations import google_auth
from eventspark.destinations.base import DestinationError, StagedChunk, TerminalError, TransientError
from eventspark.destinations.bigquery.dialect import field_type
from eventspark.steps.typing import DataType

SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
RETRY = DEFAULT_RETRY.with_deadline(10.0)
"""API calls (not jobs) retry connection errors, 5xx and rate limits for 10 s, then fail: the
stream worker and the next batch pass retry further, without holding a table lock meanwhile."""
HTTP_TIMEOUT = 60.0
JOB_TIMEOUT = 3600.0
"""Longest wait for a load or query job."""
GCS_STAGE_FOLDER = "eventspark-staging"
"""Objects of a job: `<folder>/<job id>/<destination id>/<random>.ndjson` in `gcs_bucket`."""
KEY_NOTE = "eventspark primary key: "
"""A table's primary key is a line of its description: this, then the key as a JSON list. No
table constraint: BigQuery's optimiser trusts a `PRIMARY KEY NOT ENFORCED`, and a table may hold
duplicate keys (rows from before the key, NULL keys), so queries could return wrong results."""
SETTLE_SECONDS = 30.0
"""After a commit job's answer was lost: how long to keep asking for the job while the API cannot
be reached, before giving up with `OutcomeUnknown`."""
CANCEL_WAIT_SECONDS = 60.0
"""After cancelling a job that outran `JOB_TIMEOUT`: how long to wait for it to end."""
POLL_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class GoogleSettings:
    """Picklable: what a BigQuery or Cloud Storage client needs (sent to executors with GCS)."""

    project: str
    dataset: str
    bucket: str = ""
    bq_endpoint: str = ""
    gcs_endpoint: str = ""
    key_path: str = ""
    key_info: Mapping[str, Any] | None = field(default=None, repr=False)
    location: str = ""
    """Where a missing dataset is created (`google.bq_location`); empty: BigQuery's default (US)."""

    def credentials(self, endpoint: str) -> Credentials | None:
        creds: Credentials | None = google_auth.credentials(self.key_path, self.key_info, endpoint, SCOPES, "bigquery")
        return creds

    def bigquery(self) -> bigquery.Client:
        credentials = self.credentials(self.bq_endpoint)
        options = ClientOptions(api_endpoint=self.bq_endpoint) if self.bq_endpoint else None
        return bigquery.Client(project=self._project(credentials), credentials=credentials, client_options=options)

    def storage(self) -> Any:
        from google.cloud import storage

        credentials = self.credentials(self.gcs_endpoint)
        options = {"api_endpoint": self.gcs_endpoint} if self.gcs_endpoint else None
        return storage.Client(project=self._project(credentials), credentials=credentials, client_options=options)

    def _project(self, credentials: Credentials | None) -> str | None:
        """`bq_project`, else the key's project (a key file's is known once read), else None:
        the environment's default project."""
        return self.project or getattr(credentials, "project_id", None) or None


def key_of(key_file: str | Mapping[str, Any]) -> tuple[str, Mapping[str, Any] | None]:
    """EventNative's `key_file`: (a path, None) or ('', the key's JSON object)."""
    return google_auth.key_of(key_file, "bigquery")


# --- errors ---------------------------------------------------------------------------------------

_TRANSIENT_REASONS = frozenset({"backendError", "internalError", "rateLimitExceeded", "jobRateLimitExceeded"})
_TRANSIENT_MESSAGES = (
    # UPDATE/DELETE/MERGE of rows streamed in the last 30-90 minutes (`invalidQuery`, 400)
    "would affect rows in the streaming buffer",
    # more than 2 running + 20 queued mutating DML statements on one table
    "too many dml statements outstanding",
    # two DML statements (or transactions) changing the same table at once
    "could not serialize access to table",
    "due to concurrent update",
)
"""Refusals that go away by themselves, recognised by their message (their reasons are the
generic `invalidQuery`/`invalid`); documented texts, lower case."""
ROW_RETRY_REASONS = frozenset({"stopped", "backendError", "internalError", "timeout"})
"""Per-row reasons of a streaming insert's `insertErrors` for a row that is fine in itself:
`stopped` (not stored because another row of the request was invalid) or a server fault."""
_NO_SUCH_FIELD = re.compile(r"no such field:?\s*(.*?)\.?\s*$", re.IGNORECASE | re.DOTALL)


class OutcomeUnknown(TransientError):
    """A submitted job whose end could not be learnt: it may still commit. Its staging tables
    are kept (they expire), and a rerun of the same commit finds the job by its id."""


@contextmanager
def translated_errors(doing: str, service: str = "bigquery") -> Iterator[None]:
    """Connection problems, timeouts, 5xx and rate limits as TransientError; every other refusal
    (4xx, a failed job, bad credentials) as TerminalError."""
    try:
        yield
    except (TransientError, TerminalError):
        raise
    except api_errors.GoogleAPICallError as exc:
        kind = TransientError if _is_transient(exc) else TerminalError
        raise kind(f"{service}: {doing}: {_message(exc)}") from exc
    except (
        api_errors.RetryError,
        requests.ConnectionError,
        requests.Timeout,
        auth_errors.TransportError,
        TimeoutError,
        ConnectionError,
    ) as exc:
        raise TransientError(f"{service}: {doing}: {type(exc).__name__}: {_first_line(exc)}") from exc
    except auth_errors.GoogleAuthError as exc:
        raise TerminalError(f"{service}: {doing}: {type(exc).__name__}: {_first_line(exc)}") from exc
    except (OSError, ValueError, TypeError) as exc:  # a staged file gone, a value the client cannot encode
        raise TerminalError(f"{service}: {doing}: {type(exc).__name__}: {_first_line(exc)}") from exc


def _is_transient(exc: api_errors.GoogleAPICallError) -> bool:
    if isinstance(exc, api_errors.ServerError | api_errors.TooManyRequests):
        return True
    errors = [error for error in exc.errors or [] if isinstance(error, dict)]
    return any(is_transient_error(e.get("reason"), str(e.get("message") or "")) for e in errors) or (
        is_transient_error(None, str(exc.message or ""))
    )


def is_transient_error(reason: str | None, message: str) -> bool:
    """Whether an API error (`ErrorProto`: reason, message) will go away by itself."""
    text = message.lower()
    return reason in _TRANSIENT_REASONS or any(m in text for m in _TRANSIENT_MESSAGES)


def job_error(error_result: Mapping[str, Any], doing: str) -> DestinationError:
    """The error of a finished job's `errorResult`."""
    reason, message = error_result.get("reason"), str(error_result.get("message") or "")
    kind = TransientError if is_transient_error(reason, message) else TerminalError
    return kind(f"bigquery: {doing}: {reason}: {_first_line(message)}")


def insert_errors_failure(
    errors: Sequence[Mapping[str, Any]], total: int, doing: str, settling: Callable[[frozenset[str]], bool]
) -> DestinationError:
    """The error for a streaming insert's per-row `insertErrors` (BigQuery stores none of the
    request's rows then). TransientError when every row was refused for a reason of
    `ROW_RETRY_REASONS`, or the invalid rows only name columns that `settling` says were added
    moments ago (the streaming API learns new columns minutes after the tables API); else
    TerminalError naming the first invalid row: the stream's delivery then splits the batch, so
    that the `stopped` rows are sent again without the invalid ones."""
    invalid: list[tuple[int, str]] = []
    unknown_fields: set[str] = set()
    only_unknown_fields = True
    for row in errors:
        index = int(row.get("index", -1))
        for error in row.get("errors") or [{}]:
            reason = error.get("reason")
            if reason in ROW_RETRY_REASONS:
                continue
            message = str(error.get("message") or reason or "refused")
            field = _NO_SUCH_FIELD.search(message)
            if reason == "invalid" and field is not None:
                unknown_fields.add(field.group(1))
            else:
                only_unknown_fields = False
            invalid.append((index, message))
    if not invalid:
        reasons = sorted({str(e.get("reason")) for row in errors for e in row.get("errors") or [{}]})
        stored = f"{len(errors)} of {total} rows not stored ({', '.join(reasons)})"
        return TransientError(f"bigquery: {doing}: {stored}: retry")
    if only_unknown_fields and settling(frozenset(unknown_fields)):
        names = ", ".join(repr(f) for f in sorted(unknown_fields))
        return TransientError(f"bigquery: {doing}: the streaming API does not know the new column(s) {names} yet")
    rows = sorted({index for index, _ in invalid})
    index, message = min(invalid)
    more = f" (and {len(rows) - 1} more invalid rows)" if len(rows) > 1 else ""
    return TerminalError(f"bigquery: {doing}: {len(rows)} of {total} rows invalid: row {index}: {message}{more}")


def _message(exc: api_errors.GoogleAPICallError) -> str:
    return f"{exc.code} {_first_line(exc.message or exc)}"


def _first_line(exc: object) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


# --- the client ------------------------------------------------------------------------------------


class BigQueryClient:
    """A BigQuery client for one dataset. `execute` and `rows` run query jobs; inside
    `transaction`, `execute` collects statements that run on leaving it as one script
    `BEGIN TRANSACTION; ...; COMMIT TRANSACTION;` (BigQuery keeps no transaction open between
    jobs without a session), which BigQuery rolls back whole when a statement fails."""

    def __init__(self, settings: GoogleSettings) -> None:
        self.settings = settings
        with translated_errors("connecting"):
            self.client = settings.bigquery()
        self.location: str | None = settings.location or None
        """The dataset's location (known once `ensure_dataset` read it): jobs run, and are found, there."""
        self._script: list[str] | None = None
        self._params: list[Any] = []

    @property
    def dataset(self) -> str:
        return self.settings.dataset

    def _ref(self, table: str) -> bigquery.TableReference:
        return bigquery.DatasetReference(self.client.project, self.dataset).table(table)

    # --- SQL --------------------------------------------------------------------------------------

    def execute(self, statement: str, doing: str, params: Sequence[Any] = ()) -> None:
        if self._script is not None:
            self._script.append(statement)
            self._params.extend(params)
            return
        self._query(statement, doing, params)

    def rows(self, statement: str, doing: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return [tuple(row.values()) for row in self._query(statement, doing, params)]

    def _query(self, statement: str, doing: str, params: Sequence[Any], job_id: str | None = None) -> list[Any]:
        if job_id is not None:
            self._run_job(statement, doing, params, job_id)
            return []
        config = bigquery.QueryJobConfig(query_parameters=list(params), use_legacy_sql=False)
        with translated_errors(doing):
            job = self.client.query(
                statement,
                job_config=config,
                location=self.location,
                retry=RETRY,
                job_retry=None,
                timeout=HTTP_TIMEOUT,
            )
            return list(job.result(retry=RETRY, timeout=JOB_TIMEOUT))

    @contextmanager
    def transaction(self, doing: str, job_id: str | None = None) -> Iterator[None]:
        """Collects the statements executed inside into one script, run on leaving as one job
        (named `job_id` when given: see `_run_job`)."""
        if self._script is not None:  # nested: part of the outer script
            yield
            return
        self._script, self._params = [], []
        try:
            yield
            statements, params = self._script, self._params
        finally:
            self._script, self._params = None, []
        if len(statements) == 1:
            # One statement is atomic by itself (and bqemulator binds no parameters in scripts).
            self._query(statements[0], doing, params, job_id)
        elif statements:
            script = "BEGIN TRANSACTION;\n" + ";\n".join(statements) + ";\nCOMMIT TRANSACTION;"
            self._query(script, doing, params, job_id)

    # --- jobs with a chosen id ---------------------------------------------------------------------

    def _run_job(self, statement: str, doing: str, params: Sequence[Any], job_id: str) -> None:
        """Runs the query as job `job_id` and returns once it succeeded. When anything fails after
        the job may have been submitted (a lost answer, a timeout, the job's own failure), the
        job is looked up and waited for before raising: success after all returns normally, a
        failure raises, and a job whose end cannot be learnt raises `OutcomeUnknown`. Nothing
        is raised while the job might still commit, unless as OutcomeUnknown."""
        config = bigquery.QueryJobConfig(query_parameters=list(params), use_legacy_sql=False)
        try:
            with translated_errors(doing):
                try:
                    job = self.client.query(
                        statement,
                        job_config=config,
                        job_id=job_id,
                        location=self.location,
                        retry=RETRY,
                        job_retry=None,
                        timeout=HTTP_TIMEOUT,
                    )
                except api_errors.Conflict:  # a retried request had created it
                    job = self.client.get_job(job_id, location=self.location, retry=RETRY, timeout=HTTP_TIMEOUT)
                job.result(retry=RETRY, timeout=JOB_TIMEOUT)
        except DestinationError as exc:
            found = self.find_job(job_id, doing, settle=True)
            if found is None:
                raise  # never submitted
            if self.wait_for(found, doing):
                return  # it succeeded after all: the commit happened
            if isinstance(exc, TransientError) and found.error_result is not None:
                raise job_error(found.error_result, doing) from exc
            raise

    def find_job(self, job_id: str, doing: str, settle: bool = False) -> bigquery.QueryJob | None:
        """Job `job_id`, or None if there is none. With `settle`, keeps asking for
        `SETTLE_SECONDS` while the API cannot be reached, then raises OutcomeUnknown."""
        deadline = time.monotonic() + (SETTLE_SECONDS if settle else 0.0)
        while True:
            try:
                with translated_errors(f"{doing}: looking up job {job_id}"):
                    try:
                        job = self.client.get_job(job_id, location=self.location, retry=RETRY, timeout=HTTP_TIMEOUT)
                    except api_errors.NotFound:
                        return None
                    return job if isinstance(job, bigquery.QueryJob) else None
            except TransientError as exc:
                if time.monotonic() >= deadline:
                    if settle:
                        raise OutcomeUnknown(f"{exc} (job {job_id} may still commit)") from exc
                    raise
                time.sleep(POLL_SECONDS)

    def wait_for(self, job: bigquery.QueryJob, doing: str) -> bool:
        """Waits until `job` has ended (cancelling it after `JOB_TIMEOUT`): True when it
        succeeded, False when it failed; OutcomeUnknown when its end cannot be learnt."""
        deadline = time.monotonic() + JOB_TIMEOUT
        unreachable_since: float | None = None
        cancelled = False
        while True:
            try:
                with translated_errors(f"{doing}: waiting for job {job.job_id}"):
                    job.reload(retry=RETRY, timeout=HTTP_TIMEOUT)
                unreachable_since = None
            except TransientError as exc:
                unreachable_since = unreachable_since or time.monotonic()
                if time.monotonic() - unreachable_since > SETTLE_SECONDS:
                    raise OutcomeUnknown(f"{exc} (job {job.job_id} may still commit)") from exc
            if job.state == "DONE":
                return job.error_result is None
            if time.monotonic() > deadline:
                if cancelled:
                    raise OutcomeUnknown(f"bigquery: {doing}: job {job.job_id} did not end after its cancellation")
                with suppress(api_errors.GoogleAPICallError, requests.RequestException):
                    job.cancel(retry=RETRY, timeout=HTTP_TIMEOUT)
                cancelled, deadline = True, time.monotonic() + CANCEL_WAIT_SECONDS
            time.sleep(POLL_SECONDS)

    def close(self) -> None:
        self.client.close()

    # --- the API ----------------------------------------------------------------------------------

    def ensure_dataset(self) -> None:
        """Reads the dataset, and creates it only when missing (creating needs the project-level
        `bigquery.datasets.create`, which a Data Editor of an existing dataset lacks)."""
        ref = bigquery.DatasetReference(self.client.project, self.dataset)
        with translated_errors(f"reading dataset {self.dataset!r}"):
            try:
                found = self.client.get_dataset(ref, retry=RETRY, timeout=HTTP_TIMEOUT)
            except api_errors.NotFound:
                found = None
        if found is None:
            with translated_errors(f"creating dataset {self.dataset!r}"):
                dataset = bigquery.Dataset(ref)
                if self.settings.location:
                    dataset.location = self.settings.location
                found = self.client.create_dataset(dataset, exists_ok=True, retry=RETRY, timeout=HTTP_TIMEOUT)
        self.location = found.location or self.location

    def table_names(self, doing: str) -> list[str]:
        with translated_errors(doing):
            found = self.client.list_tables(f"{self.client.project}.{self.dataset}", retry=RETRY, timeout=HTTP_TIMEOUT)
            return [t.table_id for t in found]

    def table(self, name: str, doing: str) -> bigquery.Table | None:
        with translated_errors(doing):
            try:
                return self.client.get_table(self._ref(name), retry=RETRY, timeout=HTTP_TIMEOUT)
            except api_errors.NotFound:
                return None

    def add_fields(self, name: str, columns: Mapping[str, str], doing: str) -> None:
        """Adds the columns the table's API schema lacks, with one schema patch."""
        table = self.table(name, doing)
        if table is None:
            raise TerminalError(f"bigquery: {doing}: table {name!r} does not exist")
        have = {f.name.lower() for f in table.schema}
        new = [bigquery.SchemaField(c, field_type(t)) for c, t in columns.items() if c.lower() not in have]
        if new:
            table.schema = [*table.schema, *new]
            with translated_errors(doing):
                self.client.update_table(table, ["schema"], retry=RETRY, timeout=HTTP_TIMEOUT)

    def set_primary_key(self, name: str, keys: Sequence[str], doing: str) -> None:
        """The key as the last line of the table's description (see `KEY_NOTE`), the user's text
        above it kept."""
        table = self.table(name, doing)
        if table is None:
            raise TerminalError(f"bigquery: {doing}: table {name!r} does not exist")
        table.description = with_key_note(table.description, keys)
        with translated_errors(doing):
            self.client.update_table(table, ["description"], retry=RETRY, timeout=HTTP_TIMEOUT)

    def load(self, name: str, refs: Sequence[str], doing: str) -> None:
        """One load job appending the staged files `refs` (gs:// URIs, or local paths sent from
        here as one stream) to table `name`."""
        config = bigquery.LoadJobConfig(
            source_format=bigquery.SourceFormat.NEWLINE_DELIMITED_JSON,
            write_disposition=bigquery.WriteDisposition.WRITE_APPEND,
            ignore_unknown_values=False,  # a staging table has every key of its chunks: refuse, never drop
        )
        with translated_errors(doing):
            if all(ref.startswith("gs://") for ref in refs):
                job = self.client.load_table_from_uri(
                    list(refs), self._ref(name), job_config=config, retry=RETRY, timeout=HTTP_TIMEOUT
                )
                job.result(retry=RETRY, timeout=JOB_TIMEOUT)
                return
            with _joined(refs) as stream:
                job = self.client.load_table_from_file(stream, self._ref(name), job_config=config, timeout=HTTP_TIMEOUT)
                job.result(retry=RETRY, timeout=JOB_TIMEOUT)

    def insert_json(
        self,
        name: str,
        rows: Sequence[Mapping[str, Any]],
        row_ids: Sequence[str] | None,
        doing: str,
        settling: Callable[[frozenset[str]], bool],
    ) -> None:
        """The streaming insert. No client-side retry: a row the emulator cannot take answers 500,
        which the default retry would repeat for 10 minutes; the stream worker retries instead.
        Refusals: see `insert_errors_failure`; a table "not found" that `settling` says exists
        (created moments ago: the streaming API sees it later) is transient."""
        with translated_errors(doing):
            try:
                errors = self.client.insert_rows_json(
                    self._ref(name),
                    list(rows),
                    row_ids=bigquery.AutoRowIDs.GENERATE_UUID if row_ids is None else row_ids,
                    retry=None,
                    timeout=HTTP_TIMEOUT,
                )
            except api_errors.NotFound as exc:
                kind = TransientError if settling(frozenset()) else TerminalError
                raise kind(f"bigquery: {doing}: table not found by the streaming API: {_message(exc)}") from exc
        if errors:
            raise insert_errors_failure(errors, len(rows), doing, settling)

    def drop_table(self, name: str, doing: str) -> None:
        with translated_errors(doing):
            self.client.delete_table(self._ref(name), not_found_ok=True, retry=RETRY, timeout=HTTP_TIMEOUT)


def with_key_note(description: str | None, keys: Sequence[str]) -> str:
    """`description` with its key line (`KEY_NOTE`) replaced by one for `keys` (none if empty)."""
    lines = [line for line in (description or "").split("\n") if not line.startswith(KEY_NOTE)]
    text = "\n".join(lines).rstrip()
    if not keys:
        return text
    note = KEY_NOTE + json.dumps(list(keys))
    return f"{text}\n\n{note}" if text else note


def key_in_description(description: str | None) -> tuple[str, ...]:
    """The key of the description's last `KEY_NOTE` line; () when it has none."""
    for line in reversed((description or "").split("\n")):
        if line.startswith(KEY_NOTE):
            try:
                found = json.loads(line[len(KEY_NOTE) :])
            except ValueError:
                return ()
            if isinstance(found, list) and all(isinstance(k, str) for k in found):
                return tuple(found)
            return ()
    return ()


@contextmanager
def _joined(paths: Sequence[str]) -> Iterator[Any]:
    """The staged files as one binary stream: newline-delimited JSON files concatenate."""
    if len(paths) == 1:
        with open(paths[0], "rb") as stream:
            yield stream
        return
    with tempfile.TemporaryFile(dir=Path(paths[0]).parent) as joined:
        for path in paths:
            with open(path, "rb") as part:
                shutil.copyfileobj(part, joined)
        joined.seek(0)
        yield joined


# --- Cloud Storage, on the driver ----------------------------------------------------------------


def delete_stage_objects(settings: GoogleSettings, dest_id: str, matches: Callable[[str], bool]) -> None:
    """Deletes the staged objects of `dest_id` whose job folder name matches."""
    with translated_errors("deleting staged files", "gcs"):
        storage = settings.storage()
        try:
            bucket = storage.bucket(settings.bucket)
            for blob in storage.list_blobs(bucket, prefix=f"{GCS_STAGE_FOLDER}/", timeout=HTTP_TIMEOUT):
                parts = blob.name.split("/")
                if len(parts) == 4 and parts[2] == dest_id and matches(parts[1]):
                    blob.delete(timeout=HTTP_TIMEOUT)
        finally:
            storage.close()


def delete_objects(settings: GoogleSettings, uris: Sequence[str]) -> None:
    with translated_errors("deleting staged files", "gcs"):
        storage = settings.storage()
        try:
            bucket = storage.bucket(settings.bucket)
            for uri in uris:
                with suppress(api_errors.NotFound):  # gone already
                    bucket.blob(uri.removeprefix(f"gs://{settings.bucket}/")).delete(timeout=HTTP_TIMEOUT)
        finally:
            storage.close()


def chunk_job(ref: str) -> str:
    """The job id of a staged file (`.../<job id>/<destination id>/<file>`)."""
    return PurePosixPath(ref).parent.parent.name


# --- bulk copy, on executors -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NdjsonStageTarget:
    """Picklable: where executors of one job write newline-delimited JSON chunks: objects under
    `gcs_prefix` of the bucket when `gcs` is set, else files in `folder`."""

    folder: str
    gcs: GoogleSettings | None = None
    gcs_prefix: str = ""

    json_lines: ClassVar[bool] = True

    def open(self) -> NdjsonStageWriter:
        return NdjsonStageWriter(self)


class NdjsonStageWriter:
    """One chunk per file (or object), named at random; a GCS client per task, made on first use."""

    def __init__(self, target: NdjsonStageTarget) -> None:
        self._target = target
        self._bucket: Any = None
        self._storage: Any = None

    def write(self, columns: Mapping[str, DataType], rows: Sequence[Sequence[Any]]) -> StagedChunk:
        names = list(columns)
        try:
            lines = b"".join(orjson.dumps(dict(zip(names, row, strict=True)), default=str) + b"\n" for row in rows)
        except (TypeError, ValueError) as exc:
            raise TerminalError(f"bigquery: staging {len(rows)} rows: {exc}") from exc
        return self.write_json(columns, lines, len(rows))

    def write_json(self, columns: Mapping[str, DataType], lines: bytes | bytearray, rows: int) -> StagedChunk:
        name = f"{uuid.uuid4().hex}.ndjson"
        if self._target.gcs is not None:
            key = f"{self._target.gcs_prefix}/{name}"
            with translated_errors(f"staging {rows} rows in gs://{self._target.gcs.bucket}/{key}", "gcs"):
                blob = self._gcs_bucket().blob(key)
                blob.upload_from_string(bytes(lines), content_type="application/x-ndjson", timeout=HTTP_TIMEOUT)
            return StagedChunk(f"gs://{self._target.gcs.bucket}/{key}", dict(columns), rows)
        folder = Path(self._target.folder)
        path = folder / name
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(lines)
            tmp.rename(path)
        except OSError as exc:
            raise TerminalError(f"bigquery: staging {rows} rows in {folder}: {exc}") from exc
        return StagedChunk(str(path), dict(columns), rows)

    def _gcs_bucket(self) -> Any:
        if self._bucket is None:
            assert self._target.gcs is not None
            self._storage = self._target.gcs.storage()
            self._bucket = self._storage.bucket(self._target.gcs.bucket)
        return self._bucket

    def close(self) -> None:
        if self._storage is not None:
            self._storage.close()
            self._storage = self._bucket = None
