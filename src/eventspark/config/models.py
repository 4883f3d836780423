"""Configuration models: EventNative's config format plus eventspark's own `spark:` section.

Every section allows unknown keys so that they can be reported as warnings (see `unknown_keys`)
rather than rejected or silently dropped.
"""

from __future__ import annotations

import hashlib
import ipaddress
from typing import Annotated, Any, Union

from pydantic import BeforeValidator, Field, field_validator, model_validator

from eventspark.config.base import (
    DataLayout,
    DataSource,
    DestinationBase,
    DestinationStream,
    EnrichmentRule,
    MappingField,
    Mappings,
    RetrySection,
    Section,
    UsersRecognition,
)
from eventspark.destinations.registry import check_mode, config_models, destination_type

__all__ = [
    "ApiKey",
    "Config",
    "CoordinationConfig",
    "DataLayout",
    "DataSource",
    "Destination",
    "DestinationBase",
    "DestinationStream",
    "EnrichmentRule",
    "EtcdConfig",
    "MappingField",
    "Mappings",
    "RedisConfig",
    "RetrySection",
    "ServerConfig",
    "SparkConfig",
    "StreamConfig",
    "UsersRecognition",
]


# --- server, tokens, logs -------------------------------------------------------------------------


class ApiKey(Section):
    """A token: the client secret is for browsers (JS endpoint), the server secret for s2s calls."""

    id: str = ""
    client_secret: str = ""
    server_secret: str = ""
    origins: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _from_plain_string(cls, value: Any) -> Any:
        # EventNative accepted bare strings: one secret used for both endpoints.
        if isinstance(value, str):
            return {"client_secret": value, "server_secret": value}
        return value

    @model_validator(mode="after")
    def _default_id(self) -> ApiKey:
        if not self.client_secret and not self.server_secret:
            raise ValueError("a token needs client_secret or server_secret")
        if not self.id:
            self.id = hashlib.md5((self.client_secret + self.server_secret).encode()).hexdigest()
        return self


class PrometheusConfig(Section):
    enabled: bool = True


class MetricsConfig(Section):
    prometheus: PrometheusConfig = Field(default_factory=PrometheusConfig)


class EventsCacheSize(Section):
    size: int = Field(default=100, ge=0, le=100_000, description="events kept per destination (0: none)")
    time_window_sec: float = Field(
        default=60, gt=0, description="EventNative: window of its per-destination rate limit of cached events"
    )


class EventsCacheConfig(Section):
    """EventNative's `server.cache`: the last events per destination (`/api/v1/events/cache`, `/ui`)."""

    enabled: bool = True
    events: EventsCacheSize = Field(default_factory=EventsCacheSize)


class ServerLogConfig(Section):
    """The server's own log (not the events' `log:`)."""

    format: str = Field(default="text", pattern="^(text|json)$", description="text, or JSON lines with ids")
    level: str = Field(default="info", pattern="^(?i)(debug|info|warning|error)$")
    path: str | None = Field(default=None, description="EventNative: a directory for the server's log file")
    rotation_min: float = Field(default=1440, gt=0, description="the log file is rotated every rotation_min minutes")
    max_backups: int = Field(default=10, ge=0, description="rotated log files kept (0: all)")


