"""Early warning over the daemon's own recent metric rows (pure: rows in, findings out).

`appliance logs analyze` (domain/incidents.py) explains an incident afterwards; this module
asks the same two questions of the last hour while the daemon runs, so there is time to act:
- Will host or GPU memory reach its limit within the horizon at the current slope (an OOM
  precursor)? A least-squares line over the window, trusted only when it fits the points,
  rose by a material share of the limit, and still rises in the newest quarter of the window
  (a start-up step or a burst that has passed is not a leak).
- Is a latency P99 far above its recent baseline right now? The spike rule is the log
  analysis' own (`incidents.spikes_in`, same thresholds), so both report the same spikes.

Rows are metric-history rows (services/metric_row.py) with their `ts_s`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from appliance.domain.incidents import (
    SAMPLE_EVENT,
    AnalysisConfig,
    LatencySpike,
    LogRecord,
    latency_series,
    resource_series,
    spikes_in,
)

# The analysis' resource names -> the `resource` label of the early-warning series.
OOM_RESOURCES = {"host_memory": "rss", "gpu_memory": "gpu_memory"}
# The analysis' latency names -> the `metric` label.
SPIKE_METRICS = {"p99_ttft_s": "ttft", "p99_tpot_s": "tpot"}


@dataclass(frozen=True)
class TrendConfig:
    """When a memory trend is a precursor; the defaults suit 5 s samples over an hour."""

    horizon_s: float = 3600.0  # the limit reached sooner than this at the slope: a precursor
    clear_horizon_s: float = 5400.0  # an active one ends once the ETA moves past this
    min_points: int = 6
    min_span_s: float = 600.0  # ten minutes of points before a slope means anything
    min_r2: float = 0.8  # a step (engine start) fits a line at R² <= 0.75
    min_rise: float = 0.02  # the fitted line rises by this share of the limit over the window
    recent_share: float = 0.25  # the newest quarter of the window ...
    recent_min_slope: float = 0.5  # ... rises at least half as fast as the whole window


@dataclass(frozen=True)
class Fit:
    """A least-squares line through (ts, share of the limit) points."""

    points: int
    span_s: float
    slope_per_s: float
    level: float  # the line's value at the newest point
    r2: float


@dataclass(frozen=True)
class MemoryForecast:
    """One resource's trend and whether it is a precursor, with the reason."""

    resource: str
    fit: Fit | None  # None: too few points to fit
    recent_slope_per_s: float | None
    eta_s: float  # seconds to the limit at the slope: inf when not growing, nan when unknown
    precursor: bool
    reason: str

    @property
    def level(self) -> float | None:
        """The fitted share of the limit now."""
        return None if self.fit is None else self.fit.level


def fit_line(points: Sequence[tuple[float, float]]) -> Fit | None:
    """The least-squares line through the points; None for fewer than two distinct times."""
    n = len(points)
    if n < 2:
        return None
    t0 = points[0][0]
    ts = [t - t0 for t, _ in points]
    vs = [v for _, v in points]
    mean_t, mean_v = sum(ts) / n, sum(vs) / n
    stt = sum((t - mean_t) ** 2 for t in ts)
    if stt <= 0:
        return None
    stv = sum((t - mean_t) * (v - mean_v) for t, v in zip(ts, vs, strict=True))
    svv = sum((v - mean_v) ** 2 for v in vs)
    slope = stv / stt
    # A flat line through flat points explains them fully.
    r2 = 1.0 if svv <= 0 else (stv * stv) / (stt * svv)
    level = mean_v + slope * (ts[-1] - mean_t)
    return Fit(n, ts[-1] - ts[0], slope, level, r2)


def eta_to_limit_s(fit: Fit) -> float:
    """Seconds until the line reaches 1.0 (the limit); inf when it does not rise."""
    if fit.slope_per_s <= 0:
        return math.inf
    return max(0.0, (1.0 - fit.level) / fit.slope_per_s)


def _recent(points: Sequence[tuple[float, float]], share: float) -> list[tuple[float, float]]:
    start = points[-1][0] - (points[-1][0] - points[0][0]) * share
    return [p for p in points if p[0] >= start]


