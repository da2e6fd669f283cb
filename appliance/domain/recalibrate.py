"""Threshold recalibration maths (pure): percentiles of the metric history, clamped safe."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from appliance.domain.latency_window import percentile

# Fewer samples than this say nothing about a percentile: keep the current value.
MIN_SAMPLES = 30


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
    return max(lo, min(hi, value))


def recalibrate(
    current: Thresholds, history: Sequence[Mapping[str, Any]], bounds: Bounds = Bounds()
) -> Recalibration:
    """New thresholds from history rows (keys: core_temp_c_max, mem_temp_c_max, ttft_p99_s,
    tpot_p99_s, queued); fields with too little data keep their current value.

    Thermal: derate a few degrees above the normal running peak (p99 of samples that were not
    derated), so normal load never derates, but never above the hardware bound. Latency: the
    SLO follows what the box delivers at its p95 with 25 % headroom; the alert fires at 1.5x.
    """
    notes: list[str] = []
    new = asdict(current)

    def column(key: str, where: str | None = None) -> list[float]:
        out = []
        for row in history:
            v = row.get(key)
            if isinstance(v, int | float) and not isinstance(v, bool):
                if where is not None and row.get(where):
                    continue
                out.append(float(v))
        return out

    core = column("core_temp_c_max", where="derated")
    if len(core) >= MIN_SAMPLES:
        new["derate_core_c"] = round(
            _clamp(percentile(core, 99) + 3.0, bounds.min_core_c, bounds.max_core_c), 1
        )
    else:
        notes.append(f"derate_core_c kept: {len(core)} samples < {MIN_SAMPLES}")
    mem = column("mem_temp_c_max", where="derated")
    if len(mem) >= MIN_SAMPLES:
        new["protect_mem_c"] = round(
            _clamp(percentile(mem, 99) + 5.0, bounds.min_mem_c, bounds.max_mem_c), 1
        )
    else:
        notes.append(f"protect_mem_c kept: {len(mem)} samples < {MIN_SAMPLES}")
    for key, col in (("slo_ttft_p99_s", "ttft_p99_s"), ("slo_tpot_p99_s", "tpot_p99_s")):
        values = column(col)
        if len(values) >= MIN_SAMPLES:
            new[key] = round(
                _clamp(percentile(values, 95) * 1.25, bounds.min_slo_s, bounds.max_slo_s), 4
            )
        else:
            notes.append(f"{key} kept: {len(values)} samples < {MIN_SAMPLES}")
    new["alert_ttft_p99_s"] = round(new["slo_ttft_p99_s"] * 1.5, 4)
    queued = column("queued")
    if len(queued) >= MIN_SAMPLES:
        new["alert_queue_depth"] = max(1.0, round(percentile(queued, 99) * 2, 1))
    else:
        notes.append(f"alert_queue_depth kept: {len(queued)} samples < {MIN_SAMPLES}")
    result = Thresholds(**new)
    changes = {
        k: (float(getattr(current, k)), float(getattr(result, k)))
        for k in new
        if getattr(current, k) != getattr(result, k)
    }
    return Recalibration(result, changes, tuple(notes), samples=len(history))
