"""Reading a config file: YAML or JSON, `${env.VAR}` substitution, validation, defaults."""

from __future__ import annotations

import logging
import os
import re
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml
from pydantic import BaseModel, ValidationError

from eventspark.config.models import ApiKey, Config
from eventspark.config.routing import unknown_tokens
from eventspark.config.sources import MAX_CONFIG_BYTES, ConfigSource, resolve_sources
from eventspark.destinations.duckdb.configuration import DuckDBDestination
from eventspark.destinations.registry import REGISTRY

logger = logging.getLogger(__name__)

ENV_PLACEHOLDER = re.compile(r"\$\{env\.([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(ValueError):
    """A config that cannot be used; the message names the key path and the reason."""


@dataclass
class LoadedConfig:
    config: Config
    warnings: list[str] = field(default_factory=list)
    generated_token: ApiKey | None = None
    raw: Any = None
    """The parsed document, sources resolved (what a reload starts from: `eventspark.config.sources`)."""
    sources: dict[str, ConfigSource] = field(default_factory=dict)
    """The keys given as a URL (`api_keys`, `server.auth`, `destinations`), reloaded by `serve`."""


def load_config(path: str | Path | None, env: Mapping[str, str] | None = None) -> LoadedConfig:
    """Loads and validates `path`; with no path, the embedded defaults."""
    raw: Any = {} if path is None else read_config_file(Path(path))
    raw = substitute_env(raw, os.environ if env is None else env)
    raw, sources = resolve_sources(raw)  # api_keys / destinations given as a URL: fetched now
    loaded = build_loaded(raw, embedded=path is None, sources=sources)
    if single_node_remote(loaded.config):  # once per process, not at each reload of its sources
        logger.warning(
            "log.remote with coordination type inmemory: passes are one at a time on this node only;"
            " run a single node, or configure coordination.redis or coordination.etcd for several"
        )
    return loaded


def build_loaded(
    raw: Any, embedded: bool, sources: dict[str, ConfigSource] | None = None, checked: bool = False
) -> LoadedConfig:
    """Validation, checks and defaults of a parsed document (at start, and at each reload of its sources).
    `checked`: the serving process checked this document already (a collector worker following its
    reloads), so the step checks, which compile every template and JS transform, are not run again."""
    config = validate_config(raw)
    check_unimplemented(config)
    check_object_locations(config)
    check_remote_coordination(config)
    loaded = LoadedConfig(config=config, warnings=[*unknown_keys(config), *keys_without_effect(config)])
    loaded.raw, loaded.sources = raw, sources or {}
    apply_defaults(loaded, embedded=embedded)
    if not checked:
        check_steps(config)
    return loaded


def read_config_file(path: Path) -> Any:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        if path.suffix.lower() == ".json":
            return orjson.loads(data)
        return yaml.safe_load(data) or {}
    except (orjson.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from exc


def substitute_env(value: Any, env: Mapping[str, str], where: str = "") -> Any:
    """Replaces `${env.VAR}` (or `${env.VAR:-default}`) in every string of the parsed document."""
    if isinstance(value, str):
        return _substitute_string(value, env, where)
    if isinstance(value, dict):
        return {k: substitute_env(v, env, _join(where, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute_env(v, env, _join(where, i)) for i, v in enumerate(value)]
    return value


def _substitute_string(text: str, env: Mapping[str, str], where: str) -> str:
    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise ConfigError(f"{where or '<root>'}: environment variable {name} is not set")

    return ENV_PLACEHOLDER.sub(replace, text) if "${env." in text else text


def validate_config(raw: Any) -> Config:
    if not isinstance(raw, dict):
        raise ConfigError(f"<root>: the config must be a mapping, got {type(raw).__name__}")
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


def format_validation_error(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors(include_url=False):
        loc = _location(error["loc"])
        lines.append(f"{loc or '<root>'}: {error['msg']}")
    return "invalid config:\n  " + "\n  ".join(dict.fromkeys(lines))


def _location(loc: tuple[Any, ...]) -> str:
    # Drop pydantic's union tags (the `postgres` in destinations.pg.postgres.datasource) and validator names.
    parts = list(loc)
    if len(parts) > 2 and parts[0] == "destinations" and parts[2] in REGISTRY:
        del parts[2]
    return ".".join(str(p) for p in parts if not (isinstance(p, str) and p.startswith("function-")))


def unknown_keys(model: BaseModel, where: str = "") -> Iterator[str]:
    """Warnings for keys that no model field took."""
    for key in model.model_extra or {}:
        yield f"{_join(where, key)}: unknown key, ignored"
    for name in type(model).model_fields:
        yield from _unknown_in(getattr(model, name), _join(where, name))


def _unknown_in(value: Any, where: str) -> Iterator[str]:
    if isinstance(value, BaseModel):
        yield from unknown_keys(value, where)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _unknown_in(v, _join(where, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _unknown_in(v, _join(where, i))


def _join(where: str, key: object) -> str:
    return f"{where}.{key}" if where else str(key)


def check_unimplemented(config: Config) -> None:
    """ConfigError for a feature the config turns on that eventspark does not have: serving
    without it would silently do less than the config says. Users recognition turned on in a
    destination's own section of a type that cannot update rows (files, HTTP family, Redshift,
    Snowflake, BigQuery) is refused; turned on globally, such destinations get a warning
    (`keys_without_effect`) and load as before (docs/users-recognition.md)."""
    for dest_id, dest in config.destinations.items():
        section = dest.users_recognition
        if section is not None and section.enabled and REGISTRY[dest.type].capabilities.users_recognition == "none":
            raise ConfigError(
                f"destinations.{dest_id}.users_recognition: {dest.type} cannot update rows, so users recognition"
                " is not supported there; set enabled: false or remove the section"
            )


def check_object_locations(config: Config) -> None:
    """ConfigError for two destinations writing objects to one place (the files family's
    `object_location()`: type, endpoint, bucket, folder): object names come from the log and the
    table, so each would overwrite the other's objects and remove them as stale."""
    seen: dict[tuple[str, ...], str] = {}
    for dest_id, dest in config.destinations.items():
        location = getattr(dest, "object_location", None)
        if location is None:
            continue
        first = seen.setdefault(location(), dest_id)
        if first != dest_id:
            raise ConfigError(
                f"destinations.{first} and destinations.{dest_id} write objects to the same bucket and folder; "
                "give each its own folder (or bucket)"
            )


def check_remote_coordination(config: Config) -> None:
    """ConfigError for `log.remote` with the default in-memory coordination: every node would hold
    its own pass lock, so two nodes could load the same logs at once. The in-memory backend is
    taken only when chosen (`coordination: {type: inmemory}`): a single node."""
    section = config.coordination
    shared = section is not None and (section.redis is not None or section.etcd is not None)
    if config.log.remote is None or shared or single_node_remote(config):
        return
    raise ConfigError(
        "log.remote: the passes of every node sharing the store need one lock across the nodes;"
        " configure coordination.redis or coordination.etcd (or, for a single node, coordination: {type: inmemory})"
    )


def single_node_remote(config: Config) -> bool:
    """`log.remote` with the in-memory coordination chosen explicitly: one node only."""
    section = config.coordination
    return config.log.remote is not None and section is not None and section.type == "inmemory"


def keys_without_effect(config: Config) -> Iterator[str]:
    """Warnings for known keys that the rest of the config makes useless."""
    for dest_id, dest in config.destinations.items():
        if dest.mode == "batch" and dest.stream.model_fields_set:
            yield f"destinations.{dest_id}.stream: has no effect in batch mode"
        upsert = REGISTRY[dest.type].capabilities.upsert
        if upsert == "none" and dest.data_layout.primary_key_fields:
            yield f"destinations.{dest_id}.data_layout.primary_key_fields: {dest.type} never replaces events"
        yield from recognition_warnings(config, dest_id, dest)


def recognition_warnings(config: Config, dest_id: str, dest: Any) -> Iterator[str]:
    """Users recognition turned on globally for a type that cannot update rows, or whose nodes the
    destination's mapping keeps out of its tables."""
    from eventspark.recognition.service import columns_of

    section = dest.users_recognition if dest.users_recognition is not None else config.users_recognition
    if section is None or not section.enabled:
        return
    if REGISTRY[dest.type].capabilities.users_recognition == "none":
        yield f"users_recognition: has no effect on destinations.{dest_id}: {dest.type} cannot update rows"
        return
    try:
        usable = columns_of(section, dest).usable
    except ValueError:  # a bad mapping: check_steps names it
        return
    if not usable:
        yield (
            f"destinations.{dest_id}.users_recognition: the mapping keeps the anonymous id or every"
            " identification node out of the tables: nothing can be recognised"
        )


def apply_defaults(loaded: LoadedConfig, embedded: bool) -> None:
    """A generated token when none is configured; the embedded DuckDB warehouse without a config."""
    config = loaded.config
    if not config.api_keys and not {"api_keys", "server.auth"} & loaded.sources.keys():
        secret = secrets.token_urlsafe(24)
        token = ApiKey(client_secret=secret, server_secret=secret)
        config.api_keys.append(token)
        loaded.generated_token = token
    if embedded:
        config.log.rotation_min = 1
        config.destinations["duckdb"] = DuckDBDestination(type="duckdb")


def _check_json_columns(where: str, dest: Any) -> None:
    """docs/json-columns.md: a mapping's JSON type is one the warehouse has (`Dialect.json_names`);
    `unmapped_column` is a plain column name; it and `schema_freeze` need an SQL destination."""
    from eventspark.destinations.registry import destination_type
    from eventspark.steps.flatten import sanitize_name
    from eventspark.steps.mapping import JSON_TYPES

    layout = dest.data_layout
    entry = destination_type(dest.type)
    sql = entry.capabilities.delivery == "tables" and entry.capabilities.stage != "objects"
    rules = layout.mappings.fields if layout.mappings is not None and sql else []
    for index, rule in enumerate(rules):
        name = (rule.type or "").strip().lower()
        if name in JSON_TYPES and name not in entry.dialect.json_names:
            known = ", ".join(sorted(entry.dialect.json_names))
            raise ConfigError(f"{where}.mappings.fields[{index}]: {dest.type} has no type {rule.type!r}; use {known}")
    column = layout.unmapped_column
    if column is None and not layout.schema_freeze:
        return
    if not sql:
        raise ConfigError(f"{where}: unmapped_column and schema_freeze apply to SQL destinations, not {dest.type}")
    if column is not None and sanitize_name(column) != column:
        raise ConfigError(
            f"{where}.unmapped_column: {column!r} must be a column name of [a-z0-9_], at most 63 characters"
        )
    if column is not None and column in layout.primary_key_fields:
        raise ConfigError(f"{where}.unmapped_column: {column!r} is a primary key field")


def check_steps(config: Config) -> None:
    """Compiles every template and mapping now so that a bad one is a config error, not a runtime one."""
    from eventspark.steps.chain import transform_of
    from eventspark.steps.mapping import Mapper, MappingError
    from eventspark.steps.template import TemplateSyntaxError, compile_template, is_reserved_table
    from eventspark.steps.transform import TransformSyntaxError

    for dest_id, dest in config.destinations.items():
        layout = dest.data_layout
        where = f"destinations.{dest_id}.data_layout"
        try:
            template = compile_template(layout.table_name_template)
        except TemplateSyntaxError as exc:
            raise ConfigError(f"{where}.table_name_template: {exc}") from None
        if template.constant_name and is_reserved_table(template.constant_name):
            raise ConfigError(f"{where}.table_name_template: {template.constant_name!r} is eventspark's own table")
        if layout.mappings is not None:
            try:
                Mapper.build(layout.mappings.keep_unmapped, layout.mappings.rules())
            except MappingError as exc:
                raise ConfigError(f"{where}.mappings: {exc}") from None
        _check_json_columns(where, dest)
        try:  # a JavaScript transform compiles now (docs/transforms.md); its engine is not kept
            transform = transform_of(dest_id, dest)
            if transform is not None:
                transform.close()
        except TransformSyntaxError as exc:
            raise ConfigError(f"destinations.{dest_id}.transform: {exc}") from None
        for token in unknown_tokens(dest, config.api_keys):
            raise ConfigError(f"destinations.{dest_id}.only_tokens: no api key has id or secret {token!r}")
