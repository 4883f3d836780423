"""LookupEnrichment: geo data from IP addresses and parsed user agents, by enrichment rules.

A rule ``(name, from, to)`` reads the string at path ``from`` and writes its result at path
``to``: ``ip_lookup`` writes ``{country, city, region, zip, latitude, longitude}`` and
``user_agent_parse`` writes ``{ua_family, ua_version, os_family, os_version, device_family,
device_brand, device_model, bot}``, empty members omitted in both.

Implicit rules run first for every event whose ``src`` is not ``"api"``: the JS events, and
server events that carry their own ``src`` (ContextEnrichment keeps it, as EventNative 1.41 did,
so the top-level ``user_agent`` of such a server event is parsed into ``parsed_ua``):

* nested events (``eventn_ctx`` is an object): ``/source_ip`` → ``/eventn_ctx/location`` and
  ``/eventn_ctx/user_agent`` → ``/eventn_ctx/parsed_ua``, as in the design document;
* flat events (JS SDK 2.x, mobile SDKs): ``/source_ip`` → ``/location`` and ``/user_agent`` →
  ``/parsed_ua``, as EventNative 2.x did.

An implicit rule never replaces a non-null value already at its target: mobile SDKs send
their own ``location`` and ``parsed_ua``, which are better than what the collector can infer.
Configured rules run after the implicit ones and always write their target.

Results: with no resolver (no GeoIP database, no UA parser) the target is set to null, as
EventNative did, whatever the source holds. With a resolver, a source that is missing or not a
string leaves the target untouched, and an address or agent that yields nothing writes null.

Resolvers cache results in bounded dicts (FIFO eviction) and hand out a fresh copy per call,
so later steps may mutate results freely. Both pickle by configuration (the database path,
the cache size) and reopen on unpickling, so a built enricher can be shipped to Spark executors.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

import maxminddb

from eventspark.steps.paths import MISSING, Path, get_path, parse_path, set_path

__all__ = ["IP_LOOKUP", "USER_AGENT_PARSE", "GeoResolver", "LookupEnricher", "UserAgentParser"]

logger = logging.getLogger(__name__)

IP_LOOKUP: Final = "ip_lookup"
USER_AGENT_PARSE: Final = "user_agent_parse"

DEFAULT_CACHE_SIZE: Final = 10_000
MAX_USER_AGENT_LENGTH: Final = 1024
"""Longer user agents are cut before parsing: bounds regex time and cache memory."""
_MAX_IP_TEXT: Final = 512
"""Longer "addresses" are garbage (or an attack on the cache) and resolve to None uncached."""

# As EventNative 1.41 (uap-go): the device family "Other" is omitted, its brand and model are
# kept when the regexes name them. Desktop Macs are device "Mac"/Apple/Mac (uap-core since 2021,
# which EventNative 1.41 reports; the 1.3x vector `fact_ua_output.json` predates it).
_NO_DEVICE_FAMILY: Final = "Other"
_UNTOUCHED: Final = object()
_EMPTY: Final[dict[str, Any]] = {}


class _Reader(Protocol):
    def get(self, ip_address: str) -> Any: ...

    def close(self) -> None: ...


def _remember(cache: dict[str, Any], key: str, value: Any, limit: int) -> None:
    """Store ``value``, evicting the oldest entry when the cache is full."""
    if len(cache) >= limit:
        # pop with a default: a concurrent thread may have evicted the same key already.
        cache.pop(next(iter(cache), key), None)
    cache[key] = value


def _find_mmdb(path: str) -> str | None:
    """``path`` itself when it is a file; for a directory its first ``*.mmdb`` (as EventNative)."""
    if os.path.isfile(path):
        return path
    if os.path.isdir(path):
        names = sorted(name for name in os.listdir(path) if name.endswith(".mmdb"))
        return os.path.join(path, names[0]) if names else None
    return None


def _open_reader(path: str) -> _Reader:
    """A reader on the C extension (mmap); the pure-Python reader, with a warning, without it."""
    try:
        return maxminddb.open_database(path, maxminddb.MODE_MMAP_EXT)
    except ValueError as exc:
        if "extension" not in str(exc):
            raise
        logger.warning("maxminddb C extension unavailable, geo lookups will be slow: %s", exc)
        return maxminddb.open_database(path, maxminddb.MODE_AUTO)


def _location(record: Any) -> dict[str, Any] | None:
    """The EventNative geo object of a GeoIP2/GeoLite2 City record; None when it is empty."""
    try:
        return _city_fields(record) or None
    except (AttributeError, TypeError, IndexError):  # not shaped like a City record
        return None


def _city_fields(record: dict[str, Any]) -> dict[str, Any]:
    # Written out by hand: this runs for every uncached address.
    result: dict[str, Any] = {}
    country = (record.get("country") or _EMPTY).get("iso_code")
    if country:
        result["country"] = country
    city = ((record.get("city") or _EMPTY).get("names") or _EMPTY).get("en")
    if city:
        result["city"] = city
    subdivisions = record.get("subdivisions")
    region = subdivisions[0].get("iso_code") if subdivisions else None
    if region:
        # EventNative wrote Russian regions in ISO 3166-2 form ("RU-SVE"), others bare ("CA").
        result["region"] = f"RU-{region}" if country == "RU" else region
    postal = (record.get("postal") or _EMPTY).get("code")
    if postal:
        result["zip"] = postal
    location = record.get("location") or _EMPTY
    latitude, longitude = location.get("latitude"), location.get("longitude")
    if latitude is not None:
        result["latitude"] = latitude
    if longitude is not None:
        result["longitude"] = longitude
    return result


class GeoResolver:
    """IP → geo data from a MaxMind DB (GeoIP2/GeoLite2 City), with a bounded result cache."""

    def __init__(self, reader: _Reader, path: str, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        self._reader = reader
        self._path = path
        self._cache_size = max(1, cache_size)
        self._cache: dict[str, dict[str, Any] | None] = {}

    @classmethod
    def open(cls, path: str | None, cache_size: int = DEFAULT_CACHE_SIZE) -> GeoResolver | None:
        """Open the database at ``path`` (a file, or a directory holding one ``*.mmdb``).

        None when ``path`` is None, or (with a warning) when no database is found there or it
        cannot be read. This is the only I/O of the step; call it when building the pipeline.
        """
        if path is None:
            return None
        found = _find_mmdb(path)
        if found is None:
            logger.warning("GeoIP database not found at %s: geo lookups disabled", path)
            return None
        try:
            reader = _open_reader(found)
        except (OSError, maxminddb.InvalidDatabaseError) as exc:
            logger.warning("GeoIP database %s unreadable, geo lookups disabled: %s", found, exc)
            return None
        return cls(reader, found, cache_size)

    @property
    def uses_c_extension(self) -> bool:
        """True when lookups run in maxminddb's C extension (nearly ten times faster than pure Python)."""
        return type(self._reader).__module__ == "maxminddb.extension"

    def lookup(self, ip: str) -> dict[str, Any] | None:
        """Geo data for ``ip`` (or the first resolvable entry of a comma list); None if unknown."""
        cached = self._cache.get(ip, MISSING)
        if cached is MISSING:
            if len(ip) > _MAX_IP_TEXT:
                return None
            cached = self._resolve(ip)
            _remember(self._cache, ip, cached, self._cache_size)
        return None if cached is None else cached.copy()

    def _resolve(self, ip: str) -> dict[str, Any] | None:
        if "," not in ip:
            return self._resolve_one(ip)
        for part in ip.split(","):
            found = self._resolve_one(part.strip())
            if found is not None:
                return found
        return None

    def _resolve_one(self, ip: str) -> dict[str, Any] | None:
        try:
            record = self._reader.get(ip)
        except (ValueError, TypeError):  # not an address, or an embedded NUL
            return None
        return _location(record)

    def close(self) -> None:
        """Release the database (its memory map)."""
        self._reader.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self._path, "cache_size": self._cache_size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(_open_reader(state["path"]), state["path"], state["cache_size"])


