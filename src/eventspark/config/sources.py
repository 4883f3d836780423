"""Config sources: `api_keys` and `destinations` given as a URL, read at start and reloaded.

As EventNative accepted them, `api_keys` (or its older place `server.auth`) and `destinations`
may be a string instead of the section:

- `http://` or `https://` URL, with basic auth from the URL (`https://user:password@host/path`);
  TLS certificates are verified; `MAX_CONFIG_BYTES` at most, `FETCH_TIMEOUT_SEC` per request;
- `file:///absolute/path` (or a bare absolute path), read again at every reload.

Payloads are JSON or YAML: api keys as EventNative's `{"tokens": [...]}` (or `{"api_keys": [...]}`,
or a plain list), destinations as `{"destinations": {...}}` (or the plain mapping).

At start (`resolve_sources`, from `load_config`) a source that cannot be read or is invalid is a
ConfigError: serving without tokens or destinations would refuse or lose events. Afterwards the
`Reloader` (in the serving process) fetches each source every `server.api_keys_reload_sec` /
`server.destinations_reload_sec`; a changed payload is validated with the whole config, exactly as
at start, and, when valid, published to `<log.path>/config/sources.json`. Every collector process
(forked workers too) watches that file (`SourcesWatch`) and switches its tokens and routes; the
serving process's stream workers and uploader are switched by the Reloader's callback. A fetch
error or an invalid payload keeps the last good config; it is logged once per distinct error, and
shown by `/api/v1/status` (`sources_status`).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import yaml

if TYPE_CHECKING:
    from eventspark.config.loading import LoadedConfig

log = logging.getLogger(__name__)

MAX_CONFIG_BYTES = 10 * 1024 * 1024
FETCH_TIMEOUT_SEC = 10.0
"""Per socket operation, and for the whole body."""
READ_CHUNK = 64 * 1024
SOURCE_KEYS = ("api_keys", "server.auth", "destinations")
"""The config keys that may be a source, as dotted paths."""
_PAYLOAD_KEYS = {"api_keys": ("tokens", "api_keys"), "server.auth": ("tokens", "api_keys", "auth")}


class SourceError(ValueError):
    """A source that cannot be read or parsed; the message names the source (without password)."""


@dataclass(frozen=True)
class ConfigSource:
    """One config key given as a URL."""

    key: str
    url: str

    @property
    def shown(self) -> str:
        """The URL without its password (for logs and status)."""
        parts = urllib.parse.urlsplit(self.url)
        if parts.password is None:
            return self.url
        netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def is_source(value: Any) -> bool:
    """Whether a config value is a URL (or absolute path) to read the section from."""
    return isinstance(value, str) and value.strip().startswith(("http://", "https://", "file://", "/"))


def find_sources(raw: dict[str, Any]) -> list[ConfigSource]:
    found = []
    for key in SOURCE_KEYS:
        value = _get(raw, key)
        if is_source(value):
            found.append(ConfigSource(key, value.strip()))
    return found


# --- reading -------------------------------------------------------------------------------------


def fetch(url: str, timeout: float = FETCH_TIMEOUT_SEC) -> bytes:
    """The bytes of `url` (http, https or file); SourceError when it cannot be read."""
    if url.startswith(("http://", "https://")):
        return _fetch_http(url, timeout)
    path = Path(url.removeprefix("file://"))
    try:
        with path.open("rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from None
    return _bounded(data)


def _fetch_http(url: str, timeout: float) -> bytes:
    parts = urllib.parse.urlsplit(url)
    headers = {"Accept": "application/json, application/yaml;q=0.9, */*;q=0.5"}
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        host = parts.hostname or ""
        url = urllib.parse.urlunsplit(parts._replace(netloc=host + (f":{parts.port}" if parts.port else "")))
    request = urllib.request.Request(url, headers=headers)
    try:  # the default context verifies certificates
        with _OPENER.open(request, timeout=timeout) as response:
            return _read_within(response, time.monotonic() + timeout)
    except urllib.error.HTTPError as exc:
        raise SourceError(f"HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise SourceError(f"cannot fetch: {reason}") from None


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follows redirects, but sends the basic auth credentials to their own host only."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        target = urllib.parse.urlsplit(newurl)
        if target.scheme not in ("http", "https"):  # urllib would follow ftp:// too
            raise urllib.error.HTTPError(newurl, code, f"redirect to {target.scheme}: refused", headers, fp)
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        origin = urllib.parse.urlsplit(req.full_url)
        if new is not None and (target.netloc, target.scheme) != (origin.netloc, origin.scheme):
            new.remove_header("Authorization")  # nor in clear text after a redirect to http://
        return new


_OPENER = urllib.request.build_opener(_Redirects())


def _read_within(response: Any, deadline: float) -> bytes:
    """The body, `MAX_CONFIG_BYTES` at most, read before `deadline`: the socket timeout alone
    lets a server that trickles a byte now and then hold the reloader for hours."""
    chunks, size = [], 0
    while chunk := response.read1(READ_CHUNK):  # what arrived: read() would wait for all of it
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_CONFIG_BYTES:
            raise SourceError(f"larger than {MAX_CONFIG_BYTES} bytes")
        if time.monotonic() > deadline:
            raise SourceError("not read within the fetch timeout")
    return b"".join(chunks)


def _bounded(data: bytes) -> bytes:
    if len(data) > MAX_CONFIG_BYTES:
        raise SourceError(f"larger than {MAX_CONFIG_BYTES} bytes")
    return data


def parse_payload(key: str, data: bytes) -> Any:
    """The section a payload gives for `key` (JSON, else YAML); SourceError when unreadable."""
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            document = yaml.safe_load(data)
        except yaml.YAMLError as exc:
            raise SourceError(f"neither JSON nor YAML: {exc}") from None
    if key == "destinations":
        if isinstance(document, dict) and isinstance(document.get("destinations"), dict):
            return document["destinations"]
        if not isinstance(document, dict):
            raise SourceError('destinations must be a mapping, or {"destinations": {...}}')
        return document
    if isinstance(document, dict):
        for name in _PAYLOAD_KEYS[key]:
            if name in document:
                return document[name]
        raise SourceError('api keys must be {"tokens": [...]} or a list of tokens')
    if not isinstance(document, list):
        raise SourceError('api keys must be {"tokens": [...]} or a list of tokens')
    return document


def read_source(source: ConfigSource, timeout: float = FETCH_TIMEOUT_SEC) -> tuple[bytes, Any]:
    """(raw bytes, parsed section) of one source."""
    data = fetch(source.url, timeout)
    return data, parse_payload(source.key, data)


def resolve_sources(raw: Any) -> tuple[Any, dict[str, ConfigSource]]:
    """At start: the document with every source replaced by its section, and the sources."""
    from eventspark.config.loading import ConfigError

    if not isinstance(raw, dict):
        return raw, {}
    sources = {source.key: source for source in find_sources(raw)}
    parts = {}
    for key, source in sources.items():
        try:
            parts[key] = read_source(source)[1]
        except SourceError as exc:
            raise ConfigError(f"{key}: source {source.shown}: {exc}") from None
    return with_parts(raw, parts), sources


def with_parts(raw: dict[str, Any], parts: dict[str, Any]) -> dict[str, Any]:
    """A copy of `raw` with each dotted key of `parts` set to its section."""
    result = dict(raw)
    for key, value in parts.items():
        head, _, tail = key.partition(".")
        if tail:
            result[head] = {**(result.get(head) or {}), tail: value}
        else:
            result[head] = value
    return result


def _get(raw: dict[str, Any], key: str) -> Any:
    head, _, tail = key.partition(".")
    value = raw.get(head)
    if tail:
        return value.get(tail) if isinstance(value, dict) else None
    return value


# --- publishing to the collector processes --------------------------------------------------------


def sources_file(log_path: Path) -> Path:
    return log_path / "config" / "sources.json"


def status_file(log_path: Path) -> Path:
    return log_path / "config" / "sources-status.json"


_published: dict[Path, str] = {}
"""The digest this process last published, by log path: inherited by collector processes forked
after `serve` published the config they start with."""


def publish(log_path: Path, raw: dict[str, Any] | None) -> None:
    """Writes the whole document (sources resolved) for the collector processes; None removes it."""
    path = sources_file(log_path)
    if raw is None:
        path.unlink(missing_ok=True)
        _published.pop(log_path, None)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    body = orjson.dumps(raw, default=str)
    digest = _published[log_path] = hashlib.sha256(body).hexdigest()
    document = orjson.dumps({"digest": digest, "raw": orjson.Fragment(body)})
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # Owner only: the document holds the tokens' secrets and the destinations' passwords.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a leftover tmp file of an earlier crash keeps its own mode otherwise
        os.write(fd, document)
    finally:
        os.close(fd)
    os.replace(tmp, path)  # readers see the old file or the new one, never half of one


def published_raw(loaded: LoadedConfig) -> dict[str, Any] | None:
    """What `publish` writes for a config: its document, the generated token made explicit (every
    process must accept the same one), or None when nothing comes from a source."""
    if not loaded.sources or not isinstance(loaded.raw, dict):
        return None
    raw = dict(loaded.raw)
    token = loaded.generated_token
    if token is not None and "api_keys" not in loaded.sources and "server.auth" not in loaded.sources:
        raw["api_keys"] = [token.model_dump(include={"id", "client_secret", "server_secret", "origins"})]
    return raw


class SourcesWatch:
    """A collector process's view of `sources.json`: `changed()` gives the new document once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stat: tuple[int, int, int] | None = None
        self.digest: str | None = None
        self._previous: str | None = None

    @classmethod
    def open(cls, log_path: Path) -> SourcesWatch | None:
        """The watch when the serving process published a config (its sources), else None."""
        path = sources_file(log_path)
        if not path.exists():
            return None
        watch = cls(path)
        watch.digest = _published.get(log_path)  # the config this process started with
        if watch.digest is None:  # not forked from the publisher: the file's is taken as that
            watch.changed()
        return watch

    def changed(self) -> dict[str, Any] | None:
        """The published document when it differs from the last one seen (a stat when it does not)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        stat = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stat == self._stat:
            return None
        self._stat = stat
        try:
            document = orjson.loads(self.path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            self._stat = None  # read again next time
            return None
        if document.get("digest") == self.digest:
            return None
        first = self.digest is None
        self._previous, self.digest = self.digest, document.get("digest")
        return None if first else document.get("raw")

    def retry(self) -> None:
        """The document `changed` gave could not be used: it is given again at the next call."""
        self._stat, self.digest = None, self._previous


# --- reloading -------------------------------------------------------------------------------------


@dataclass
class SourceState:
    """What the status shows of one source."""

    key: str
    url: str
    period: float
    digest: str = ""
    loaded_at: float | None = None
    checked_at: float | None = None
    error: str | None = None
    next_at: float = 0.0
    logged: str | None = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "url": self.url,
            "period_sec": self.period,
            "loaded_at": _utc(self.loaded_at),
            "checked_at": _utc(self.checked_at),
            "error": self.error,
        }


def _utc(stamp: float | None) -> str | None:
    return None if stamp is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamp))


class Reloader:
    """Fetches the sources of a config every period; applies a changed and valid config.

    `apply(loaded)` is called on the reloader's thread with each new `LoadedConfig`, after the
    document is published for the collector processes.
    """

    def __init__(self, loaded: LoadedConfig, apply: Callable[[LoadedConfig], None]) -> None:
        if loaded.generated_token is not None:  # the printed token must survive reloads
            loaded.raw = published_raw(loaded)
        self.loaded = loaded
        self.apply = apply
        self.log_path = Path(loaded.config.log.path)
        server = loaded.config.server
        api_period = server.auth_reload_sec or server.api_keys_reload_sec
        self.states = {
            key: SourceState(key, source.shown, server.destinations_reload_sec if key == "destinations" else api_period)
            for key, source in loaded.sources.items()
        }
        self._parts: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not self.states or self._thread is not None:
            return
        now = time.monotonic()
        for state in self.states.values():
            state.next_at = now + state.period
            state.loaded_at = time.time()
        self._write_status()
        self._thread = threading.Thread(target=self._loop, name="eventspark-config-reload", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(FETCH_TIMEOUT_SEC + 60)  # a fetch, then stream workers rebuilt (30 s each at most)
            self._thread = None

    def _loop(self) -> None:
        while True:
            wait = min(state.next_at for state in self.states.values()) - time.monotonic()
            if self._stop.wait(max(wait, 0.05)):
                return
            try:
                self.check()
            except Exception:  # a reload must never end the loop
                log.exception("reloading the config sources failed")

    def check(self, force: bool = False) -> bool:
        """Fetches the sources due now (all with `force`); True when a new config was applied."""
        now = time.monotonic()
        changed = False
        for key, state in self.states.items():
            if not force and state.next_at > now:
                continue
            state.next_at = now + state.period
            changed |= self._fetch(key, state)
        applied = changed and self._rebuild()
        self._write_status()
        return applied

    def _fetch(self, key: str, state: SourceState) -> bool:
        state.checked_at = time.time()
        try:
            data, part = read_source(self.loaded.sources[key])
        except SourceError as exc:
            self._failed(state, f"source {state.url}: {exc}")
            return False
        digest = hashlib.sha256(data).hexdigest()
        if digest == state.digest:  # unchanged since the last fetch (applied, or refused)
            if state.error and state.error.startswith("source "):  # reachable again
                state.error = None
            return False
        state.digest = digest
        if part == _get(self.loaded.raw, key):  # what runs (the first fetch after start, a revert)
            self._parts.pop(key, None)
            state.error = None
            return False
        self._parts[key] = part
        return True

    def _rebuild(self) -> bool:
        from eventspark.config.loading import ConfigError, build_loaded

        raw = with_parts(self.loaded.raw, self._parts)
        try:
            loaded = build_loaded(raw, embedded=False, sources=self.loaded.sources)
        except ConfigError as exc:
            for key in self._parts:
                self._failed(self.states[key], f"invalid, the last good config is kept: {exc}")
            return False
        self._parts = {}
        for state in self.states.values():
            state.error, state.logged, state.loaded_at = None, None, time.time()
        self.loaded = loaded
        publish(self.log_path, published_raw(loaded))
        for warning in loaded.warnings:
            if warning.startswith(tuple(self.states)):  # the file's own were shown at start
                log.warning("config source: %s", warning)
        log.info(
            "config sources reloaded: %d token(s), %d destination(s)",
            len(loaded.config.api_keys),
            len(loaded.config.destinations),
        )
        self.apply(loaded)
        return True

    def _failed(self, state: SourceState, error: str) -> None:
        error = " ".join(error.split())  # one line (YAML and validation errors span several)
        state.error = error
        if error != state.logged:  # once per distinct error, not every period
            log.error("config source %s: %s", state.key, error)
            state.logged = error

    def _write_status(self) -> None:
        path = status_file(self.log_path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(orjson.dumps([state.to_json() for state in self.states.values()]))
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("cannot write %s: %s", path, exc)


def sources_status(log_path: Path) -> list[dict[str, Any]] | None:
    """The reloader's last status of each source (None when the config has none)."""
    try:
        return orjson.loads(status_file(log_path).read_bytes()) if sources_file(log_path).exists() else None
    except (OSError, orjson.JSONDecodeError):
        return None
