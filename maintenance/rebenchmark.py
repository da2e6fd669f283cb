"""Monthly re-benchmark: the sweep against the live daemon, stored, compared, ceiling updated."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from appliance.bench_runner import BenchSettings, run_sweep
from appliance.domain.sweep_analysis import ScoreWeights, Slo
from appliance.services.events import EventBus
from appliance.services.store import StateStore


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
    concurrency: tuple[int, ...],
    requests_per_level: int,
    max_tokens: int,
    regression_ratio: float,
    set_ceiling: Callable[[int], None] | None = None,
    slo: Slo | None = None,
    weights: ScoreWeights | None = None,
) -> dict[str, Any]:
    """Run the sweep, store it, compare with the previous run, hand the knee on."""
    previous = store.benchmarks(limit=1)
    settings = BenchSettings(
        url=url,
        concurrency=concurrency,
        requests_per_level=requests_per_level,
        max_tokens=max_tokens,
        admin_token=admin_token,
    )
    report = await run_sweep(settings, slo, weights)
    result = report.to_dict()
    bench_id = store.add_benchmark("maintenance", result)
    now_best = best_throughput(result)
    details: dict[str, Any] = {
        "benchmark_id": bench_id,
        "best_output_tok_s": now_best,
        "knee_limit": report.knee_limit,
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
    if report.knee_limit is not None and set_ceiling is not None:
        set_ceiling(report.knee_limit)
        details["ceiling_set"] = report.knee_limit
    return details