def _why_not(fit: Fit, recent: Fit | None, eta_s: float, cfg: TrendConfig) -> str | None:
    """Why a well-sampled trend is no precursor; None when it is one."""
    if fit.slope_per_s <= 0:
        return "not growing"
    if fit.r2 < cfg.min_r2:
        return f"no steady growth (R² {fit.r2:.2f} < {cfg.min_r2})"
    if fit.slope_per_s * fit.span_s < cfg.min_rise:
        return f"rose {fit.slope_per_s * fit.span_s:.1%} of the limit, under {cfg.min_rise:.0%}"
    if recent is None or recent.slope_per_s < cfg.recent_min_slope * fit.slope_per_s:
        return "growth has stalled in the newest part of the window"
    if eta_s > cfg.horizon_s:
        return f"the limit is {eta_s / 60:.0f} min away, past {cfg.horizon_s / 60:.0f} min"
    return None


def forecast_memory(
    resource: str, points: Sequence[tuple[float, float]], cfg: TrendConfig
) -> MemoryForecast:
    """Whether this resource (points: ts, share of its limit) reaches its limit within the
    horizon at the slope of the window."""
    fit = fit_line(points)
    if fit is None or fit.points < cfg.min_points or fit.span_s < cfg.min_span_s:
        return MemoryForecast(
            resource, fit, None, math.nan, False, "too few samples in the window for a slope"
        )
    recent = fit_line(_recent(points, cfg.recent_share))
    eta = eta_to_limit_s(fit)
    why_not = _why_not(fit, recent, eta, cfg)
    reason = why_not or (
        f"{resource} at {fit.level:.0%} of its limit, +{fit.slope_per_s * 60:.2%} of it per min "
        f"over {fit.span_s / 60:.0f} min: the limit in ~{eta / 60:.0f} min at this slope"
    )
    return MemoryForecast(
        resource,
        fit,
        None if recent is None else recent.slope_per_s,
        eta,
        why_not is None,
        reason,
    )


def still_precursor(forecast: MemoryForecast, cfg: TrendConfig) -> bool:
    """Whether a precursor already reported goes on: the memory still grows in the newest
    part of the window and the limit is within the (longer) clear horizon. The raise and
    clear conditions differ so an ETA hovering at the horizon is reported once."""
    if forecast.precursor:
        return True
    fit, recent = forecast.fit, forecast.recent_slope_per_s
    if fit is None or recent is None or fit.slope_per_s <= 0:
        return False
    growing = recent >= cfg.recent_min_slope * fit.slope_per_s
    return growing and forecast.eta_s <= cfg.clear_horizon_s


def as_records(rows: Sequence[Mapping[str, Any]]) -> list[LogRecord]:
    """Metric-history rows as the log analysis' metrics_sample records."""
    rows = sorted(
        (r for r in rows if isinstance(r.get("ts_s"), int | float)), key=lambda r: r["ts_s"]
    )
    return [
        LogRecord(
            ts_s=float(row["ts_s"]),
            level="info",
            logger="",
            msg="",
            event=SAMPLE_EVENT,
            fields=row,
        )
        for row in rows
    ]


def memory_forecasts(records: Sequence[LogRecord], cfg: TrendConfig) -> dict[str, MemoryForecast]:
    """label -> forecast for each memory resource (rss, gpu_memory), with or without points."""
    series = resource_series(records)
    return {
        label: forecast_memory(label, series.get(name, []), cfg)
        for name, label in OOM_RESOURCES.items()
    }


def open_spikes(
    records: Sequence[LogRecord], cfg: AnalysisConfig
) -> dict[str, LatencySpike | None]:
    """label -> the latency spike still under way at the newest record (None: none is).

    A spike is under way while its newest spike point is at most `spike_gap_s` before the
    newest record: the log analysis would still join a point then to the same spike."""
    newest = max((r.ts_s for r in records if r.ts_s is not None), default=None)
    series = latency_series(records, [])
    out: dict[str, LatencySpike | None] = {}
    for name, label in SPIKE_METRICS.items():
        runs = spikes_in(series.get(name, []), cfg.spike_factor, cfg.spike_min_s, cfg)
        last = runs[-1] if runs else None
        if last is None or newest is None or newest - last.end > cfg.spike_gap_s:
            out[label] = None
            continue
        out[label] = LatencySpike(
            label, last.start, last.end, last.peak_ts, last.peak, last.baseline, ()
        )
    return out
