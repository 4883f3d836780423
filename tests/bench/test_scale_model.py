"""The arithmetic of the pass cost model (bench/scale_model.py): the fits must recover known costs
and the predictions must follow the model's formula, or docs/scaling.md's table means nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from scale_model import (
    Costs,
    Linear,
    Workload,
    archive_seconds,
    delete_requests,
    fit_events,
    fit_events_logs,
    least_squares,
    median_by,
    predict,
    prediction_table,
    solve,
    speedup,
)

# One pass = 0.5 s + 3 µs/event + 20 ms/log on the driver: the fit must find these again.
FIXED, PER_EVENT, PER_LOG = 0.5, 3e-6, 0.02
SHAPES = [(2_000, 2), (2_000, 32), (50_000, 4), (200_000, 16)]


def test_solve_finds_the_solution_of_a_small_system() -> None:
    assert solve([[2.0, 1.0], [1.0, 3.0]], [5.0, 10.0]) == pytest.approx([1.0, 3.0])


def test_solve_refuses_a_singular_system() -> None:
    with pytest.raises(ValueError, match="singular"):
        solve([[1.0, 2.0], [2.0, 4.0]], [1.0, 2.0])


def test_fit_recovers_fixed_per_event_and_per_log_costs() -> None:
    points = [(e, n, FIXED + PER_EVENT * e + PER_LOG * n) for e, n in SHAPES]
    fit = fit_events_logs(points)
    assert fit.fixed == pytest.approx(FIXED)
    assert fit.per_event == pytest.approx(PER_EVENT)
    assert fit.per_log == pytest.approx(PER_LOG)


def test_fit_of_noisy_points_is_the_least_squares_line() -> None:
    # y = 1 + 2x with residuals +1, -1, -1, +1 around it: the line itself is the best fit.
    assert least_squares([(0,), (1,), (2,), (3,)], [2.0, 2.0, 4.0, 8.0]) == pytest.approx([1.0, 2.0])
    assert fit_events([(0, 2.0), (1, 2.0), (2, 4.0), (3, 8.0)]) == Linear(pytest.approx(1.0), pytest.approx(2.0))


def test_events_and_logs_varying_together_cannot_be_told_apart() -> None:
    with pytest.raises(ValueError, match="singular"):
        fit_events_logs([(1_000, 1, 1.0), (2_000, 2, 2.0), (4_000, 4, 4.0)])


def test_median_of_repeats_ignores_one_slow_run() -> None:
    points = [((50_000,), 1.0), ((50_000,), 9.0), ((50_000,), 1.2), ((2_000,), 0.3)]
    assert median_by(points) == [((2_000,), 0.3), ((50_000,), 1.2)]


def test_a_negative_coefficient_counts_as_zero_when_extrapolating() -> None:
    assert Linear(0.2, -1e-6, 0.01).at(1e9, 3) == pytest.approx(0.23)


def test_workload_of_a_billion_events_a_day() -> None:
    work = Workload(rate=1e9, period=60, nodes=16, bytes_per_event=1_100)
    assert work.events == 694_445  # 1e9 × 60 / 86,400, rounded up
    # 694,445 × 1,100 B / 16 logs = 47.7 MB a log: 3 splits of at most 16 MiB each.
    assert work.splits == 48


def costs(copy_rate: float = 0.0, destination_cores: int = 1, request_seconds: float = 0.0) -> Costs:
    # The driver's archive (local masters): 1 µs/event; on executors: 2 µs/event a core, 4 ms a log.
    driver = {"plan": Linear(0.1, 0.0, 0.01), "archive": Linear(0.0, 1e-6)}
    return Costs(
        driver,
        40e-6,
        job_seconds=0.3,
        task_seconds=0.05,
        copy_rate=copy_rate,
        destination_cores=destination_cores,
        archive_core_seconds=2e-6,
        archive_log_seconds=0.004,
        archive_job_seconds=0.2,
        request_seconds=request_seconds,
    )


def test_prediction_follows_the_formula() -> None:
    work = Workload(rate=1e9, period=60, nodes=16, bytes_per_event=1_100)
    p = predict(costs(), work, 16)
    events = 694_445
    assert p.driver == pytest.approx(0.1 + 0.01 * 16)  # a cluster's driver does not gzip
    # 48 splits, 48 tasks (≤ 4 per executor): 3 waves, the first in the job's fixed cost; the
    # events spread over 16 executors.
    assert p.stage == pytest.approx(0.3 + 2 * 0.05 + events * 40e-6 / 16)
    # 16 logs, a task each, on 16 executors: one wave; each core gzips one log.
    assert p.archive == pytest.approx(0.2 + (events * 2e-6 + 16 * 0.004) / 16)
    assert p.total == pytest.approx(p.driver + p.stage + p.archive)
    assert p.driver_share == pytest.approx(p.driver / p.total)


def test_archive_job_is_one_wave_of_a_task_per_core() -> None:
    # 16 logs on 4 executors: 4 tasks of 4 logs (one wave), a quarter of the events a core.
    assert archive_seconds(costs(), 800_000, 16, 4) == pytest.approx(0.2 + (1.6 + 0.064) / 4)
    assert archive_seconds(costs(), 800_000, 16, 1) == pytest.approx(0.2 + 1.6 + 0.064)


def test_a_small_pass_keeps_the_archive_on_the_driver_even_on_a_cluster() -> None:
    # 10M a day: 6,945 events of 1,100 bytes a pass, far below 256 MiB: no second Spark job.
    small = Workload(rate=1e7, period=60, nodes=2, bytes_per_event=1_100)
    assert predict(costs(), small, 16).archive == 0.0
    on_driver = predict(costs(), small, 16, archive_on_driver=True)
    assert predict(costs(), small, 16).driver == pytest.approx(on_driver.driver)
    big = Workload(rate=1e9, period=60, nodes=16, bytes_per_event=1_100)
    assert predict(costs(), big, 16).archive > 0.0


def test_archive_spreads_over_no_more_executors_than_logs() -> None:
    work = Workload(rate=1e9, period=60, nodes=16, bytes_per_event=1_100)
    assert predict(costs(), work, 64).archive == pytest.approx(predict(costs(), work, 16).archive)
    assert predict(costs(), work, 16).archive < predict(costs(), work, 4).archive


def test_a_local_master_keeps_the_archive_on_the_driver() -> None:
    work = Workload(rate=1e9, period=60, nodes=16, bytes_per_event=1_100)
    p = predict(costs(), work, 2, archive_on_driver=True)
    assert p.archive == 0.0
    assert p.driver == pytest.approx(0.1 + 0.01 * 16 + 1e-6 * 694_445)


def test_store_deletes_are_two_bulk_requests_up_to_a_thousand_logs() -> None:
    assert [delete_requests(n) for n in (1, 16, 1_000, 1_001)] == [2, 2, 2, 4]
    work = Workload(rate=1e9, period=60, nodes=16, bytes_per_event=1_100)
    slow_store = predict(costs(request_seconds=0.05), work, 16).driver
    assert slow_store - predict(costs(), work, 16).driver == pytest.approx(2 * 0.05)  # not 32 × 0.05


def test_executors_without_a_split_do_not_help() -> None:
    work = Workload(rate=1e9, period=60, nodes=16, bytes_per_event=1_100)  # 48 splits
    assert predict(costs(), work, 64).executor_bound == pytest.approx(predict(costs(), work, 48).executor_bound)


def test_the_destination_bounds_the_pass_when_it_is_slower() -> None:
    work = Workload(rate=1e9, period=60, nodes=16, bytes_per_event=1_100)
    slow = costs(copy_rate=50_000, destination_cores=2)
    p = predict(slow, work, 16)
    assert p.destination_bound == pytest.approx(694_445 / (2 * 50_000))
    assert p.stage == pytest.approx(0.3 + 2 * 0.05 + p.destination_bound)
    assert p.destination_bound > p.executor_bound


def test_speedup_is_one_on_one_executor_and_grows_below_the_executor_count() -> None:
    work = Workload(rate=1e9, period=60, nodes=16, bytes_per_event=1_100)
    assert speedup(costs(), work, 1) == pytest.approx(1.0)
    assert 1 < speedup(costs(), work, 4) < 4
    assert speedup(costs(), work, 16) < 16


def test_the_table_says_whether_a_pass_keeps_up_with_its_period() -> None:
    work = Workload(rate=1e9, period=60, nodes=16, bytes_per_event=1_100)  # 28 s on one executor
    lines = prediction_table(costs(copy_rate=5_000, destination_cores=1), [work], [1])
    assert len(lines) == 2 and "NO" in lines[1]  # 694k events at 5,000 rows/s: 139 s > 60 s
    lines = prediction_table(costs(), [work], [1, 16])
    assert "NO" not in "".join(lines[1:])


def measured(label: str, archive: str | None, archive_seconds_of: object) -> dict[str, object]:
    """A master's measurements as bench/scale.py saves them: the archive phase as given, the
    other phases the driver's FIXED/PER_EVENT/PER_LOG, the stage 0.3 s + 10 µs/event."""
    passes = []
    for events, logs in SHAPES:
        phases = {p: FIXED + PER_EVENT * events + PER_LOG * logs for p in ("list", "plan", "load", "settle")}
        phases["archive"] = archive_seconds_of(events, logs)  # type: ignore[operator]
        phases["stage"] = 0.3 + 10e-6 * events
        passes.append({"events": events, "logs": logs, "phases": phases, "cpu": 20e-6 * events, "total": 1.0})
    out: dict[str, object] = {"label": label, "cores": 2, "passes": passes, "job_seconds": 0.25, "task_seconds": 0.08}
    if archive is not None:
        out["archive_on"] = archive
    return out


