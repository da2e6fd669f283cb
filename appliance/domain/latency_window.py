"""Sliding-window latency percentiles (pure): finished requests in, p50/p99 over the last N s.

The controller loop adds one sample per finished request and asks for percentiles each tick.
`since_s` lets it ignore samples from before its last limit change, so a decision is judged
on requests that ran under the new limit instead of on the window's memory of the old one.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Metric = Literal["ttft", "tpot"]


def percentile(values: Sequence[float] | Iterable[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between ranks (numpy's default)."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q: must be in [0, 100], got {q}")
    data = sorted(values)
    if not data:
        raise ValueError("values: need at least one value for a percentile")
    rank = (len(data) - 1) * q / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(data) - 1)
    frac = rank - lo
    return data[lo] + (data[hi] - data[lo]) * frac


@dataclass(frozen=True)
class LatencySample:
    """One finished request: when it finished, its TTFT, and its TPOT (None for 1 token)."""

    ts_s: float
    ttft_s: float
    tpot_s: float | None = None
    admitted_s: float | None = None  # when it got its engine slot (None: not known)


@dataclass(frozen=True)
class WindowStats:
    """Percentiles over a window; None where fewer than `min_samples` requests finished."""

    count: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None


class LatencyWindow:
    """Keeps samples of the last `window_s` seconds (at most `max_samples`, oldest dropped)."""

    def __init__(self, window_s: float, max_samples: int = 10_000) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s: must be > 0, got {window_s}")
        if max_samples < 1:
            raise ValueError(f"max_samples: must be >= 1, got {max_samples}")
        self.window_s = window_s
        self._samples: deque[LatencySample] = deque(maxlen=max_samples)

    def __len__(self) -> int:
        return len(self._samples)

    def add(
        self,
        ts_s: float,
        ttft_s: float,
        tpot_s: float | None = None,
        admitted_s: float | None = None,
    ) -> None:
        """Record one finished request (ts_s, admitted_s on the clock of later `now`s)."""
        if not (math.isfinite(ttft_s) and ttft_s >= 0):
            raise ValueError(f"ttft_s: must be a finite number >= 0, got {ttft_s}")
        if tpot_s is not None and not (math.isfinite(tpot_s) and tpot_s >= 0):
            raise ValueError(f"tpot_s: must be a finite number >= 0 or None, got {tpot_s}")
        self._samples.append(LatencySample(ts_s, ttft_s, tpot_s, admitted_s))

    def prune(self, now_s: float) -> None:
        """Forget samples older than the window (samples arrive roughly in time order)."""
        cutoff = now_s - self.window_s
        while self._samples and self._samples[0].ts_s < cutoff:
            self._samples.popleft()

    def samples(self, now_s: float, since_s: float | None = None) -> list[LatencySample]:
        """Samples inside (now - window, now], and not before since_s when given."""
        self.prune(now_s)
        start = now_s - self.window_s
        if since_s is not None:
            start = max(start, since_s)
        # Filter rather than trust order: a late add() with an older ts must not count twice.
        return [s for s in self._samples if start <= s.ts_s <= now_s]

    def count(self, now_s: float, since_s: float | None = None) -> int:
        """How many requests finished inside the window."""
        return len(self.samples(now_s, since_s))

    def percentile(
        self, q: float, now_s: float, metric: Metric = "ttft", since_s: float | None = None
    ) -> float | None:
        """The q-th percentile of TTFT or TPOT over the window; None when it holds no value."""
        values = _values(self.samples(now_s, since_s), metric)
        return percentile(values, q) if values else None

    def stats(
        self,
        now_s: float,
        min_samples: int = 1,
        since_s: float | None = None,
        admitted_since_s: float | None = None,
    ) -> WindowStats:
        """p50 and p99 of TTFT and TPOT; None for a metric with fewer than min_samples values.

        admitted_since_s: only requests admitted at or after it (samples that do not know
        when they were admitted are left out): the requests that ran wholly under a change."""
        if min_samples < 1:
            raise ValueError(f"min_samples: must be >= 1, got {min_samples}")
        window = self.samples(now_s, since_s)
        if admitted_since_s is not None:
            window = [
                s for s in window if s.admitted_s is not None and s.admitted_s >= admitted_since_s
            ]
        ttft = _values(window, "ttft")
        tpot = _values(window, "tpot")

        def pct(values: list[float], q: float) -> float | None:
            return percentile(values, q) if len(values) >= min_samples else None

        return WindowStats(
            count=len(window),
            ttft_p50_s=pct(ttft, 50),
            ttft_p99_s=pct(ttft, 99),
            tpot_p50_s=pct(tpot, 50),
            tpot_p99_s=pct(tpot, 99),
        )


def _values(samples: Iterable[LatencySample], metric: Metric) -> list[float]:
    if metric == "ttft":
        return [s.ttft_s for s in samples]
    if metric == "tpot":
        return [s.tpot_s for s in samples if s.tpot_s is not None]
    raise ValueError(f"metric: must be 'ttft' or 'tpot', got {metric!r}")
