import importlib.util
import json
import logging
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import maxminddb
import pytest

from eventspark.steps import lookup
from eventspark.steps.lookup import GeoResolver, LookupEnricher, UserAgentParser
from tests.shared_data import eventnative_data

VECTORS = eventnative_data()
MAC_CHROME = (
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_5) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/83.0.4103.116 Safari/537.36"
)
GOOGLEBOT = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
ANDROID = (
    "Mozilla/5.0 (Linux; Android 10; SM-G973F) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/83.0.4103.106 Mobile Safari/537.36"
)
YEKATERINBURG = {
    "country": "RU",
    "city": "Yekaterinburg",
    "region": "RU-SVE",
    "zip": "620007",
    "latitude": 56.8519,
    "longitude": 60.6122,
}


def geolite_path() -> str:
    """GeoLite2-City (2018-07) shipped by the dev dependency maxminddb-geolite2."""
    spec = importlib.util.find_spec("_maxminddb_geolite2")
    assert spec is not None and spec.submodule_search_locations, "install the dev extra"
    return str(Path(spec.submodule_search_locations[0]) / "GeoLite2-City.mmdb")


@pytest.fixture(scope="module")
def geo() -> Iterator[GeoResolver]:
    resolver = GeoResolver.open(geolite_path())
    assert resolver is not None
    yield resolver
    resolver.close()


@pytest.fixture(scope="module")
def ua() -> UserAgentParser:
    return UserAgentParser()


# --- GeoResolver ---------------------------------------------------------------------------------


def test_geo_uses_c_extension(geo: GeoResolver) -> None:
    assert maxminddb.extension is not None and hasattr(maxminddb.extension, "Reader")
    assert geo.uses_c_extension


def test_geo_falls_back_without_c_extension(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    real_open = maxminddb.open_database

    def no_extension(path: str, mode: int = maxminddb.MODE_AUTO) -> Any:
        if mode in (maxminddb.MODE_MMAP_EXT, maxminddb.MODE_AUTO):
            if mode == maxminddb.MODE_MMAP_EXT:
                raise ValueError("MODE_MMAP_EXT requires the maxminddb.extension module to be available")
            mode = maxminddb.MODE_MMAP
        return real_open(path, mode)

    monkeypatch.setattr(maxminddb, "open_database", no_extension)
    with caplog.at_level(logging.WARNING, logger=lookup.__name__):
        resolver = GeoResolver.open(geolite_path())
    assert resolver is not None
    assert not resolver.uses_c_extension
    assert "C extension" in caplog.text
    assert resolver.lookup("95.82.232.185") == YEKATERINBURG
    resolver.close()


@pytest.mark.parametrize(
    ("ip", "expected"),
    [
        ("8.8.8.8", {"country": "US", "latitude": 37.751, "longitude": -97.822}),
        ("95.82.232.185", YEKATERINBURG),
        (
            "81.2.69.142",
            {
                "country": "GB",
                "city": "Willesden",
                "region": "ENG",
                "zip": "NW10",
                "latitude": 51.5333,
                "longitude": -0.2333,
            },
        ),
        (
            "2001:4860:4860::8888",
            {
                "country": "US",
                "city": "Mountain View",
                "region": "CA",
                "zip": "94043",
                "latitude": 37.419200000000004,
                "longitude": -122.0574,
            },
        ),
        ("10.0.0.1, 95.82.232.185", YEKATERINBURG),
    ],
)
def test_geo_known_addresses(geo: GeoResolver, ip: str, expected: dict[str, Any]) -> None:
    assert geo.lookup(ip) == expected


@pytest.mark.parametrize(
    "ip",
    [
        "10.0.0.1",
        "192.168.1.1",
        "127.0.0.1",
        "::1",
        "",
        "abc",
        "999.1.1.1",
        "8.8.8.8 x",
        "8.8.8.8\x00",
        "localhost",
        "1" * 10_000,
        "10.0.0.1, nonsense",
    ],
)
def test_geo_unknown_or_garbage_is_none(geo: GeoResolver, ip: str) -> None:
    assert geo.lookup(ip) is None


def test_geo_results_are_fresh_copies(geo: GeoResolver) -> None:
    first = geo.lookup("95.82.232.185")
    assert first is not None
    first["country"] = "XX"
    assert geo.lookup("95.82.232.185") == YEKATERINBURG


class CountingReader:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def get(self, ip: str) -> Any:
        self.calls.append(ip)
        return {"country": {"iso_code": "ZZ"}}

    def close(self) -> None:
        pass


def test_geo_cache_is_bounded() -> None:
    reader = CountingReader()
    resolver = GeoResolver(reader, "unused.mmdb", cache_size=2)
    for ip in ["1.0.0.1", "1.0.0.1", "1.0.0.2", "1.0.0.1"]:
        assert resolver.lookup(ip) == {"country": "ZZ"}
    assert reader.calls == ["1.0.0.1", "1.0.0.2"]  # hits never reach the reader
    resolver.lookup("1.0.0.3")  # full: evicts the oldest, 1.0.0.1
    resolver.lookup("1.0.0.2")
    resolver.lookup("1.0.0.1")
    assert reader.calls == ["1.0.0.1", "1.0.0.2", "1.0.0.3", "1.0.0.1"]


class FixedReader:
    def __init__(self, record: Any) -> None:
        self.record = record

    def get(self, ip: str) -> Any:
        return self.record

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (None, None),
        ({}, None),
        ([], None),
        ("text", None),
        ({"country": "US"}, None),  # not shaped like a City record
        ({"subdivisions": [None]}, None),
        ({"country": {"iso_code": "DE"}, "subdivisions": [], "city": {"names": {}}}, {"country": "DE"}),
        ({"country": {"iso_code": ""}, "location": {"latitude": 0.5}}, {"latitude": 0.5}),
    ],
)
def test_geo_odd_records(record: Any, expected: dict[str, Any] | None) -> None:
    assert GeoResolver(FixedReader(record), "unused.mmdb").lookup("1.0.0.1") == expected


