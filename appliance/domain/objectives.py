"""Objectives an operator picks from a benchmark run, and the ceiling each one sets (pure).

A sweep measures every level; which level is "best" depends on what the operator wants:
the knee (throughput stops paying), the best weighted score under their own weights
(latency, throughput, utilisation, energy), or one point of the Pareto front they chose by
eye. Whichever it is becomes the controller's ceiling: the controller keeps steering by the
SLO and the live signals, but never above the level the objective picked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from appliance.domain.sweep_analysis import ScoreWeights, SweepPoint, weighted_score

OBJECTIVE_KINDS = ("knee", "score", "level")


@dataclass(frozen=True)
class Objective:
    """knee | score (with weights; None: the defaults) | level (a point on the front)."""

    kind: str = "knee"
    level: int | None = None
    weights: ScoreWeights | None = None

    def __post_init__(self) -> None:
        if self.kind not in OBJECTIVE_KINDS:
            raise ValueError(
                f"objective: must be one of {', '.join(OBJECTIVE_KINDS)}, got {self.kind!r}"
            )
        if self.kind == "level" and (
            isinstance(self.level, bool) or not isinstance(self.level, int) or self.level < 1
        ):
            raise ValueError(f"level: a whole number >= 1 for objective level, got {self.level!r}")

    @classmethod
    def parse(cls, text: str, weights: ScoreWeights | None = None) -> Objective:
        """'knee', 'score' or a level number (a point of the Pareto front)."""
        text = text.strip()
        if text.isdigit():
            return cls("level", level=int(text))
        return cls(text, weights=weights)


@dataclass(frozen=True)
class CeilingChoice:
    """What an objective sets: a ceiling, or none at all (lift any), and why."""

    ceiling: int | None
    reason: str


def _points(report: dict[str, Any]) -> list[SweepPoint]:
    out = []
    for level in report.get("levels") or []:
        point = level.get("point") if isinstance(level, dict) else None
        if isinstance(point, dict):
            out.append(SweepPoint(**point))
    if not out:
        raise ValueError("benchmark: the run has no measured level")
    return out


def _capped(report: dict[str, Any], level: int) -> None:
    cap = report.get("capped_by_daemon_limit")
    if isinstance(cap, int) and level > cap:
        raise ValueError(
            f"level: {level} is above the daemon's limit {cap} that capped this run; it "
            "measured the cap, not the engine"
        )


def choose_ceiling(report: dict[str, Any], objective: Objective) -> CeilingChoice:
    """The ceiling objective picks from a stored report (`appliance bench --json`'s shape).

    ValueError names what the run cannot give: a level off the Pareto front, a level above
    the limit that capped the run, a run with nothing measured.
    """
    if objective.kind == "knee":
        knee = report.get("knee") or {}
        limit = report.get("knee_limit")
        if isinstance(limit, int):
            return CeilingChoice(limit, f"the knee at {limit}: {knee.get('reason', '')}")
        if knee.get("still_rising") and report.get("capped_by_daemon_limit") is None:
            return CeilingChoice(
                None, f"no ceiling: throughput still rising at the largest level ({knee['reason']})"
            )
        raise ValueError("objective: this run's knee sets no ceiling (see its notes)")
    points = _points(report)
    if objective.kind == "score":
        weights = objective.weights or ScoreWeights()
        scores = weighted_score(points, weights)
        best = scores.best_concurrency
        _capped(report, best)
        used = ", ".join(f"{k} {v:.0%}" for k, v in scores.weights_used.items())
        score = next(s.score for s in scores.scores if s.concurrency == best)
        return CeilingChoice(best, f"the best weighted score ({used}) {score:.2f} at {best}")
    level = objective.level
    assert level is not None  # checked by Objective
    front = [int(c) for c in report.get("pareto") or []]
    if level not in front:
        raise ValueError(f"level: {level} is not on this run's Pareto front {front}")
    _capped(report, level)
    point = next(p for p in points if p.concurrency == level)
    return CeilingChoice(
        level,
        f"the Pareto point {level} chosen: {point.output_tok_s:.3g} tok/s, "
        f"p99 TTFT {point.ttft_p99_s:.3g} s",
    )
