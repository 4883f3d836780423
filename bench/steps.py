"""Benchmark of the full step chain on one core, against orjson parse+serialise of the same events.

    .venv/bin/python bench/steps.py [--events N] [--seed S]

Chain per event: orjson.loads of the incoming line → ContextEnrichment → table_name_template →
LookupEnrichment (GeoLite2 via the maxminddb C extension, user agent via ua-parser-rs) → mapping →
flatten → typing (BatchHeader accumulation). The baseline is orjson.loads + orjson.dumps of the same
lines, measured in the same run, so the ratio is comparable across noisy machines.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).parent))

from eventspark.config.models import DuckDBDestination
from eventspark.steps.chain import DestinationChain, HeaderBuilder, Row
from eventspark.steps.context import enrich_context
from eventspark.steps.lookup import GeoResolver, UserAgentParser
from generate import count_leaves, generate_events

TEMPLATE = '{{.event_type}}_{{._timestamp.Format "2006_01"}}'


def geolite_path() -> str | None:
    spec = importlib.util.find_spec("_maxminddb_geolite2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(Path(spec.submodule_search_locations[0]) / "GeoLite2-City.mmdb")


def build_chain() -> DestinationChain:
    destination = DuckDBDestination.model_validate(
        {
            "type": "duckdb",
            "data_layout": {
                "table_name_template": TEMPLATE,
                "mappings": {
                    "keep_unmapped": True,
                    "fields": [
                        {"src": "/event_data/consent", "action": "remove"},
                        {"src": "/event_data/product/price", "action": "cast", "type": "double"},
                        {"src": "/eventn_ctx/user/anonymous_id", "dst": "/anonymous_id", "action": "move"},
                    ],
                },
            },
        }
    )
    geo = GeoResolver.open(geolite_path())
    if geo is None:
        sys.exit("GeoLite2 database not found: install the dev dependencies (make install-dev)")
    return DestinationChain.build("bench", destination, geo, UserAgentParser())


def run_chain(lines: list[bytes], chain: DestinationChain) -> HeaderBuilder:
    headers = HeaderBuilder()
    now = datetime.now(UTC)
    for line in lines:
        event = enrich_context(
            orjson.loads(line),
            token="bench-token",
            source_ip="203.0.113.9",
            user_agent=None,
            server_side=False,
            now=now,
        )
        result = chain.process(event)
        if isinstance(result, Row):
            headers.add(result)
    return headers


def run_baseline(lines: list[bytes]) -> int:
    size = 0
    for line in lines:
        size += len(orjson.dumps(orjson.loads(line)))
    return size


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Best of `repeat` runs, in seconds: the least disturbed by other load on a shared machine."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    events = list(generate_events(args.events, seed=args.seed))
    lines = [orjson.dumps(e) for e in events]
    leaves = sum(count_leaves(e) for e in events) / len(events)
    chain = build_chain()
    headers = run_chain(lines, chain)  # warm-up: fills the UA and GeoIP caches as a running service has them

    baseline = timed(lambda: run_baseline(lines), args.repeat)
    chain_time = timed(lambda: run_chain(lines, chain), args.repeat)
    n = len(lines)
    print(f"events: {n:,} (avg {leaves:.1f} leaves, {sum(map(len, lines)) / n:.0f} bytes), one core")
    print(
        f"tables: {len(headers.headers)}, columns in the widest: {max(len(h.fields) for h in headers.headers.values())}"
    )
    print(f"baseline orjson loads+dumps: {n / baseline:>10,.0f} events/s")
    print(f"full step chain:             {n / chain_time:>10,.0f} events/s")
    print(f"ratio chain/baseline:        {baseline / chain_time:>10.3f}")


if __name__ == "__main__":
    main()
