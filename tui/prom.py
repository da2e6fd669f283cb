"""Just enough Prometheus text parsing for tokens/s and latency percentiles (pure)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LE = re.compile(r'le="([^"]+)"')

Buckets = tuple[tuple[float, float], ...]  # (upper bound, cumulative count), ascending


def scalar(text: str, name: str) -> float | None:
    """The sum over every series of `name` (unlabelled counters and gauges alike)."""
    total: float | None = None
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and m.group(1) == name:
            try:
                total = (total or 0.0) + float(m.group(3))
            except ValueError:
                continue
    return total


def buckets(text: str, histogram: str) -> Buckets:
    """Cumulative buckets of an unlabelled histogram, ascending by bound."""
    out: list[tuple[float, float]] = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m or m.group(1) != f"{histogram}_bucket":
            continue
        le = _LE.search(m.group(2) or "")
        if le:
            out.append((float(le.group(1)), float(m.group(3))))
    return tuple(sorted(out))


def diff(new: Buckets, old: Buckets) -> Buckets:
    """Counts that arrived between two scrapes; `new` alone if the daemon restarted."""
    if len(new) != len(old) or any(a[0] != b[0] for a, b in zip(new, old, strict=True)):
        return new
    delta = tuple((le, n - o) for (le, n), (_, o) in zip(new, old, strict=True))
    return new if any(c < 0 for _, c in delta) else delta


def quantile(q: float, cumulative: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus-style histogram_quantile (linear within a bucket); None without samples."""
    if not cumulative or cumulative[-1][1] <= 0:
        return None
    total = cumulative[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in cumulative:
        if count >= rank:
            if math.isinf(le):
                return prev_le  # the top bucket has no upper bound: report its floor
            width = count - prev_count
            frac = 0.0 if width <= 0 else (rank - prev_count) / width
            return prev_le + (le - prev_le) * frac
        prev_le, prev_count = le, count
    return prev_le