def test_the_driver_archive_is_fitted_on_local_masters_only() -> None:
    from scale_report import model_costs, model_driver_fits

    local = measured("local[2]", "driver", lambda e, n: 0.01 + 1e-6 * e + 5e-4 * n)
    cluster = measured("standalone", "executors", lambda e, n: 0.25 + 0.4e-6 * e)  # a Spark job
    fits = model_driver_fits([local, cluster])
    assert fits["archive"].per_event == pytest.approx(1e-6)
    assert fits["archive"].per_log == pytest.approx(5e-4)
    assert fits["plan"].per_event == pytest.approx(PER_EVENT)
    saved = {"results": [local, cluster], "floor": 200_000.0, "gzip_cpu_per_event": 1.5e-6}
    got = model_costs(saved, 2)
    assert got.archive_core_seconds == pytest.approx(1.5e-6)  # the gzip's CPU, not the pool's wall time
    assert got.archive_log_seconds == pytest.approx(5e-4)
    assert got.archive_job_seconds == pytest.approx(0.25)  # standalone's empty job
    # local[2]'s CPU per event less the driver's per-event phases and the gzip.
    assert got.event_core_seconds == pytest.approx(20e-6 - 4 * PER_EVENT - 1.5e-6)


def test_runs_saved_before_the_fix_archived_on_the_driver_everywhere() -> None:
    from scale_report import model_costs

    old = [measured(label, None, lambda e, n: 0.01 + 1e-6 * e) for label in ("local[2]", "standalone")]
    got = model_costs({"results": old, "floor": 200_000.0}, 2)
    assert got.driver["archive"].per_event == pytest.approx(1e-6)
    assert got.archive_core_seconds == pytest.approx(1e-6)  # no gzip figure saved: the driver's fit