def test_geo_open_without_path_or_database(tmp_path: Path, caplog: Any) -> None:
    assert GeoResolver.open(None) is None
    with caplog.at_level(logging.WARNING, logger=lookup.__name__):
        assert GeoResolver.open(str(tmp_path / "missing.mmdb")) is None
        assert GeoResolver.open(str(tmp_path)) is None  # a directory without a database
    assert "not found" in caplog.text
    corrupt = tmp_path / "corrupt.mmdb"
    corrupt.write_bytes(b"not a maxmind database" * 100)
    assert GeoResolver.open(str(corrupt)) is None


def test_geo_open_finds_database_in_directory(tmp_path: Path) -> None:
    (tmp_path / "GeoLite2-City.mmdb").symlink_to(geolite_path())
    resolver = GeoResolver.open(str(tmp_path))
    assert resolver is not None
    assert resolver.lookup("95.82.232.185") == YEKATERINBURG
    resolver.close()


def test_geo_pickles_by_path(geo: GeoResolver) -> None:
    copy = pickle.loads(pickle.dumps(geo))
    assert copy.uses_c_extension
    assert copy.lookup("8.8.8.8") == geo.lookup("8.8.8.8")
    copy.close()


# --- UserAgentParser -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("agent", "expected"),
    [
        (
            MAC_CHROME,
            {
                "ua_family": "Chrome",
                "ua_version": "83.0.4103",
                "os_family": "Mac OS X",
                "os_version": "10.15.5",
                # issue 17: EventNative 1.41 reports the device of desktop Macs
                "device_family": "Mac",
                "device_brand": "Apple",
                "device_model": "Mac",
            },
        ),
        (
            GOOGLEBOT,
            {
                "ua_family": "Googlebot",
                "ua_version": "2.1",
                "device_family": "Spider",
                "device_brand": "Spider",
                "device_model": "Desktop",
                "bot": True,
            },
        ),
        (
            "Mozilla/5.0 (Windows NT 6.1) SomeCrawler/1.0",
            {
                "ua_family": "SomeCrawler",
                "ua_version": "1.0",
                "os_family": "Windows",
                "os_version": "7",
                "device_family": "Spider",
                "device_brand": "Spider",
                "device_model": "Desktop",
                "bot": True,
            },
        ),
        (
            ANDROID,
            {
                "ua_family": "Chrome Mobile",
                "ua_version": "83.0.4103",
                "os_family": "Android",
                "os_version": "10",
                "device_family": "Samsung SM-G973F",
                "device_brand": "Samsung",
                "device_model": "SM-G973F",
            },
        ),
        # no browser match: only the OS is reported
        ("Mozilla/5.0 (Windows NT 10.0; Win64; x64)", {"os_family": "Windows", "os_version": "10"}),
        # uap-core names PetalBot's OS "Other": omitted
        (
            "Mozilla/5.0 (Linux; Android 7.0;) AppleWebKit/537.36 (KHTML, like Gecko) Mobile Safari/537.36 "
            "(compatible; PetalBot;+https://webmaster.petalsearch.com/site/petalbot)",
            {
                "ua_family": "PetalBot",
                "device_family": "Spider",
                "device_brand": "Spider",
                "device_model": "Smartphone",
                "bot": True,
            },
        ),
        ("some wrong format ua 123", {}),
        ("", {}),
    ],
)
def test_user_agent_parse(ua: UserAgentParser, agent: str, expected: dict[str, Any]) -> None:
    assert ua.parse(agent) == expected