def _version(*parts: str | None) -> str | None:
    """``"83.0.4103"`` from the leading non-empty parts; None when there is no major."""
    present: list[str] = []
    for part in parts:
        if not part:
            break
        present.append(part)
    return ".".join(present) or None


def _parsed_agent(ua: Any, os_: Any, device: Any) -> dict[str, Any]:
    """The EventNative result of one ua-parser parse (components may be None)."""
    found: dict[str, Any] = {}
    if ua is not None:
        found["ua_family"] = ua.family if ua.family != "Other" else None
        found["ua_version"] = _version(ua.major, ua.minor, ua.patch)
    if os_ is not None:
        found["os_family"] = os_.family if os_.family != "Other" else None
        found["os_version"] = _version(os_.major, os_.minor, os_.patch, os_.patch_minor)
    if device is not None:
        found["device_family"] = device.family if device.family != _NO_DEVICE_FAMILY else None
        found.update(device_brand=device.brand, device_model=device.model)
    result = {key: value for key, value in found.items() if value}
    family = result.get("ua_family", "").lower()
    if "bot" in family or "crawler" in family:
        result["bot"] = True
    return result


def _build_ua_resolver() -> Callable[[str], Any]:
    """ua-parser's resolver on ua-parser-rs regexes; its pure-Python one (warned) without them."""
    import ua_parser

    try:
        from ua_parser.regex import Resolver
    except ImportError as exc:
        logger.warning("ua-parser-rs unavailable, user agent parsing will be slow: %s", exc)
        resolver = ua_parser.BasicResolver(ua_parser.load_builtins())
    else:
        resolver = Resolver(ua_parser.load_lazy_builtins())
    every_domain = ua_parser.Domain.ALL
    return lambda ua: resolver(ua, every_domain)


