"""Configuration models: EventNative's config format plus eventspark's own `spark:` section.

Every section allows unknown keys so that they can be reported as warnings (see `unknown_keys`)
rather than rejected or silently dropped.
"""

from __future__ import annotations

import hashlib
import ipaddress
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator


class Section(BaseModel):
    """Base of every config section: unknown keys are kept so they can be reported."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


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
    auth: list[ApiKey] = Field(default_factory=list, description="EventNative 1.30 place for api_keys")


class LogConfig(Section):
    path: str = "./events"
    rotation_min: float = Field(default=5, gt=0)
    uploader_period_sec: float = Field(default=60, gt=0)


class GeoConfig(Section):
    maxmind_path: str | None = None


# --- destinations ---------------------------------------------------------------------------------


class MappingField(Section):
    src: str | None = None
    dst: str | None = None
    action: Literal["move", "remove", "cast", "constant"]
    type: str | None = None
    value: Any = None


class Mappings(Section):
    keep_unmapped: bool = True
    fields: list[MappingField] = Field(default_factory=list)

    def rules(self) -> list[dict[str, Any]]:
        """The rules in the plain form `steps.mapping.Mapper.build` takes."""
        return [f.model_dump(exclude_none=True, exclude=set(f.model_extra or ())) for f in self.fields]


class DataLayout(Section):
    table_name_template: str = "events"
    mappings: Mappings | None = None
    mapping: list[str] | None = Field(default=None, description="legacy EventNative form: '/src -> /dst'")
    primary_key_fields: list[str] = Field(default_factory=list)
    max_columns: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _legacy_mapping(self) -> DataLayout:
        if self.mapping is not None and self.mappings is None:
            self.mappings = Mappings(keep_unmapped=True, fields=[_legacy_rule(r) for r in self.mapping])
        return self


def _legacy_rule(rule: str) -> MappingField:
    """'/a -> /b' moves a to b; '/a ->' removes a (EventNative's first mapping syntax)."""
    src, sep, dst = rule.partition("->")
    if not sep or not src.strip():
        raise ValueError(f"mapping rule {rule!r} must look like '/src -> /dst' or '/src ->'")
    if dst.strip():
        return MappingField(src=src.strip(), dst=dst.strip(), action="move")
    return MappingField(src=src.strip(), action="remove")


class EnrichmentRule(Section):
    name: Literal["ip_lookup", "user_agent_parse"]
    from_: str = Field(validation_alias=AliasChoices("from", "from_"))
    to: str


class DataSource(Section):
    """Connection of SQL warehouses (Postgres, Redshift, MySQL)."""

    host: str = "localhost"
    port: int | None = Field(default=None, ge=1, le=65535)
    db: str
    schema_: str = Field(default="", validation_alias=AliasChoices("schema", "schema_"))
    username: str = ""
    password: str = ""
    parameters: dict[str, str] = Field(default_factory=dict)


class DestinationBase(Section):
    mode: Literal["batch", "stream"] = "batch"
    only_tokens: list[str] | None = None
    data_layout: DataLayout = Field(default_factory=DataLayout)
    enrichment: list[EnrichmentRule] = Field(default_factory=list)


class PostgresDestination(DestinationBase):
    type: Literal["postgres"]
    datasource: DataSource


class RedshiftDestination(DestinationBase):
    type: Literal["redshift"]
    datasource: DataSource
    s3: dict[str, Any] | None = None


class MySQLDestination(DestinationBase):
    type: Literal["mysql"]
    datasource: DataSource


class ClickHouseField(Section):
    function: str | None = None
    field: str


class ClickHouseEngine(Section):
    raw_statement: str | None = None
    nullable_fields: list[str] = Field(default_factory=list)
    partition_fields: list[ClickHouseField] = Field(default_factory=list)
    order_fields: list[ClickHouseField] = Field(default_factory=list)
    primary_keys: list[str] = Field(default_factory=list)


class ClickHouseConfig(Section):
    dsns: list[str] = Field(min_length=1)
    db: str
    cluster: str | None = None
    engine: ClickHouseEngine = Field(default_factory=ClickHouseEngine)
    tls: dict[str, str] = Field(default_factory=dict)


class ClickHouseDestination(DestinationBase):
    type: Literal["clickhouse"]
    clickhouse: ClickHouseConfig


class GoogleConfig(Section):
    gcs_bucket: str | None = None
    bq_project: str | None = None
    bq_dataset: str | None = None
    key_file: str | None = None


class BigQueryDestination(DestinationBase):
    type: Literal["bigquery"]
    google: GoogleConfig


class SnowflakeConfig(Section):
    account: str
    port: int | None = None
    db: str
    schema_: str = Field(default="PUBLIC", validation_alias=AliasChoices("schema", "schema_"))
    username: str = ""
    password: str = ""
    warehouse: str = ""
    stage: str | None = None
    parameters: dict[str, str] = Field(default_factory=dict)


class SnowflakeDestination(DestinationBase):
    type: Literal["snowflake"]
    snowflake: SnowflakeConfig


class DuckDBConfig(Section):
    path: str = "warehouse.duckdb"
    schema_: str = Field(default="main", validation_alias=AliasChoices("schema", "schema_"))


class DuckDBDestination(DestinationBase):
    """eventspark's embedded default warehouse: a DuckDB file (relative paths are under log.path)."""

    type: Literal["duckdb"]
    duckdb: DuckDBConfig = Field(default_factory=DuckDBConfig)


Destination = Annotated[
    PostgresDestination
    | RedshiftDestination
    | MySQLDestination
    | ClickHouseDestination
    | BigQueryDestination
    | SnowflakeDestination
    | DuckDBDestination,
    Field(discriminator="type"),
]


# --- coordination, users recognition, spark ---------------------------------------------------


class RedisConfig(Section):
    host: str = "localhost"
    port: int = 6379
    password: str | None = None


class EtcdConfig(Section):
    endpoint: str


class CoordinationConfig(Section):
    redis: RedisConfig | None = None
    etcd: EtcdConfig | None = None
    lock_lease_sec: float = Field(default=15, gt=0, description="how long a dead node's table lock survives it")
    heartbeat_ttl_sec: float = Field(default=30, gt=0, description="how long a silent node stays listed")
    key_prefix: str | None = Field(default=None, description="keys' namespace; None: the backend's own")

    @model_validator(mode="after")
    def _one_backend(self) -> CoordinationConfig:
        if self.redis is not None and self.etcd is not None:
            raise ValueError("choose one of redis or etcd, not both")
        return self


class UsersRecognition(Section):
    enabled: bool = False
    anonymous_id_node: str = "/eventn_ctx/user/anonymous_id"
    user_id_node: str = "/eventn_ctx/user/internal_id"


class StreamConfig(Section):
    """Micro-batching and retries of the stream workers."""

    batch_events: int = Field(default=1000, ge=1, description="most events in one micro-batch")
    batch_wait_ms: float = Field(default=100, gt=0, description="idle wait for the first event")
    retry_min_sec: float = Field(default=0.5, gt=0, description="first backoff after a connection error")
    retry_max_sec: float = Field(default=60, gt=0, description="longest backoff")
    poll_ms: float = Field(default=10, gt=0, description="how often an idle worker looks for new events")


class SparkConfig(Section):
    """Where the batch job runs: `local[*]` by default, any Spark master URL by configuration."""

    master: str = "local[*]"
    app_name: str = "eventspark"
    conf: dict[str, str] = Field(default_factory=dict)

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
    users_recognition: UsersRecognition = Field(default_factory=UsersRecognition)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    stream: StreamConfig = Field(default_factory=StreamConfig)

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
    def _merge_tokens(self) -> Config:
        self.api_keys = [*self.api_keys, *self.server.auth]
        self.server.auth = []
        seen: set[str] = set()
        for key in self.api_keys:
            if key.id in seen:
                raise ValueError(f"api_keys: token id {key.id!r} is used twice")
            seen.add(key.id)
        return self