def test_user_agent_is_cut_before_parsing(ua: UserAgentParser) -> None:
    assert ua.parse("x" * 100 + " Googlebot/2.1")["bot"] is True
    assert ua.parse("x" * 1100 + " Googlebot/2.1") == {}


def test_user_agent_cache_is_bounded_and_returns_copies() -> None:
    parser = UserAgentParser(cache_size=2)
    first = parser.parse(GOOGLEBOT)
    calls: list[str] = []
    real = parser._resolver
    assert real is not None
    parser._resolver = lambda agent: calls.append(agent) or real(agent)
    first["bot"] = False
    assert parser.parse(GOOGLEBOT)["bot"] is True  # cached, and the caller's edit did not leak
    parser.parse(MAC_CHROME)
    parser.parse(ANDROID)  # full: evicts GOOGLEBOT
    parser.parse(GOOGLEBOT)
    assert calls == [MAC_CHROME, ANDROID, GOOGLEBOT]


# --- LookupEnricher ------------------------------------------------------------------------------


def test_eventnative_user_agent_vector(ua: UserAgentParser) -> None:
    event = json.loads((VECTORS / "event_ua_input.json").read_text())
    expected = json.loads((VECTORS / "fact_ua_output.json").read_text())
    enriched = LookupEnricher([], geo=None, ua=ua).apply(event)
    enriched["_timestamp"] = expected["_timestamp"]  # the vector's clock is fixed, not the step's
    # The vector is EventNative 1.3x's; 1.41 (issue 17) adds the device of desktop Macs.
    expected["eventn_ctx"]["parsed_ua"].update(device_family="Mac", device_brand="Apple", device_model="Mac")
    assert enriched == expected


def test_unknown_rule_name_is_refused() -> None:
    with pytest.raises(ValueError, match="geo_lookup"):
        LookupEnricher([("geo_lookup", "/ip", "/geo")], geo=None, ua=None)


def test_implicit_rules_nested_event(geo: GeoResolver, ua: UserAgentParser) -> None:
    event = {"source_ip": "95.82.232.185", "eventn_ctx": {"user_agent": GOOGLEBOT}}
    LookupEnricher([], geo, ua).apply(event)
    assert event["eventn_ctx"]["location"] == YEKATERINBURG
    assert event["eventn_ctx"]["parsed_ua"] == ua.parse(GOOGLEBOT)
    assert "location" not in event and "parsed_ua" not in event


