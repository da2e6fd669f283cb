"""Load signals (pure): the five inputs of the load predictor, read from metric-history rows and
resampled onto a regular time grid."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_STEP_S = 5.0
# A raw row stands for the time up to the next one, but not across a daemon outage: past this,
# the grid has a gap rather than minutes of invented values.
DEFAULT_MAX_HOLD_S = 30.0

# Feature order for every model; `pending` is also the forecast target.
FEATURES: tuple[str, ...] = (
    "gpu_util_pct",
    "mem_used_ratio",
    "core_temp_c",
    "pending",
    "tokens_per_s",
)
PENDING_INDEX = FEATURES.index("pending")


@dataclass(frozen=True, slots=True)
class LoadSignals:
    """The box's load at one grid point (the bucket [ts_s, ts_s + step_s))."""

    ts_s: float
    gpu_util_pct: float  # mean over GPUs, 0..100
    mem_used_ratio: float  # GPU memory used / total, 0..1
    core_temp_c: float  # hottest GPU core
    pending: float  # requests waiting in admission + running in the engine
    tokens_per_s: float  # generated tokens per second

    def vector(self) -> tuple[float, ...]:
        """The five signals in FEATURES order."""
        return (
            self.gpu_util_pct,
            self.mem_used_ratio,
            self.core_temp_c,
            self.pending,
            self.tokens_per_s,
        )


# Where a field is missing from a row (older daemons stored fewer keys, a CPU box has no GPU):
# 1. a same-row fallback, 2. the last known value (forward fill), 3. the first known value
# (back fill, for rows before the key appeared), 4. the neutral default below. The models
# normalise each feature, so a feature that is constant on a box carries no weight.
_DEFAULTS: dict[str, float] = {
    "gpu_util_pct": 0.0,
    "mem_used_ratio": 0.0,
    "core_temp_c": 0.0,
    "pending": 0.0,
    "tokens_per_s": 0.0,
}


def _num(row: Mapping[str, Any], key: str) -> float | None:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _raw_fields(row: Mapping[str, Any]) -> dict[str, float | None]:
    """The five signals of one row, None where the row does not say."""
    queued = _num(row, "queued")
    in_flight = _num(row, "in_flight")
    if in_flight is None:
        # Rows without admission counts still have the engine's view of the same requests.
        running, waiting = _num(row, "running"), _num(row, "waiting")
        if running is not None or waiting is not None:
            in_flight = (running or 0.0) + (waiting or 0.0)
    pending = None if queued is None and in_flight is None else (queued or 0.0) + (in_flight or 0.0)
    mem = _num(row, "mem_used_ratio")
    if mem is None:
        # vLLM preallocates GPU memory, so the KV-cache fill is the part of it that moves with load.
        mem = _num(row, "kv_cache_usage_ratio")
    temp = _num(row, "core_temp_c_max")
    if temp is None:
        temp = _num(row, "core_temp_c")
    return {
        "gpu_util_pct": _num(row, "gpu_util_pct"),
        "mem_used_ratio": mem,
        "core_temp_c": temp,
        "pending": pending,
        "tokens_per_s": _num(row, "tokens_per_s"),
    }


def _filled(records: list[dict[str, float | None]]) -> list[dict[str, float]]:
    """Forward fill, then back fill with the first known value, then the neutral default."""
    first: dict[str, float] = {}
    for rec in records:
        for key, value in rec.items():
            if value is not None and key not in first:
                first[key] = value
    last = {key: first.get(key, default) for key, default in _DEFAULTS.items()}
    out: list[dict[str, float]] = []
    for rec in records:
        for key, value in rec.items():
            if value is not None:
                last[key] = value
        out.append(dict(last))
    return out


def signals_from_history(
    rows: Sequence[Mapping[str, Any]],
    step_s: float = DEFAULT_STEP_S,
    max_hold_s: float = DEFAULT_MAX_HOLD_S,
) -> list[LoadSignals]:
    """Metric-history rows (any mix of raw and rollup rows, any order) as LoadSignals on a
    grid of step_s buckets aligned to multiples of step_s; uncovered buckets are left out.

    A raw row (`resolution_s` 0 or absent) belongs to the bucket holding its ts_s; several in
    one bucket are averaged; an empty bucket repeats the last raw value up to max_hold_s
    after it. A rollup row (`resolution_s` R > 0, ts_s = bucket start, values = means) fills
    every bucket in [ts_s, ts_s + R) with its values (zero-order hold). Where tiers overlap,
    the finest one wins. Missing keys: see `_DEFAULTS`.

    The output has one point per step_s of the time covered: pass a bounded window (a day of
    raw and minute rows), not a year of hourly rollups.
    """
    if step_s <= 0:
        raise ValueError(f"step_s must be > 0, got {step_s}")
    timed = [r for r in rows if _num(r, "ts_s") is not None]
    timed.sort(key=lambda r: float(r["ts_s"]))
    if not timed:
        return []
    values = _filled([_raw_fields(r) for r in timed])

    # bucket index -> (resolution that filled it, values); a finer resolution overwrites.
    grid: dict[int, tuple[float, dict[str, float]]] = {}
    raw_sums: dict[int, list[dict[str, float]]] = {}
    raw_last_ts: dict[int, float] = {}
    for row, vals in zip(timed, values, strict=True):
        ts = float(row["ts_s"])
        res = _num(row, "resolution_s") or 0.0
        if res <= 0:
            k = math.floor(ts / step_s)
            raw_sums.setdefault(k, []).append(vals)
            raw_last_ts[k] = ts
            continue
        first = math.floor(ts / step_s)
        last = math.ceil((ts + res) / step_s) - 1
        for k in range(first, max(first, last) + 1):
            held = grid.get(k)
            if held is None or res <= held[0]:
                grid[k] = (res, vals)

    for k, members in raw_sums.items():
        grid[k] = (0.0, {key: sum(m[key] for m in members) / len(members) for key in _DEFAULTS})
    # Hold each raw bucket into the empty buckets after it, up to max_hold_s or the next row.
    raw_keys = sorted(raw_sums)
    for i, k in enumerate(raw_keys):
        stop_ts = raw_last_ts[k] + max_hold_s
        next_k = raw_keys[i + 1] if i + 1 < len(raw_keys) else k + 1
        for j in range(k + 1, next_k):
            if j * step_s > stop_ts:
                break
            # A rollup covering the bucket is a measurement; the hold is only a guess.
            if j not in grid:
                grid[j] = (0.0, grid[k][1])

    return [
        LoadSignals(
            ts_s=k * step_s,
            gpu_util_pct=v["gpu_util_pct"],
            mem_used_ratio=v["mem_used_ratio"],
            core_temp_c=v["core_temp_c"],
            pending=v["pending"],
            tokens_per_s=v["tokens_per_s"],
        )
        for k, (_, v) in sorted(grid.items())
    ]


def segments(
    series: Sequence[LoadSignals], step_s: float = DEFAULT_STEP_S
) -> list[list[LoadSignals]]:
    """Split a series into runs without gaps (models need contiguous windows)."""
    out: list[list[LoadSignals]] = []
    for s in series:
        if out and s.ts_s - out[-1][-1].ts_s <= step_s * 1.5:
            out[-1].append(s)
        else:
            out.append([s])
    return out