class ServerConfig(Section):
    name: str = ""
    host: str = "0.0.0.0"
    port: int = Field(default=8001, ge=1, le=65535)
    admin_token: str | None = None
    max_columns: int = Field(default=100, ge=1)
    max_event_size: int = Field(default=1024 * 1024, ge=1024, description="Largest accepted body in bytes")
    fsync: bool = Field(default=False, description="fsync incoming logs (group commit) before answering")
    workers: int = Field(default=1, ge=1, description="collector worker processes")
    trusted_proxies: list[str] | None = Field(
        default=None,
        description="addresses or CIDRs whose X-Real-IP / X-Forwarded-For are believed; unset: any peer's",
    )

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: list[str] | None) -> list[str] | None:
        for entry in value or ():
            try:
                ipaddress.ip_network(entry.strip(), strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address or CIDR network") from None
        return value

    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    cache: EventsCacheConfig = Field(default_factory=EventsCacheConfig)
    log: ServerLogConfig = Field(default_factory=ServerLogConfig)
    auth: list[ApiKey] = Field(default_factory=list, description="EventNative 1.30 place for api_keys")
    static_files_dir: str | None = Field(
        default=None,
        description="EventNative: lib.js and inline.js served under /s/ and /t/; default: the SDK fetched at install",
    )
    public_url: str | None = Field(
        default=None, description="EventNative: this collector's public URL, /t/inline.js's default tracking_host"
    )
    api_keys_reload_sec: float = Field(default=3, gt=0, description="reload period of api_keys given as a URL")
    auth_reload_sec: float | None = Field(
        default=None, gt=0, description="EventNative's older name of api_keys_reload_sec"
    )
    destinations_reload_sec: float = Field(default=5, gt=0, description="reload period of destinations given as a URL")


def without_credentials(url: str) -> str:
    """`url` without its `user:password@` (or `user@`) part: what logs, errors, lock names and
    status output show of `log.remote.url` (`sftp://user:pw@host/path` → `sftp://host/path`)."""
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    if not sep or "@" not in authority:
        return url
    return f"{scheme}://{authority.rpartition('@')[2]}{slash}{path}"


class RemoteLogs(Section):
    """`log.remote`: rotated logs, their status files, the archive and failed files on object
    storage (any fsspec URL: `s3://bucket/prefix`, `gs://…`, `file:///…`), so that collector
    nodes and a Spark cluster share no filesystem (`eventspark.logs.remote`)."""

    url: str = Field(
        description="fsspec URL of the folder, e.g. s3://bucket/prefix",
        repr=False,  # may hold user:password (sftp://…): reprs show `shown_url`
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict,
        description="fsspec's options of the URL's filesystem, e.g. key, secret, endpoint_url",
        repr=False,  # holds the store's keys
    )

    @field_validator("url")
    @classmethod
    def _url_with_protocol(cls, url: str) -> str:
        # Without `proto://`, fsspec reads a local path: a typo for s3:// would then "upload" the
        # logs to a folder of this node, out of every other node's and the cluster's reach.
        protocol, sep, path = url.strip().partition("://")
        if not sep or not protocol or not path.strip("/") or not protocol.replace("+", "").isalnum():
            raise ValueError("must be an fsspec URL with a protocol and a path, e.g. s3://bucket/prefix")
        if any(char in url for char in "*?["):  # fsspec reads them as globs in every key under it
            raise ValueError("must not hold *, ? or [ (fsspec reads them as globs)")
        return url.strip().rstrip("/")

    @property
    def shown_url(self) -> str:
        """The URL as logs, errors, lock names and status output show it: no credentials."""
        return without_credentials(self.url)

    def __repr_args__(self) -> Any:
        yield "url", self.shown_url
        yield from super().__repr_args__()


class LogConfig(Section):
    path: str = "./events"
    remote: RemoteLogs | None = Field(
        default=None, description="rotated logs uploaded to object storage and loaded from there (unset: local only)"
    )
    rotation_min: float = Field(default=5, gt=0)
    uploader_period_sec: float = Field(default=60, gt=0)
    archive_retention_days: float | None = Field(
        default=None, gt=0, description="archive/ files older than this are removed (unset: kept)"
    )
    archive_max_gb: float | None = Field(
        default=None, gt=0, description="archive/ is cut to this size, oldest first (unset: no cap)"
    )
    failed_retention_days: float | None = Field(
        default=None, gt=0, description="failed/ files untouched for this long are removed (unset: kept)"
    )
    failed_max_gb: float | None = Field(
        default=None, gt=0, description="failed/ is cut to this size, oldest first (unset: no cap)"
    )


class GeoConfig(Section):
    maxmind_path: str | None = None


# --- destinations ---------------------------------------------------------------------------------


def _registered_type(raw: Any) -> Any:
    """Refuses a type or a type×mode the registry does not have, naming what it supports (before
    the union, whose own error for an unknown tag does not say "not supported yet"), and reads
    the newer spelling of the type's block, `config:`. Without `mode`, a type that has one mode
    only (the HTTP services: stream; files: batch) runs in it."""
    if isinstance(raw, dict) and isinstance(raw.get("type"), str):
        entry = destination_type(raw["type"])
        if "mode" not in raw and len(entry.capabilities.modes) == 1:
            raw = {**raw, "mode": next(iter(entry.capabilities.modes))}
        mode = raw.get("mode", "batch")
        if mode in ("batch", "stream"):  # anything else: pydantic names the bad value
            check_mode(raw["type"], mode)
        raw = _config_block(raw, entry.config)
    return raw


def _config_block(raw: dict[str, Any], model: type[Any]) -> dict[str, Any]:
    """EventNative accepts a type's block under `config:` too (`type: postgres, config: {host...}`):
    it becomes the type's first own block (`datasource`, `clickhouse`, `snowflake`, `google`...).
    Both spellings at once: `config` is left alone, and reported as a key without effect."""
    if "config" not in raw:
        return raw
    own = [name for name in model.model_fields if name not in DestinationBase.model_fields]
    if not own or own[0] in raw:
        return raw
    return {**{k: v for k, v in raw.items() if k != "config"}, own[0]: raw["config"]}


Destination = Annotated[
    Union[config_models()],  # noqa: UP007 (the members are a runtime tuple)
    Field(discriminator="type"),
    BeforeValidator(_registered_type),
]
"""A destination of any registered type (`destinations.registry`)."""


# --- coordination, users recognition, spark ---------------------------------------------------


class RedisConfig(Section):
    host: str = "localhost"
    port: int = 6379
    password: str | None = None


class EtcdConfig(Section):
    endpoint: str


class CoordinationConfig(Section):
    type: str | None = Field(
        default=None,
        pattern="^(redis|etcd|inmemory)$",
        description="later EventNative form: redis uses meta.storage.redis",
    )
    redis: RedisConfig | None = None
    etcd: EtcdConfig | None = None
    lock_lease_sec: float = Field(default=15, gt=0, description="how long a dead node's table lock survives it")
    heartbeat_ttl_sec: float = Field(default=30, gt=0, description="how long a silent node stays listed")
    key_prefix: str | None = Field(default=None, description="keys' namespace; None: the backend's own")

    @model_validator(mode="after")
    def _one_backend(self) -> CoordinationConfig:
        if self.redis is not None and self.etcd is not None:
            raise ValueError("choose one of redis or etcd, not both")
        if self.type == "etcd" and self.etcd is None:
            raise ValueError("type etcd needs coordination.etcd.endpoint")
        if self.type in ("etcd", "inmemory") and self.redis is not None:
            raise ValueError(f"type {self.type} does not use coordination.redis: remove one of them")
        if self.type in ("redis", "inmemory") and self.etcd is not None:
            raise ValueError(f"type {self.type} does not use coordination.etcd: remove one of them")
        return self


class StreamConfig(Section):
    """Micro-batching and retries of the stream workers."""

    batch_events: int = Field(default=1000, ge=1, description="most events in one micro-batch")
    batch_wait_ms: float = Field(default=100, gt=0, description="idle wait for the first event")
    retry_min_sec: float = Field(default=0.5, gt=0, description="first backoff after a connection error")
    retry_max_sec: float = Field(default=60, gt=0, description="longest backoff")
    poll_ms: float = Field(default=10, gt=0, description="how often an idle worker looks for new events")


class MetaStorageConfig(Section):
    redis: RedisConfig | None = None


class MetaConfig(Section):
    """EventNative's `meta.storage`: where shared operator state lives (the events cache)."""

    storage: MetaStorageConfig = Field(default_factory=MetaStorageConfig)


class SqlDebugLogTarget(Section):
    path: str = Field(description="a file, or a directory that gets one")
    rotation_min: float = Field(default=1440, gt=0)
    max_backups: int = Field(default=10, ge=0)


class SqlDebugLogConfig(Section):
    """EventNative's `sql_debug_log`: every DDL statement (`ddl`) and every query (`queries`) to files."""

    ddl: SqlDebugLogTarget | None = None
    queries: SqlDebugLogTarget | None = None


class SparkConfig(Section):
    """Where the batch job runs: `local[*]` by default, any Spark master URL by configuration."""

    master: str = "local[*]"
    app_name: str = "eventspark"
    conf: dict[str, str] = Field(default_factory=dict)
    keep_session: str = Field(
        default="auto",
        pattern="^(auto|always|never)$",
        description=(
            "whether a serve node keeps its SparkSession between passes. auto: kept, except on a cluster "
            "master with dynamic allocation turned off (an idle session would hold the cluster's cores); "
            "always: kept; never: stopped after every pass (docs/spark-clusters.md)"
        ),
    )

    commit_connections: int = Field(
        default=0,
        ge=0,
        le=1024,
        description=(
            "connections per pass that commit staged rows at once, a task's rows per commit (Postgres, MySQL: "
            "docs/batch.md); 0: as many as the Spark job's parallelism, 16 at most"
        ),
    )

    @field_validator("conf", mode="before")
    @classmethod
    def _stringify(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): _conf_str(v) for k, v in value.items()}
        return value


