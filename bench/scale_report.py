"""What bench/scale.py prints: the fits of its measurements (bench/scale_model.py) and the
tables of docs/scaling.md. A measured pass is a dict as `scale.timed_pass` returns it, with its
`events`, `logs` and `mode`; a master's measurements are `scale.measure_master`'s dict."""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from typing import Any

import scale_model
from scale_model import DRIVER_PHASES, Costs, Linear, Workload


def fit_of(runs: list[dict[str, Any]], value: Any) -> Linear:
    """fixed + per event of `value(run)`, on the medians of the repeats."""
    points = scale_model.median_by([((r["events"],), value(r)) for r in runs])
    return scale_model.fit_events([(key[0], seconds) for key, seconds in points])


def stage_fit(measured: dict[str, Any]) -> Linear:
    return fit_of(measured["passes"], lambda r: r["phases"]["stage"])


def cpu_fit(measured: dict[str, Any]) -> Linear:
    return fit_of(measured["passes"], lambda r: r["cpu"])


def driver_fits(passes: list[dict[str, Any]]) -> dict[str, Linear]:
    fits = {}
    for phase in DRIVER_PHASES:
        points = scale_model.median_by([((r["events"], r["logs"]), r["phases"][phase]) for r in passes])
        fits[phase] = scale_model.fit_events_logs([(e, n, s) for (e, n), s in points])
    return fits


def print_passes(measured: dict[str, Any]) -> None:
    print(
        f"\n{measured['label']}: {measured['cores']} cores, session {measured['session_seconds']:.1f} s; "
        f"empty job {measured['job_seconds'] * 1e3:.0f} ms, +{measured['task_seconds'] * 1e3:.1f} ms a task"
    )
    names = " ".join(f"{p:>7}" for p in ("stage", *DRIVER_PHASES))
    print(
        f"  {'mode':<6} {'events':>7} {'logs':>4} {'splits':>6} {'tasks':>5} {'pass s (min-max)':>18}  "
        f"{names}  cpu/busy"
    )
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for run in measured["passes"] + measured.get("staged", []) + measured.get("remote", []):
        groups.setdefault((run["mode"], run["events"], run["logs"]), []).append(run)
    for (mode, events, logs), runs in groups.items():
        totals = [r["total"] for r in runs]
        phases = " ".join(f"{median(runs, lambda r, p=p: r['phases'][p]):>7.3f}" for p in ("stage", *DRIVER_PHASES))
        spread = f"{statistics.median(totals):.2f} ({min(totals):.2f}-{max(totals):.2f})"
        # Cores used by the pass's processes / by the whole machine (Postgres, other work), on average.
        cores = (
            f"{median(runs, lambda r: r['cpu'] / r['total']):.2f}/{median(runs, lambda r: r['busy'] / r['total']):.2f}"
        )
        print(
            f"  {mode:<6} {events:>7,} {logs:>4} {runs[0]['splits']:>6} {runs[0]['tasks']:>5} {spread:>18}  "
            f"{phases}  {cores}"
        )


def median(runs: list[dict[str, Any]], value: Any) -> float:
    return statistics.median(value(r) for r in runs)


def print_fits(results: list[dict[str, Any]]) -> None:
    base = next((m for m in results if m["label"] == "local[1]"), results[0])
    base_slope = stage_fit(base).per_event
    print(
        "\nexecutors' part: stage = fixed + per event (wall), CPU of the pass's processes; "
        f"speed-up over {base['label']}"
    )
    for measured in results:
        fit, cpu = stage_fit(measured), cpu_fit(measured)
        ratio = base_slope / fit.per_event if fit.per_event > 0 else float("nan")
        print(
            f"  {measured['label']:<24} fixed {fit.fixed:6.3f} s, {fit.per_event * 1e6:5.1f} µs/event wall "
            f"(×{ratio:.2f}; ideal ×{measured['cores'] / base['cores']:g}), CPU {cpu.per_event * 1e6:5.1f} µs/event"
        )
    fits = driver_fits([r for m in results for r in m["passes"]])
    print("\ndriver's part, every master's passes (fixed + per event + per log)")
    for phase, fit in fits.items():
        print(
            f"  {phase:<8} {fit.fixed * 1e3:7.1f} ms {fit.per_event * 1e6:7.3f} µs/event "
            f"{fit.per_log * 1e3:6.2f} ms/log"
        )
    print_remote(results)
    staged = [r for m in results for r in m.get("staged", [])]
    if staged:
        load = fit_of(staged, lambda r: r["phases"]["load"])
        print(
            f"  a pass that adds a column (every row staged, one serial commit): load = "
            f"{load.fixed:.2f} s + {load.per_event * 1e6:.2f} µs/event"
        )


