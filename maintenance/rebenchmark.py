"""Monthly re-benchmark: the sweep against the live daemon, stored, compared, ceiling updated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from appliance.bench_runner import BenchSettings, run_sweep, run_tuning
from appliance.domain.sweep_analysis import ScoreWeights, Slo
from appliance.services.events import EventBus
from appliance.services.store import StateStore


class CeilingHandle(Protocol):
    """What the job changes on the controller (services/control_loop.ControlLoop)."""

    def set_ceiling(self, limit: int, source: str) -> None: ...

    def clear_ceiling(self, source: str) -> None: ...


@dataclass(frozen=True)
class RebenchPlan:
    """What the job measures: the tuning or a sweep, up to the engine's max_num_seqs."""

    mode: str  # "tuning" | "sweep"
    concurrency: tuple[int, ...]  # the sweep's levels (the tuning picks its own)
    max_concurrency: int  # engine.max_num_seqs: the engine cannot run more
    requests_per_level: int
    max_tokens: int


def best_throughput(result: dict[str, Any]) -> float | None:
    """The best output tokens/s of a stored bench result."""
    values = [
        lv["point"]["output_tok_s"]
        for lv in result.get("levels", [])
        if lv.get("point") and lv["point"].get("output_tok_s") is not None
    ]
    return max(values) if values else None


async def rebenchmark(
    url: str,
    admin_token: str,
    store: StateStore,
    events: EventBus,
    *,
    plan: RebenchPlan,
    regression_ratio: float,
    ceiling: CeilingHandle | None = None,
    slo: Slo | None = None,
    weights: ScoreWeights | None = None,
) -> dict[str, Any]:
    """Run the tuning (or sweep), store it, compare with the previous run, hand the knee on.

    A run whose throughput still rises at the largest level it could reach sets no ceiling
    and lifts an older one: on a box that scales further, a ceiling there would cap it for
    a month.
    """
    previous = store.benchmarks(limit=1)
    settings = BenchSettings(
        url=url,
        concurrency=plan.concurrency,
        requests_per_level=plan.requests_per_level,
        max_tokens=plan.max_tokens,
        admin_token=admin_token,
        extend_to=plan.max_concurrency,
    )
    if plan.mode == "tuning":
        report = await run_tuning(
            settings,
            slo,
            max_concurrency=plan.max_concurrency,
            max_limit=plan.max_concurrency,
            weights=weights,
        )
    else:
        report = await run_sweep(settings, slo, weights)
    result = report.to_dict()
    bench_id = store.add_benchmark("maintenance", result)
    now_best = best_throughput(result)
    details: dict[str, Any] = {
        "benchmark_id": bench_id,
        "mode": plan.mode,
        "levels": [lv.concurrency for lv in report.levels],
        "best_output_tok_s": now_best,
        "knee_limit": report.knee_limit,
        "still_rising": report.lifts_ceiling,
    }
    if previous:
        before = best_throughput(previous[0]["result"])
        details["previous_best_output_tok_s"] = before
        if before and now_best is not None and now_best < before * (1 - regression_ratio):
            details["regression"] = True
            events.emit(
                "benchmark_regression",
                f"throughput {now_best:.1f} tok/s is {1 - now_best / before:.0%} below the "
                f"previous run ({before:.1f} tok/s)",
                before=before,
                now=now_best,
            )
    if ceiling is not None:
        source = f"the monthly benchmark (run {bench_id})"
        if report.knee_limit is not None:
            ceiling.set_ceiling(report.knee_limit, source)
            details["ceiling_set"] = report.knee_limit
        elif report.lifts_ceiling:
            ceiling.clear_ceiling(f"{source}: throughput still rising at {max(details['levels'])}")
            details["ceiling_set"] = None
    return details
