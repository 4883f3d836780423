"""Config sections shared by the config file and the destination packages.

Each destination package's `configuration.py` defines its own model on top of `DestinationBase`;
this module imports nothing from eventspark, so those packages can import it without a cycle.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator


class Section(BaseModel):
    """Base of every config section: unknown keys are kept so they can be reported."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


DEFAULT_ANONYMOUS_ID_NODE = (
    "/eventn_ctx/user/anonymous_id||/user/anonymous_id||/eventn_ctx/user/hashed_anonymous_id||/user/hashed_anonymous_id"
)
"""EventNative 1.41's default: JS SDK 1.x (nested `eventn_ctx`) or 2.x (flat `user`), `||` alternatives."""
DEFAULT_IDENTIFICATION_NODES = (
    "/eventn_ctx/user/id||/user/id",
    "/eventn_ctx/user/email||/user/email",
    "/eventn_ctx/user/internal_id||/user/internal_id",
)
"""EventNative 1.41's default (`internal_id` kept by EventNative for older configs)."""


class UsersRecognition(Section):
    """EventNative's `users_recognition` (issue 17, `docs/users-recognition.md`): once an event
    identifies a user, the earlier events of its anonymous id get the user id in every table."""

    enabled: bool = False
    anonymous_id_node: str = Field(
        default=DEFAULT_ANONYMOUS_ID_NODE, min_length=1, max_length=1000, description="`||` separates alternatives"
    )
    identification_nodes: list[str] | None = Field(
        default=None,
        max_length=20,
        description="user id paths (`||` alternatives); default: [user_id_node] when given, else EventNative's",
    )
    user_id_node: str | None = Field(default=None, description="EventNative's older single-path form")
    index_ttl_hours: float = Field(
        default=24 * 7, gt=0, description="how long an anonymous id is remembered, waiting for its user"
    )
    index_max_ids: int = Field(
        default=250_000,
        ge=1,
        description="most anonymous ids the in-memory index keeps per destination (the oldest go first; "
        "about 1 KB each): with more visitors, use meta.storage.redis",
    )

    def nodes(self) -> list[str]:
        """The identification nodes in force."""
        if self.identification_nodes:
            return list(self.identification_nodes)
        return [self.user_id_node] if self.user_id_node else list(DEFAULT_IDENTIFICATION_NODES)


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
    unmapped_column: str | None = Field(
        default=None,
        description="a JSON column that takes the fields beyond max_columns (or new ones when the schema is frozen)",
    )
    schema_freeze: bool = Field(default=False, description="never add columns: new fields go to unmapped_column")
    transform: str | None = Field(default=None, description="EventNative's place of the destination's `transform`")
    transform_enabled: bool | None = Field(default=None, description="EventNative: false turns `transform` off")

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


class DestinationStream(Section):
    """Per destination: how stream-mode inserts are batched beyond the worker's micro-batches.

    None means the destination type's default (its capabilities): ClickHouse wants few, large
    inserts, so its rows are held up to a second or 10,000 rows per table; others insert at once.
    """

    min_insert_interval_sec: float | None = Field(
        default=None,
        ge=0,
        le=3600,
        description="least time between two inserts; micro-batches are held meanwhile",
    )
    min_insert_rows: int | None = Field(
        default=None, ge=0, description="rows that trigger an insert before the interval has passed"
    )


class RetrySection(Section):
    """How transient errors are retried (`eventspark.retry`): exponential back-off from `base_sec`,
    doubled per failed attempt up to `max_sec`; past `max_age_hours` since the first failure the
    events go to `events/failed` with the last error. Unset fields: the global `retry:` section,
    then the mode's default (batch: 60 s up to an hour; stream: `stream.retry_min_sec` up to
    `stream.retry_max_sec`; both: 72 hours)."""

    base_sec: float | None = Field(default=None, gt=0, description="first wait after a failed attempt")
    max_sec: float | None = Field(default=None, gt=0, description="longest wait between two attempts")
    max_age_hours: float | None = Field(
        default=None, gt=0, description="after this long failing, the events go to events/failed"
    )

    @model_validator(mode="after")
    def _ordered(self) -> RetrySection:
        if self.base_sec is not None and self.max_sec is not None and self.base_sec > self.max_sec:
            raise ValueError(f"retry.base_sec ({self.base_sec}) is larger than retry.max_sec ({self.max_sec})")
        return self


class DestinationBase(Section):
    """What every destination type has; each package's `configuration.py` adds its own block."""

    type: str
    mode: Literal["batch", "stream"] = "batch"
    only_tokens: list[str] | None = None
    data_layout: DataLayout = Field(default_factory=DataLayout)
    enrichment: list[EnrichmentRule] = Field(default_factory=list)
    users_recognition: UsersRecognition | None = None
    """Overrides the global `users_recognition` for this destination."""
    transform: str | None = Field(
        default=None, description="JavaScript function body over `$` (the event): an event, an array, or null"
    )
    transform_enabled: bool | None = Field(default=None, description="EventNative: false turns `transform` off")
    transform_timeout_ms: int = Field(default=1000, ge=1, le=60_000, description="CPU time per event, ms")
    transform_memory_mb: int = Field(default=64, ge=8, le=4096, description="memory of the transform's JS engine")
    stream: DestinationStream = Field(default_factory=DestinationStream)
    retry: RetrySection = Field(default_factory=RetrySection)