def _conf_str(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


class Config(Section):
    server: ServerConfig = Field(default_factory=ServerConfig)
    api_keys: list[ApiKey] = Field(default_factory=list)
    log: LogConfig = Field(default_factory=LogConfig)
    geo: GeoConfig = Field(default_factory=GeoConfig)
    destinations: dict[str, Destination] = Field(default_factory=dict)
    coordination: CoordinationConfig | None = None
    meta: MetaConfig = Field(default_factory=MetaConfig)
    users_recognition: UsersRecognition = Field(default_factory=UsersRecognition)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    stream: StreamConfig = Field(default_factory=StreamConfig)
    retry: RetrySection = Field(default_factory=RetrySection)
    sql_debug_log: SqlDebugLogConfig = Field(default_factory=SqlDebugLogConfig)

    @model_validator(mode="before")
    @classmethod
    def _dotted_keys(cls, value: Any) -> Any:
        # EventNative configs write `geo.maxmind_path: ...` as one dotted top-level key.
        if isinstance(value, dict) and "geo.maxmind_path" in value:
            value = dict(value)
            geo = dict(value.get("geo") or {})
            geo.setdefault("maxmind_path", value.pop("geo.maxmind_path"))
            value["geo"] = geo
        return value

    @model_validator(mode="after")
    def _coordination_redis(self) -> Config:
        # EventNative's later form: `coordination: {type: redis}` with the server in meta.storage.redis.
        section = self.coordination
        if section is not None and section.type == "redis" and section.redis is None:
            if self.meta.storage.redis is None:
                raise ValueError("coordination.type redis needs meta.storage.redis (or coordination.redis)")
            section.redis = self.meta.storage.redis.model_copy()
        return self

    @model_validator(mode="after")
    def _merge_tokens(self) -> Config:
        self.api_keys = [*self.api_keys, *self.server.auth]
        self.server.auth = []
        seen: set[str] = set()
        for key in self.api_keys:
            if key.id in seen:
                raise ValueError(f"api_keys: token id {key.id!r} is used twice")
            seen.add(key.id)
        return self