class UserAgentParser:
    """User agent → EventNative ``parsed_ua`` object, with a bounded result cache.

    The regexes load on the first parse (about 0.2 s), not in the constructor.
    """

    def __init__(self, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        self._cache_size = max(1, cache_size)
        self._cache: dict[str, dict[str, Any]] = {}
        self._resolver: Callable[[str], Any] | None = None

    def parse(self, ua: str) -> dict[str, Any]:
        """The parsed agent (``{}`` when nothing is recognised); a fresh dict on every call."""
        cached = self._cache.get(ua)
        if cached is None:
            if len(ua) > MAX_USER_AGENT_LENGTH:
                return self.parse(ua[:MAX_USER_AGENT_LENGTH])
            cached = self._parse_uncached(ua)
            _remember(self._cache, ua, cached, self._cache_size)
        return cached.copy()

    def _parse_uncached(self, ua: str) -> dict[str, Any]:
        if self._resolver is None:
            self._resolver = _build_ua_resolver()
        parsed = self._resolver(ua)
        return _parsed_agent(parsed.user_agent, parsed.os, parsed.device)

    def __getstate__(self) -> dict[str, Any]:
        return {"cache_size": self._cache_size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["cache_size"])


_Resolve = Callable[[Any], Any]


class LookupEnricher:
    """Applies the implicit JS rules and the configured enrichment rules (module docstring)."""

    def __init__(
        self,
        rules: Sequence[tuple[str, str, str]],
        geo: GeoResolver | None,
        ua: UserAgentParser | None,
    ) -> None:
        """``rules`` are ``(name, from, to)`` with name ``ip_lookup`` or ``user_agent_parse``."""
        self._geo = geo
        self._ua = ua
        self._rules: list[tuple[_Resolve, Path, Path]] = [self._compile(rule) for rule in rules]

    def _compile(self, rule: tuple[str, str, str]) -> tuple[_Resolve, Path, Path]:
        name, source, target = rule
        if name == IP_LOOKUP:
            return self._locate, parse_path(source), parse_path(target)
        if name == USER_AGENT_PARSE:
            return self._parse_agent, parse_path(source), parse_path(target)
        raise ValueError(f"unknown enrichment rule {name!r}: expected {IP_LOOKUP!r} or {USER_AGENT_PARSE!r}")

    def apply(self, event: dict[str, Any]) -> dict[str, Any]:
        """Enrich ``event`` in place and return it."""
        if event.get("src") != "api":
            self._apply_implicit(event)
        for resolve, source, target in self._rules:
            result = resolve(get_path(event, source))
            if result is not _UNTOUCHED:
                set_path(event, target, result)
        return event

    def _apply_implicit(self, event: dict[str, Any]) -> None:
        ctx = event.get("eventn_ctx")
        holder = ctx if isinstance(ctx, dict) else event
        if holder.get("location") is None:
            result = self._locate(event.get("source_ip"))
            if result is not _UNTOUCHED:
                holder["location"] = result
        if holder.get("parsed_ua") is None:
            result = self._parse_agent(holder.get("user_agent"))
            if result is not _UNTOUCHED:
                holder["parsed_ua"] = result

    def _locate(self, ip: Any) -> Any:
        if self._geo is None:
            return None
        return self._geo.lookup(ip) if ip.__class__ is str else _UNTOUCHED

    def _parse_agent(self, ua: Any) -> Any:
        if self._ua is None:
            return None
        return (self._ua.parse(ua) or None) if ua.__class__ is str else _UNTOUCHED
