"""Benchmark of the full step chain on one core, against orjson parse+serialise of the same events.

    .venv/bin/python bench/steps.py [--events N] [--seed S] [--repeat R] [--stages] [--profile] [--against-pure]

Chain per event: orjson.loads of the incoming line → ContextEnrichment → table_name_template →
LookupEnrichment (GeoLite2 via the maxminddb C extension, user agent via ua-parser-rs) → mapping →
flatten → typing (BatchHeader accumulation). The baseline is orjson.loads + orjson.dumps of the same
lines, measured in the same run, so the ratio is comparable across noisy machines.

Times are CPU time of this process (``time.process_time``), the best of ``--repeat`` runs, and the
runs of everything compared take turns (baseline, chain, baseline, chain, ...): a burst of load
from elsewhere on a shared machine then slows both sides alike rather than one. ``--stages`` adds
the cost of each step: the chain cut after that step less the chain cut before it, and of the
executors' typed buffer after the chain (`chunk`: `batch.chunks.ChunkBuffer`, the stream's
`header` is not on their path). ``--profile``
prints cProfile's busiest functions for one chain run. ``--against-pure`` measures the same again
in a child process with the compiled speed-ups turned off (`EVENTSPARK_PURE_PYTHON=1`) and prints
both side by side with their ratio.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import importlib.util
import os
import pstats
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).parent))

from eventspark.batch.chunks import ChunkBuffer
from eventspark.batch.plan import DEFAULT_CHUNK_ROWS
from eventspark.destinations.duckdb.configuration import DuckDBDestination
from eventspark.steps.chain import DestinationChain, HeaderBuilder, Row
from eventspark.steps.context import enrich_context
from eventspark.steps.flatten import flatten
from eventspark.steps.lookup import GeoResolver, UserAgentParser
from generate import count_leaves, generate_events

TEMPLATE = '{{.event_type}}_{{._timestamp.Format "2006_01"}}'
STAGES = ("orjson.loads", "context", "template", "lookup", "mapping", "flatten", "header", "chunk")


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
    now = datetime.now(UTC)  # one for all: the collector formats one `now` per request
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


def run_stages(lines: list[bytes], chain: DestinationChain, stages: int) -> HeaderBuilder:
    """`run_chain` with `DestinationChain.process` spelled out, cut after the first `stages` steps;
    the last stage is the executors' (`add_to_chunk`) rather than the chain's."""
    headers = HeaderBuilder()
    buffers: dict[str, ChunkBuffer] = {}
    now = datetime.now(UTC)
    for line in lines:
        event = orjson.loads(line)
        if stages < 2:
            continue
        enrich_context(event, token="bench-token", source_ip="203.0.113.9", user_agent=None, server_side=False, now=now)
        if stages < 3:
            continue
        table = chain.template.render(event)
        if stages < 4 or not table:
            continue
        chain.lookup.apply(event)
        if stages < 5:
            continue
        mapped, casts = chain.mapper.apply(event, in_place=True)
        if stages < 6:
            continue
        values = flatten(mapped)
        if stages < 7:
            continue
        headers.add(Row(table, values, casts))
        if stages < 8:
            continue
        add_to_chunk(buffers, table, values, casts)
    for buffer in buffers.values():
        buffer.take()
    return headers


def add_to_chunk(buffers: dict[str, ChunkBuffer], table: str, values: dict, casts: Mapping[str, str]) -> None:
    """What a Spark executor does with a row after the chain: checks it into its table's buffer,
    which hands over a chunk of `DEFAULT_CHUNK_ROWS` rows (the stage's own encoding not included)."""
    buffer = buffers.get(table)
    if buffer is None:
        buffer = buffers[table] = ChunkBuffer(table, None)
    buffer.add(values, casts)
    if len(buffer) >= DEFAULT_CHUNK_ROWS:
        buffer.take()


def run_baseline(lines: list[bytes]) -> int:
    size = 0
    for line in lines:
        size += len(orjson.dumps(orjson.loads(line)))
    return size


def best_times(runs: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Best CPU seconds of each run over `repeat` rounds; each round runs every one in turn."""
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeat):
        for name, run in runs.items():
            gc.collect()
            start = time.process_time()
            run()
            best[name] = min(best[name], time.process_time() - start)
    return best


def stage_times(lines: list[bytes], chain: DestinationChain, repeat: int) -> dict[str, float]:
    """CPU seconds of each step over all `lines`: the chain cut after it less the chain cut before.

    Each step works on an event that the steps before it have just touched, as in the chain.
    """
    cut = {name: lambda count=count: run_stages(lines, chain, count) for count, name in enumerate(STAGES, 1)}
    totals = best_times(cut, repeat)
    previous = 0.0
    times: dict[str, float] = {}
    for name, total in totals.items():
        times[name] = total - previous
        previous = total
    return times


def print_stages(times: dict[str, float], n: int) -> None:
    total = sum(times.values())
    print("per stage, CPU µs/event (the chain cut after the stage less the chain cut before it):")
    for name, seconds in times.items():
        print(f"  {name:<13} {seconds / n * 1e6:6.2f}  {seconds / total:4.0%}")
    print(f"  {'all':<13} {total / n * 1e6:6.2f}")


def print_profile(lines: list[bytes], chain: DestinationChain) -> None:
    profiler = cProfile.Profile()
    profiler.runcall(run_chain, lines, chain)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--stages", action="store_true", help="also time each step of the chain")
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of one chain run")
    parser.add_argument(
        "--against-pure", action="store_true", help="also measure with the speed-ups off (a child process)"
    )
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the child's output
    args = parser.parse_args()
    if args.against_pure:
        compare_pure(args)
        return

    events = list(generate_events(args.events, seed=args.seed))
    lines = [orjson.dumps(e) for e in events]
    leaves = sum(count_leaves(e) for e in events) / len(events)
    chain = build_chain()
    headers = run_chain(lines, chain)  # warm-up: fills the UA and GeoIP caches as a running service has them

    times = best_times({"baseline": lambda: run_baseline(lines), "chain": lambda: run_chain(lines, chain)}, args.repeat)
    baseline, chain_time = times["baseline"], times["chain"]
    n = len(lines)
    if args.json:
        stages = stage_times(lines, chain, args.repeat) if args.stages else {}
        print(orjson.dumps({"n": n, "baseline": baseline, "chain": chain_time, "stages": stages}).decode())
        return
    print(f"events: {n:,} (avg {leaves:.1f} leaves, {sum(map(len, lines)) / n:.0f} bytes), one core")
    print(
        f"tables: {len(headers.headers)}, columns in the widest: {max(len(h.fields) for h in headers.headers.values())}"
    )
    print(f"baseline orjson loads+dumps: {n / baseline:>10,.0f} events/s {baseline / n * 1e6:7.2f} µs/event")
    print(f"full step chain:             {n / chain_time:>10,.0f} events/s {chain_time / n * 1e6:7.2f} µs/event")
    print(f"ratio chain/baseline:        {baseline / chain_time:>10.3f}")
    if args.stages:
        print_stages(stage_times(lines, chain, args.repeat), n)
    if args.profile:
        print_profile(lines, chain)


def measure(args: argparse.Namespace, pure: bool) -> dict:
    """This bench in a child process (`--json`), with the speed-ups on or off."""
    command = [sys.executable, __file__, "--json", "--events", str(args.events), "--seed", str(args.seed)]
    command += ["--repeat", str(args.repeat)] + (["--stages"] if args.stages else [])
    env = {**os.environ, "EVENTSPARK_PURE_PYTHON": "1" if pure else "0"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return orjson.loads(done.stdout.splitlines()[-1])


def compare_pure(args: argparse.Namespace) -> None:
    """The chain (and with `--stages` each step) with the compiled speed-ups and without them."""
    fast, pure = measure(args, pure=False), measure(args, pure=True)
    n = fast["n"]
    print(f"events: {n:,}, one core, CPU µs/event: compiled speed-ups / pure Python (EVENTSPARK_PURE_PYTHON=1)")
    rows = [("baseline", fast["baseline"], pure["baseline"]), ("chain", fast["chain"], pure["chain"])]
    rows += [(name, fast["stages"][name], pure["stages"][name]) for name in fast["stages"]]
    for name, compiled, python in rows:
        ratio = f"×{python / compiled:.2f}" if compiled > 0 else "-"
        print(f"  {name:<13} {compiled / n * 1e6:6.2f} {python / n * 1e6:6.2f}  {ratio}")


if __name__ == "__main__":
    main()
