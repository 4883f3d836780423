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


def costs(copy_rate: float = 0.0, destination_cores: int = 1) -> Costs:
    driver = {"plan": Linear(0.1, 0.0, 0.01), "archive": Linear(0.0, 1e-6)}
    return Costs(
        driver, 40e-6, job_seconds=0.3, task_seconds=0.05, copy_rate=copy_rate, destination_cores=destination_cores
    )


def test_prediction_follows_the_formula() -> None:
    work = Workload(rate=1e9, period=60, nodes=16, bytes_per_event=1_100)
    p = predict(costs(), work, 16)
    events = 694_445
    assert p.driver == pytest.approx(0.1 + 0.01 * 16 + 1e-6 * events)
    # 48 splits, 48 tasks (≤ 4 per executor): 3 waves, the first in the job's fixed cost; the
    # events spread over 16 executors.
    assert p.stage == pytest.approx(0.3 + 2 * 0.05 + events * 40e-6 / 16)
    assert p.total == pytest.approx(p.driver + p.stage)
    assert p.driver_share == pytest.approx(p.driver / p.total)


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
