"""Continuous log analysis: on a schedule, the OOM-precursor and latency-spike analysis of
`appliance logs analyze` runs over the daemon's own recent metric history, so on-call hears
of memory heading for its limit while there is still time to act, not after the kill.

Each finding is an event once, when it starts, and one more when it ends (the state below
keeps an ongoing finding from being reported every tick); the series in
services/warning_series.py show it for as long as it lasts.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from appliance.config.maintenance import MaintenanceConfig
from appliance.domain.incidents import AnalysisConfig, LatencySpike
from appliance.domain.precursors import (
    MemoryForecast,
    TrendConfig,
    as_records,
    memory_forecasts,
    open_spikes,
    still_precursor,
)
from appliance.services.events import EventBus
from appliance.services.periodic import Periodic
from appliance.services.warning_series import EarlyWarningSeries

log = logging.getLogger("appliance.early_warning")

# An ongoing precursor ends only once its ETA is this many horizons away (hysteresis).
CLEAR_HORIZON_FACTOR = 1.5


def trend_config(cfg: MaintenanceConfig) -> TrendConfig:
    """The precursor thresholds for this config's horizon."""
    horizon = cfg.early_warning_horizon_s
    return TrendConfig(horizon_s=horizon, clear_horizon_s=horizon * CLEAR_HORIZON_FACTOR)


@dataclass(frozen=True)
class Findings:
    """One analysis round: each memory resource's forecast and each open latency spike."""

    ts_s: float
    rows: int
    memory: dict[str, MemoryForecast]
    spikes: dict[str, LatencySpike | None]


class EarlyWarning:
    """Every interval: read the window of history, analyse it, report what started or ended."""

    def __init__(
        self,
        history: Callable[[float], list[dict[str, Any]]],
        events: EventBus,
        series: EarlyWarningSeries,
        cfg: MaintenanceConfig,
        clock: Callable[[], float] = time.time,
        trend: TrendConfig | None = None,
        spikes: AnalysisConfig | None = None,
    ) -> None:
        self._history = history
        self._events = events
        self._series = series
        self._cfg = cfg
        self._clock = clock
        self._trend = trend or trend_config(cfg)
        self._spike_cfg = spikes or AnalysisConfig()
        self._oom_active: set[str] = set()
        self._spikes_active: set[str] = set()
        self.last: Findings | None = None
        self._periodic = Periodic(
            "early-warning", self._tick, lambda: cfg.early_warning_interval_s, log
        )

    async def start(self) -> None:
        await self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    @property
    def running(self) -> bool:
        """Whether the analysis runs on its schedule."""
        return self._periodic.running

    async def _tick(self) -> None:
        # The SQLite read and the fit off the loop; events and gauges on it (the event bus
        # hands events to asyncio queues, which are not thread-safe).
        findings = await asyncio.to_thread(self.analyse)
        self.report(findings)

    def analyse(self) -> Findings:
        """The analysis of the window ending now (reads the store; reports nothing)."""
        now = self._clock()
        rows = self._history(now - self._cfg.early_warning_window_s)
        records = as_records(rows)
        return Findings(
            now,
            len(rows),
            memory_forecasts(records, self._trend),
            open_spikes(records, self._spike_cfg),
        )

    def check_once(self) -> Findings:
        """Analyse and report in one step (tests, and a caller already off the loop's path)."""
        findings = self.analyse()
        self.report(findings)
        return findings

    def report(self, findings: Findings) -> None:
        """Set the series; an event for each finding that started or ended since the last."""
        for resource, forecast in findings.memory.items():
            self._memory(resource, forecast)
        for metric, spike in findings.spikes.items():
            self._spike(metric, spike)
        self.last = findings

    def _memory(self, resource: str, f: MemoryForecast) -> None:
        s = self._series
        s.oom_eta_seconds.labels(resource).set(f.eta_s)
        was = resource in self._oom_active
        now = still_precursor(f, self._trend) if was else f.precursor
        s.oom_precursor.labels(resource).set(1 if now else 0)
        if now and not was:
            self._oom_active.add(resource)
            s.early_warnings_total.labels("oom_precursor").inc()
            self._events.emit(
                "oom_precursor",
                f.reason,
                resource=resource,
                eta_s=round(f.eta_s, 1),
                level_ratio=_rounded(f.level, 4),
                slope_per_min=_rounded(f.fit.slope_per_s * 60 if f.fit else None, 6),
            )
        elif was and not now:
            self._oom_active.discard(resource)
            eta = None if math.isnan(f.eta_s) or math.isinf(f.eta_s) else round(f.eta_s, 1)
            self._events.emit(
                "oom_precursor_cleared",
                f"{resource} no longer heads for its limit: {f.reason}",
                resource=resource,
                eta_s=eta,
                level_ratio=_rounded(f.level, 4),
            )

    def _spike(self, metric: str, spike: LatencySpike | None) -> None:
        s = self._series
        s.latency_spike_active.labels(metric).set(0 if spike is None else 1)
        was = metric in self._spikes_active
        if spike is not None and not was:
            self._spikes_active.add(metric)
            s.early_warnings_total.labels("latency_spike").inc()
            self._events.emit(
                "latency_spike",
                f"{metric} P99 {spike.peak_s:.2f} s, {spike.factor:.1f}x its "
                f"{spike.baseline_s:.2f} s baseline",
                metric=metric,
                peak_s=round(spike.peak_s, 4),
                baseline_s=round(spike.baseline_s, 4),
                since_ts_s=spike.start_ts_s,
            )
        elif spike is None and was:
            self._spikes_active.discard(metric)
            self._events.emit(
                "latency_spike_cleared", f"{metric} P99 back near its baseline", metric=metric
            )


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
