"""What bench/scale.py prints: the fits of its measurements (bench/scale_model.py) and the
tables of docs/scaling.md. A measured pass is a dict as `scale.timed_pass` returns it, with its
`events`, `logs` and `mode`; a master's measurements are `scale.measure_master`'s dict; a run is
`scale.measure`'s dict (`results`, `floor`, `bytes_per_event`, `gzip_cpu_per_event`)."""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from typing import Any

import scale_model
from eventspark.batch.commits import DEFAULT_CONNECTIONS
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


def archive_on(measured: dict[str, Any]) -> str:
    """Who gzipped the logs under this master: "driver" or "executors" (a Spark job). Runs saved
    before the archive moved to a cluster's executors (commit 453a7fa) have no such field: the
    driver archived under every master then."""
    return measured.get("archive_on", "driver")


def model_driver_fits(results: list[dict[str, Any]]) -> dict[str, Linear]:
    """The driver's phases over every master's passes, but the archive only over the masters
    whose driver gzipped (`local...`): on a cluster master the `archive` timing is a Spark job."""
    fits = driver_fits([r for m in results for r in m["passes"]])
    local = [r for m in results if archive_on(m) == "driver" for r in m["passes"]]
    if local:
        fits["archive"] = driver_fits(local)["archive"]
    else:
        del fits["archive"]
    return fits


def print_phase(phase: str, fit: Linear, note: str = "") -> None:
    print(
        f"  {phase:<8} {fit.fixed * 1e3:7.1f} ms {fit.per_event * 1e6:7.3f} µs/event {fit.per_log * 1e3:6.2f} ms/log"
        f"{note}"
    )


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
    for run in measured["passes"] + measured.get("staged", []) + measured.get("keyed", []) + measured.get("remote", []):
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