def print_remote(results: list[dict[str, Any]]) -> None:
    """The same master's passes with the logs on moto S3 beside those on the local disk."""
    for measured in results:
        remote = measured.get("remote") or []
        if not remote:
            continue
        local, there = stage_fit(measured), fit_of(remote, lambda r: r["phases"]["stage"])
        print(
            f"\nlog.remote on moto S3, {measured['label']}: stage {there.fixed:.3f} s + {there.per_event * 1e6:.1f} "
            f"µs/event (local disk: {local.fixed:.3f} s + {local.per_event * 1e6:.1f}): reading from the store costs "
            f"{(there.per_event - local.per_event) * 1e6:+.1f} µs/event of wall time"
        )
        for phase, fit in driver_fits(remote).items():
            print(
                f"  {phase:<8} {fit.fixed * 1e3:7.1f} ms {fit.per_event * 1e6:7.3f} µs/event "
                f"{fit.per_log * 1e3:6.2f} ms/log"
            )


def cluster_like(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The most cluster-like master measured: its Spark costs stand for a real cluster's."""
    for label in ("standalone", "local-cluster[2,1,1024]", "local[2]"):
        for measured in results:
            if measured["label"] == label:
                return measured
    return results[0]


def model_costs(results: list[dict[str, Any]], rate: float, cores: int) -> Costs:
    """Costs for the prediction: the driver from every pass; an executor core's cost per event is
    local[1]'s CPU per event less the driver's per-event part (its own processes' CPU, so other
    work on the machine does not count); Spark's fixed costs from the most cluster-like master."""
    base = next((m for m in results if m["label"] == "local[1]"), results[0])
    like = cluster_like(results)
    driver = driver_fits([r for m in results for r in m["passes"]])
    per_event = cpu_fit(base).per_event - sum(max(0.0, fit.per_event) for fit in driver.values())
    return Costs(
        driver=driver,
        event_core_seconds=per_event,
        job_seconds=stage_fit(like).fixed,
        task_seconds=like["task_seconds"],
        copy_rate=rate,
        destination_cores=cores,
    )


def check_model(results: list[dict[str, Any]], costs: Costs) -> None:
    """The model's figures for each master's largest pass beside what it measured: with the
    master's cores, and with the cores its processes got (on 2 shared cores, Postgres and the
    machine's other work take their share: /proc's CPU of the pass's processes over its time)."""
    print("\nmodel check, largest pass (local[1]'s cost per event; each master's own Spark costs):")
    for measured in results:
        biggest = max(measured["passes"], key=lambda r: (r["events"], r["logs"]))
        runs = [r for r in measured["passes"] if (r["events"], r["logs"]) == (biggest["events"], biggest["logs"])]
        work = Workload(biggest["events"] * scale_model.DAY_SECONDS, 1.0, biggest["logs"], 0.0)
        local = dataclasses.replace(costs, job_seconds=stage_fit(measured).fixed, task_seconds=measured["task_seconds"])
        full = scale_model.predict(local, work, measured["cores"])
        got = median(runs, lambda r: r["cpu"] / r["total"])
        obtained = full.total - full.executor_bound + full.executor_bound * measured["cores"] / got
        print(
            f"  {measured['label']:<24} measured {median(runs, lambda r: r['total']):5.2f} s; predicted "
            f"{full.total:5.2f} s on {measured['cores']} free cores, {obtained:5.2f} s on the {got:.2f} cores its "
            f"processes got (machine busy {median(runs, lambda r: r['busy'] / r['total']):.2f} of 2)"
        )


def report(results: list[dict[str, Any]], floor: float, args: argparse.Namespace, bytes_per_event: float) -> None:
    for measured in results:
        print_passes(measured)
    print_fits(results)
    print(f"\nCOPY floor: {floor:,.0f} rows/s from one process (a destination core takes this much at most)")
    costs = model_costs(results, floor, args.destination_cores)
    check_model(results, costs)
    like = cluster_like(results)["label"]
    print(
        f"\nprediction: a pass every {args.period:g} s, {bytes_per_event:.0f} bytes/event, one log per collector node "
        f"and pass; an executor core {costs.event_core_seconds * 1e6:.1f} µs/event (local[1]'s CPU); Spark job "
        f"{costs.job_seconds:.2f} s + {costs.task_seconds * 1e3:.0f} ms a further wave of tasks ({like}); "
        f"destination {args.destination_cores} cores × {floor:,.0f} rows/s"
    )
    rates = zip(args.rates, args.nodes, strict=True)
    works = [Workload(rate, args.period, nodes, bytes_per_event) for rate, nodes in rates]
    for line in scale_model.prediction_table(costs, works, args.executors):
        print("  " + line)
