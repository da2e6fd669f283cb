"""Metric-history downsampling (pure): fine samples roll up into coarser buckets."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

Sample = tuple[float, dict[str, Any]]


def is_peak_field(key: str) -> bool:
    """Fields a rollup keeps the maximum of: `<key>_max` and tail percentiles (`_p99`).

    A tail percentile does not compose: the p99 of an hour cannot be had from its minutes,
    and their average hides exactly the spikes the latency alerts exist for (one bad minute
    in an hour shrinks to 1/60 of itself). The maximum is an upper bound on the bucket's p99,
    so recalibration errs toward the tail the box really showed; an SLO set from flattened
    averages would sit below normal behaviour and make alerts and the controller fire on
    ordinary traffic.
    """
    return key.endswith("_max") or "_p99" in key


def is_amount_field(key: str) -> bool:
    """Fields that hold an amount since the previous row (`slo_*`: requests, seconds): a
    rollup sums them, so a window's total is the sum of its rows at any resolution, and a
    daemon restart (counters back at zero) loses nothing, unlike a cumulative counter."""
    return key.startswith("slo_")


def rollup(samples: Sequence[Sample], bucket_s: int) -> list[Sample]:
    """Average each numeric field per bucket_s bucket; peak fields (`is_peak_field`) keep the
    maximum, amount fields (`is_amount_field`) the sum.

    The bucket's timestamp is its start; `n` counts the fine samples it holds (weighted when
    the inputs are rollups themselves), so a second rollup still averages correctly and
    recalibration can weight each row by the time it covers.
    """
    if bucket_s <= 0:
        raise ValueError(f"bucket_s must be > 0, got {bucket_s}")
    buckets: dict[float, list[dict[str, Any]]] = {}
    for ts, data in samples:
        buckets.setdefault(math.floor(ts / bucket_s) * bucket_s, []).append(data)
    out: list[Sample] = []
    for start in sorted(buckets):
        rows = buckets[start]
        weights = [float(r.get("n", 1)) for r in rows]
        merged: dict[str, Any] = {"n": sum(weights)}
        keys = {k for r in rows for k, v in r.items() if k != "n" and _is_number(v)}
        for key in sorted(keys):
            pairs = [
                (r[key], w) for r, w in zip(rows, weights, strict=True) if _is_number(r.get(key))
            ]
            if is_peak_field(key):
                merged[key] = max(v for v, _ in pairs)
            elif is_amount_field(key):
                merged[key] = sum(v for v, _ in pairs)
            else:
                total = sum(w for _, w in pairs)
                merged[key] = sum(v * w for v, w in pairs) / total
        out.append((start, merged))
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
