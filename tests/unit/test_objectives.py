"""Objectives picked from a benchmark run, and the ceiling each sets."""

from __future__ import annotations

from typing import Any

import pytest

from appliance.domain.objectives import Objective, choose_ceiling
from appliance.domain.sweep_analysis import ScoreWeights, SweepPoint, find_knee, pareto_front


def _point(c: int, tok_s: float, ttft: float) -> SweepPoint:
    return SweepPoint(c, tok_s, tok_s / 32, ttft / 2, ttft, 0.05, 0.06, ttft + 1.5)


# Throughput bends at 8; P99 TTFT grows all the way: every level is on the Pareto front.
POINTS = [_point(1, 40, 0.05), _point(2, 78, 0.08), _point(4, 140, 0.2), _point(8, 210, 0.5)]
POINTS += [_point(16, 220, 1.4), _point(32, 224, 3.0)]


def report(points: list[SweepPoint] = POINTS, **extra: Any) -> dict[str, Any]:
    knee = find_knee(points)
    out = {
        "levels": [{"concurrency": p.concurrency, "point": p.to_dict()} for p in points],
        "knee": knee.to_dict(),
        "knee_limit": None if knee.still_rising else knee.concurrency,
        "pareto": [p.concurrency for p in pareto_front(points)],
        "capped_by_daemon_limit": None,
    }
    return {**out, **extra}


def test_knee_objective_is_the_knee():
    choice = choose_ceiling(report(), Objective())
    assert choice.ceiling == 8 and choice.reason.startswith("the knee at 8: ")


def test_knee_of_a_run_still_rising_lifts_the_ceiling():
    linear = [_point(c, 30.0 * c, 0.1) for c in (1, 2, 4, 8)]
    choice = choose_ceiling(report(linear), Objective("knee"))
    assert choice.ceiling is None and "still rising" in choice.reason


def test_knee_of_a_capped_run_sets_nothing():
    with pytest.raises(ValueError, match="objective: this run's knee sets no ceiling"):
        choose_ceiling(report(knee_limit=None, capped_by_daemon_limit=4), Objective("knee"))


def test_score_follows_the_weights():
    latency_first = choose_ceiling(
        report(), Objective("score", weights=ScoreWeights(1, 0.01, 0, 0))
    )
    throughput_first = choose_ceiling(
        report(), Objective("score", weights=ScoreWeights(0.01, 1, 0, 0))
    )
    assert latency_first.ceiling == 1 and throughput_first.ceiling == 32
    assert "the best weighted score (latency 99%, throughput 1%)" in latency_first.reason


def test_a_pareto_level_is_taken_as_chosen():
    choice = choose_ceiling(report(), Objective.parse("4"))
    assert choice.ceiling == 4 and "the Pareto point 4 chosen: 140 tok/s" in choice.reason


def test_levels_off_the_front_or_above_the_cap_are_refused():
    dominated = report(pareto=[1, 2, 4, 8])
    with pytest.raises(ValueError, match=r"level: 16 is not on this run's Pareto front \[1, 2"):
        choose_ceiling(dominated, Objective("level", level=16))
    with pytest.raises(ValueError, match="level: 16 is above the daemon's limit 8"):
        choose_ceiling(report(capped_by_daemon_limit=8), Objective("level", level=16))


@pytest.mark.parametrize(
    ("kind", "level", "message"),
    [
        ("best", None, "objective: must be one of knee, score, level, got 'best'"),
        ("level", None, "level: a whole number >= 1 for objective level, got None"),
        ("level", 0, "level: a whole number >= 1 for objective level, got 0"),
    ],
)
def test_bad_objectives_name_the_field(kind: str, level: int | None, message: str):
    with pytest.raises(ValueError, match=message):
        Objective(kind, level=level)


def test_a_run_without_points_says_so():
    with pytest.raises(ValueError, match="benchmark: the run has no measured level"):
        choose_ceiling({"levels": []}, Objective("score"))