def test_implicit_rules_flat_event(geo: GeoResolver, ua: UserAgentParser) -> None:
    event = {"src": "jitsu", "source_ip": "8.8.8.8", "user_agent": MAC_CHROME}
    LookupEnricher([], geo, ua).apply(event)
    assert event["location"] == {"country": "US", "latitude": 37.751, "longitude": -97.822}
    assert event["parsed_ua"]["ua_family"] == "Chrome"


def test_implicit_rules_keep_values_sent_by_the_client(geo: GeoResolver, ua: UserAgentParser) -> None:
    mobile = json.loads((VECTORS / "mobile_fact_output.json").read_text())
    before = json.loads(json.dumps(mobile))
    LookupEnricher([], geo, ua).apply(mobile)
    assert mobile == before


def test_implicit_rules_skip_server_events(geo: GeoResolver, ua: UserAgentParser) -> None:
    event = {"src": "api", "source_ip": "8.8.8.8", "user_agent": MAC_CHROME}
    LookupEnricher([], geo, ua).apply(event)
    assert event == {"src": "api", "source_ip": "8.8.8.8", "user_agent": MAC_CHROME}


def test_configured_rules_run_after_implicit_and_overwrite(geo: GeoResolver, ua: UserAgentParser) -> None:
    rules = [("ip_lookup", "/ip", "/geo/where"), ("user_agent_parse", "/eventn_ctx/user_agent", "/location")]
    event = {
        "ip": "95.82.232.185",
        "source_ip": "8.8.8.8",
        "eventn_ctx": {"user_agent": ANDROID},
        "location": "old",
    }
    LookupEnricher(rules, geo, ua).apply(event)
    assert event["geo"] == {"where": YEKATERINBURG}
    assert event["location"] == ua.parse(ANDROID)
    assert event["eventn_ctx"]["location"]["country"] == "US"


@pytest.mark.parametrize("value", [None, 42, {"ip": "8.8.8.8"}, ["8.8.8.8"]])
def test_non_string_source_leaves_target_untouched(geo: GeoResolver, ua: UserAgentParser, value: Any) -> None:
    rules = [("ip_lookup", "/ip", "/geo"), ("user_agent_parse", "/ua", "/agent")]
    event: dict[str, Any] = {"src": "api", "geo": "keep", "agent": "keep"}
    if value is not None:
        event["ip"] = event["ua"] = value
    LookupEnricher(rules, geo, ua).apply(event)
    assert (event["geo"], event["agent"]) == ("keep", "keep")


def test_unresolvable_values_write_null(geo: GeoResolver, ua: UserAgentParser) -> None:
    event = {"source_ip": "10.1.2.3", "eventn_ctx": {"user_agent": "some wrong format ua 123"}}
    LookupEnricher([], geo, ua).apply(event)
    assert event["eventn_ctx"]["location"] is None
    assert event["eventn_ctx"]["parsed_ua"] is None


def test_without_resolvers_results_are_null() -> None:
    rules = [("ip_lookup", "/ip", "/geo"), ("user_agent_parse", "/ua", "/agent")]
    event: dict[str, Any] = {"src": "api", "ua": MAC_CHROME}
    LookupEnricher(rules, geo=None, ua=None).apply(event)
    assert event == {"src": "api", "ua": MAC_CHROME, "geo": None, "agent": None}


def test_enricher_pickles(geo: GeoResolver, ua: UserAgentParser) -> None:
    enricher = LookupEnricher([("ip_lookup", "/ip", "/geo")], geo, ua)
    copy = pickle.loads(pickle.dumps(enricher))
    event = {"ip": "95.82.232.185", "source_ip": "8.8.8.8", "user_agent": GOOGLEBOT}
    assert copy.apply(dict(event)) == enricher.apply(dict(event))
