"""Threshold recalibration maths (pure): percentiles of the metric history, clamped safe."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# Fewer history rows than this say nothing about a percentile: keep the current value. Rows,
# not weights: one hourly rollup stands for 720 samples but is still a single observation.
MIN_SAMPLES = 30
# A history column: (value, weight) pairs, the weight the raw samples a row stands for.
Samples = list[tuple[float, float]]


@dataclass(frozen=True)
class Bounds:
    """Safe bounds; thermal maxima are the hardware's unless the operator allows more."""

    min_core_c: float = 70.0
    max_core_c: float = 90.0
    min_mem_c: float = 80.0
    max_mem_c: float = 100.0
    min_slo_s: float = 0.05
    max_slo_s: float = 120.0


@dataclass(frozen=True)
class Thresholds:
    """The values recalibration manages."""

    derate_core_c: float
    protect_mem_c: float
    slo_ttft_p99_s: float
    slo_tpot_p99_s: float
    alert_ttft_p99_s: float
    alert_queue_depth: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class Recalibration:
    """The new set, what changed and why."""

    thresholds: Thresholds
    changes: dict[str, tuple[float, float]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    samples: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "thresholds": self.thresholds.to_dict(),
            "changes": {k: list(v) for k, v in self.changes.items()},
            "notes": list(self.notes),
            "samples": self.samples,
        }


def _clamp(value: float, lo: float, hi: float) -> float:
    """value within [lo, hi]; when the bounds cross, the upper (hardware) bound wins."""
    return min(hi, max(lo, value))


def weighted_percentile(pairs: Iterable[tuple[float, float]], q: float) -> float:
    """The q-th percentile (0..100) of (value, weight) pairs.

    Linear interpolation between ranks, as if each value were repeated `weight` times: with
    integer weights this equals numpy's default percentile of the expanded list, and with
    all weights 1 it is the plain percentile.
    """
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q: must be in [0, 100], got {q}")
    data = sorted((v, w) for v, w in pairs if w > 0)
    if not data:
        raise ValueError("pairs: need at least one positive weight for a percentile")
    total = sum(w for _, w in data)
    rank = max(0.0, (total - 1) * q / 100.0)
    lo = math.floor(rank)

    def at(position: float) -> float:
        cumulative = 0.0
        for value, weight in data:
            cumulative += weight
            if position < cumulative:
                return value
        return data[-1][0]

    low = at(lo)
    return low + (at(lo + 1) - low) * (rank - lo)


def recalibrate(
    current: Thresholds, history: Sequence[Mapping[str, Any]], bounds: Bounds = Bounds()
) -> Recalibration:
    """New thresholds from history rows (keys: core_temp_c_max, mem_temp_c_max, ttft_p99_s,
    tpot_p99_s, queued); fields with too little data keep their current value.

    Thermal: derate a few degrees above the normal running peak (p99 of samples that were not
    derated), so normal load never derates, but never above the hardware bound: when the lower
    bound is above the hardware limit, the hardware limit wins. Latency: the SLO follows what
    the box delivers at its p95 with 25 % headroom; the alert fires at 1.5x.

    Each row counts for the time it covers: a row's `n` is the number of raw samples it stands
    for (1 for a raw row, about 12 for a minute rollup, 720 for an hour at 5 s sampling), so a
    quarter of hourly rollups is not outvoted by the last day's raw samples.
    """
    notes: list[str] = []
    new = asdict(current)
    for name, lo, hi in (
        ("core", bounds.min_core_c, bounds.max_core_c),
        ("mem", bounds.min_mem_c, bounds.max_mem_c),
    ):
        if lo > hi:
            notes.append(f"min_{name}_c {lo:g} is above the limit {hi:g}: the limit wins")

    def column(key: str, where: str | None = None) -> Samples:
        out = []
        for row in history:
            v = row.get(key)
            if _is_number(v):
                if where is not None and row.get(where):
                    continue
                w = row.get("n", 1)
                out.append((float(v), float(w) if _is_number(w) else 1.0))
        return out

    def fit(key: str, values: Samples, value: Callable[[Samples], float]) -> None:
        """new[key] = value(values) when there are enough samples; else it keeps, with a note."""
        if len(values) >= MIN_SAMPLES:
            new[key] = value(values)
        else:
            notes.append(f"{key} kept: {len(values)} samples < {MIN_SAMPLES}")

    fit(
        "derate_core_c",
        column("core_temp_c_max", where="derated"),
        lambda v: _thermal_limit(v, 3.0, bounds.min_core_c, bounds.max_core_c),
    )
    fit(
        "protect_mem_c",
        column("mem_temp_c_max", where="derated"),
        lambda v: _thermal_limit(v, 5.0, bounds.min_mem_c, bounds.max_mem_c),
    )
    for key, col in (("slo_ttft_p99_s", "ttft_p99_s"), ("slo_tpot_p99_s", "tpot_p99_s")):
        fit(
            key,
            column(col),
            lambda v: round(
                _clamp(weighted_percentile(v, 95) * 1.25, bounds.min_slo_s, bounds.max_slo_s), 4
            ),
        )
    new["alert_ttft_p99_s"] = round(new["slo_ttft_p99_s"] * 1.5, 4)
    fit(
        "alert_queue_depth",
        column("queued"),
        lambda v: max(1.0, round(weighted_percentile(v, 99) * 2, 1)),
    )
    result = Thresholds(**new)
    changes = {
        k: (float(getattr(current, k)), float(getattr(result, k)))
        for k in new
        if getattr(current, k) != getattr(result, k)
    }
    return Recalibration(result, changes, tuple(notes), samples=len(history))


def _thermal_limit(values: Samples, headroom_c: float, lo: float, hi: float) -> float:
    """headroom_c above the running peak (weighted p99), kept within [lo, hi]."""
    return round(_clamp(weighted_percentile(values, 99) + headroom_c, lo, hi), 1)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