def fit_events_logs_of(passes: list[dict[str, Any]], phase: str) -> Linear:
    return driver_fits(passes)[phase]


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
    print("\ndriver's part, every master's passes (fixed + per event + per log)")
    for phase, fit in model_driver_fits(results).items():
        print_phase(phase, fit, "  (on the driver: local masters only)" if phase == "archive" else "")
    for measured in results:
        if archive_on(measured) == "executors":
            fit = fit_events_logs_of(measured["passes"], "archive")
            print_phase("archive", fit, f"  (a Spark job on {measured['label']}'s {measured['cores']} executor cores)")
    print_remote(results)
    # Postgres's task commits: a transaction per task's rows (per key bucket), `cores` connections at once.
    kinds = {
        "staged": "a pass that adds a column on {} (every row staged, committed per task",
        "keyed": "a pass into a keyed table on {} (every row staged, upserted per key bucket",
    }
    for measured in results:
        for mode, what in kinds.items():
            runs = measured.get(mode) or []
            if runs:
                load = fit_of(runs, lambda r: r["phases"]["load"])
                print(
                    f"  {what.format(measured['label'])}, {measured['cores']} connections): "
                    f"load = {load.fixed:.2f} s + {load.per_event * 1e6:.2f} µs/event"
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
            print_phase(phase, fit)


def cluster_like(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The most cluster-like master measured: its Spark costs stand for a real cluster's."""
    for label in ("standalone", "local-cluster[2,1,1024]", "local[2]"):
        for measured in results:
            if measured["label"] == label:
                return measured
    return results[0]


def model_costs(saved: dict[str, Any], cores: int, request_seconds: float = 0.0) -> Costs:
    """Costs for the prediction: the driver from every pass; an executor core's cost per event is
    local[1]'s CPU per event less the driver's per-event part (its own processes' CPU, so other
    work on the machine does not count); Spark's fixed costs from the most cluster-like master.
    The archive on a cluster's executors: the gzip's CPU per event on one thread (runs saved
    before it was measured: the driver's archive fit, wall time of its thread pool), the
    driver's per-log part, and an empty job's cost."""
    results = saved["results"]
    base = next((m for m in results if m["label"] == "local[1]"), results[0])
    like = cluster_like(results)
    driver = model_driver_fits(results)
    archive = driver.get("archive", Linear(0.0))
    gzip = saved.get("gzip_cpu_per_event", max(0.0, archive.per_event))
    others = sum(max(0.0, fit.per_event) for phase, fit in driver.items() if phase != "archive")
    return Costs(
        driver=driver,
        event_core_seconds=cpu_fit(base).per_event - others - gzip,  # CPU of the pass: the gzip's too
        job_seconds=stage_fit(like).fixed,
        task_seconds=like["task_seconds"],
        copy_rate=saved["floor"],
        destination_cores=cores,
        archive_core_seconds=gzip,
        archive_log_seconds=max(0.0, archive.per_log),
        archive_job_seconds=like["job_seconds"],
        request_seconds=request_seconds,
    )


def check_model(results: list[dict[str, Any]], costs: Costs) -> None:
    """The model's figures for each master's largest pass beside what it measured: with the
    master's cores, and with the cores its processes got (on 2 shared cores, Postgres and the
    machine's other work take their share: /proc's CPU of the pass's processes over its time)."""
    base = next((m for m in results if m["label"] == "local[1]"), results[0])["label"]
    print(f"\nmodel check, largest pass ({base}'s cost per event; each master's own Spark costs):")
    for measured in results:
        biggest = max(measured["passes"], key=lambda r: (r["events"], r["logs"]))
        runs = [r for r in measured["passes"] if (r["events"], r["logs"]) == (biggest["events"], biggest["logs"])]
        work = Workload(biggest["events"] * scale_model.DAY_SECONDS, 1.0, biggest["logs"], 0.0)
        local = dataclasses.replace(
            costs,
            job_seconds=stage_fit(measured).fixed,
            task_seconds=measured["task_seconds"],
            archive_job_seconds=measured["job_seconds"],
        )
        on_driver = archive_on(measured) == "driver"
        # The bench archives on a cluster's executors at every size (`EXECUTOR_ARCHIVE_BYTES` = 0).
        cores = measured["cores"]
        full = scale_model.predict(local, work, cores, archive_on_driver=on_driver, executor_archive_bytes=0)
        got = median(runs, lambda r: r["cpu"] / r["total"])
        obtained = full.total - full.executor_bound + full.executor_bound * measured["cores"] / got
        print(
            f"  {measured['label']:<24} measured {median(runs, lambda r: r['total']):5.2f} s; predicted "
            f"{full.total:5.2f} s on {measured['cores']} free cores, {obtained:5.2f} s on the {got:.2f} cores its "
            f"processes got (machine busy {median(runs, lambda r: r['busy'] / r['total']):.2f} of 2)"
        )
        if not on_driver:
            check_archive(measured, local)


def check_archive(measured: dict[str, Any], costs: Costs) -> None:
    """The archive job of each pass shape on a cluster master, measured and as the model has it."""
    shapes = sorted({(r["events"], r["logs"]) for r in measured["passes"]})
    figures = []
    for events, logs in shapes:
        runs = [r for r in measured["passes"] if (r["events"], r["logs"]) == (events, logs)]
        predicted = scale_model.archive_seconds(costs, events, logs, measured["cores"])
        figures.append(f"{events:,}/{logs}: {median(runs, lambda r: r['phases']['archive']):.2f} ({predicted:.2f})")
    print(f"  {'':<24} its archive job, events/logs: measured s (predicted): {'; '.join(figures)}")


def report(saved: dict[str, Any], args: argparse.Namespace) -> None:
    results, floor, bytes_per_event = saved["results"], saved["floor"], saved["bytes_per_event"]
    for measured in results:
        print_passes(measured)
    print_fits(results)
    print(f"\nCOPY floor: {floor:,.0f} rows/s from one process (a destination core takes this much at most)")
    costs = model_costs(saved, args.destination_cores, args.store_request_ms / 1e3)
    check_model(results, costs)
    like = cluster_like(results)["label"]
    base = next((m for m in results if m["label"] == "local[1]"), results[0])["label"]
    gzip = "one thread's CPU" if "gzip_cpu_per_event" in saved else "the driver's fit: not measured in this run"
    print(
        f"\nprediction: a pass every {args.period:g} s, {bytes_per_event:.0f} bytes/event, one log per collector node "
        f"and pass; an executor core {costs.event_core_seconds * 1e6:.1f} µs/event ({base}'s CPU); Spark job "
        f"{costs.job_seconds:.2f} s + {costs.task_seconds * 1e3:.0f} ms a further wave of tasks ({like}); "
        f"destination {args.destination_cores} cores × {floor:,.0f} rows/s; archive on the executors: a job "
        f"{costs.archive_job_seconds:.2f} s + {costs.archive_core_seconds * 1e6:.2f} µs/event ({gzip}) + "
        f"{costs.archive_log_seconds * 1e3:.2f} ms/log over min(executors, logs) cores; store requests "
        f"{args.store_request_ms:g} ms each"
    )
    rates = zip(args.rates, args.nodes, strict=True)
    works = [Workload(rate, args.period, nodes, bytes_per_event) for rate, nodes in rates]
    for line in scale_model.prediction_table(costs, works, args.executors):
        print("  " + line)
    print_driver_archive(costs, works)
    print_task_commits(results, works, args.executors, args.destination_cores)


def print_task_commits(
    results: list[dict[str, Any]], works: list[Workload], executors: list[int], destination_cores: int
) -> None:
    """The load of a pass whose rows are all staged (it adds a column) with task commits: the
    driver's part is the patch and a statement per unit; the INSERT ... SELECTs are the warehouse's
    work, on min(connections, destination cores) at once (connections: the job's cores, one per
    executor here). Per connection: the staged fit of the master with the fewest cores (local[1]:
    one connection); the one serial commit it replaces is the same with one connection."""
    staged = [m for m in results if m.get("staged")]
    if not staged:
        return
    base = min(staged, key=lambda m: m["cores"])
    fit = fit_of(base["staged"], lambda r: r["phases"]["load"])
    per_connection = fit.per_event * base["cores"]  # the work of an event's commit on one connection
    print(
        f"\npasses that add a column (every row staged): {per_connection * 1e6:.2f} µs/event a connection "
        f"({base['label']}'s staged fit × its {base['cores']} connections), over min(executors, "
        f"{DEFAULT_CONNECTIONS}, {destination_cores} destination cores) connections (`spark.commit_connections` "
        "left at 0); the one serial commit before: one connection"
    )
    for work in works:
        serial = fit.fixed + work.events * per_connection
        cells = ", ".join(
            f"{n}: {fit.fixed + work.events * per_connection / min(n, DEFAULT_CONNECTIONS, destination_cores):.2f} s"
            for n in executors
        )
        print(f"  {scale_model._count(work.rate)}/day: load {cells} (serial: {serial:.2f} s)")


def print_driver_archive(costs: Costs, works: list[Workload]) -> None:
    """What a `local...` master still does: the driver gzips every log (its fitted phase)."""
    fit = costs.driver.get("archive")
    if fit is None:
        return
    print(
        f"\nthe archive on the driver (local masters: {fit.fixed * 1e3:.1f} ms + {fit.per_event * 1e6:.2f} µs/event "
        f"+ {fit.per_log * 1e3:.2f} ms/log, a thread pool on the node's cores):"
    )
    for work in works:
        seconds = fit.at(work.events, work.logs)
        print(f"  {scale_model._count(work.rate)}/day: {seconds:.2f} s a pass on the driver")
