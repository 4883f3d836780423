"""Benchmark of the step chain with a JavaScript transform (docs/transforms.md) against none.

    .venv/bin/python bench/transform.py [--events N] [--repeat R] [--batch B]

Runs the same generated events through a DuckDB destination's chain three ways: no transform, a
trivial one (`return $`) and one that writes two rows per event to other tables (EventNative's
"multiply" example), `B` events per call of `DestinationChain.process_many` (the stream worker
gives it a micro-batch, a Spark task a chunk of its partition; `--batch 1` is one event per call,
one round trip to the engine's process per event). Events/s are wall-clock (the engine runs in
a child process), the best of `--repeat` runs; the ratio is events/s with the transform over
events/s without. CPU µs/event adds this process's CPU time and the engine's (from /proc): on a
loaded, shared machine it moves much less than the wall-clock figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).parent))

from eventspark.destinations.duckdb.configuration import DuckDBDestination
from eventspark.steps import transform as transform_module
from eventspark.steps.chain import DestinationChain
from generate import generate_events

TRANSFORMS = {
    "none": None,
    "trivial": "return $",
    "two rows": 'return [{...$, JITSU_TABLE_NAME: "a"}, {...$, JITSU_TABLE_NAME: "b"}]',
}


def build_chain(transform: str | None) -> DestinationChain:
    config = {"type": "duckdb", "data_layout": {"table_name_template": "events"}}
    if transform is not None:
        config["transform"] = transform
    return DestinationChain.build("bench", DuckDBDestination.model_validate(config), None, None)


def engine_cpu(chain: DestinationChain) -> float:
    """CPU seconds the chain's engine process used so far (0 without a transform)."""
    if chain.transform is None:
        return 0.0
    pid = transform_module._context(chain.transform).process.pid
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(lines: list[bytes], chain: DestinationChain, batch: int) -> tuple[float, float]:
    """Wall-clock and CPU seconds (this process and the engine) to run every line through the
    chain, `batch` events per call."""
    start, cpu = time.perf_counter(), time.process_time() + engine_cpu(chain)
    for offset in range(0, len(lines), batch):
        events = [orjson.loads(line) for line in lines[offset : offset + batch]]
        results = chain.process_many(events)
        assert len(results) == len(events)
    return time.perf_counter() - start, time.process_time() + engine_cpu(chain) - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1000, help="events per process_many call")
    args = parser.parse_args()
    lines = [orjson.dumps(event) for event in generate_events(args.events)]
    chains = {name: build_chain(source) for name, source in TRANSFORMS.items()}
    for chain in chains.values():
        run(lines[:100], chain, args.batch)  # warm up: the engine's process starts
    best = dict.fromkeys(chains, float("inf"))
    best_cpu = dict.fromkeys(chains, float("inf"))
    for _ in range(args.repeat):
        for name, chain in chains.items():
            wall, cpu = run(lines, chain, args.batch)
            best[name], best_cpu[name] = min(best[name], wall), min(best_cpu[name], cpu)
    rate_none = args.events / best["none"]
    print(f"{args.events} events, {args.batch} per call, best of {args.repeat}")
    for name, seconds in best.items():
        rate, cpu = args.events / seconds, best_cpu[name] / args.events * 1e6
        print(f"  transform {name:9} {rate:10,.0f} events/s   ratio {rate / rate_none:.3f}   {cpu:6.1f} µs CPU/event")


if __name__ == "__main__":
    main()
