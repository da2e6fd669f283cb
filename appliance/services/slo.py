"""The availability SLO, live and from history.

`SloMeter` classes each finished request and each second of readiness as it happens
(appliance/domain/availability.py says what counts as what): Prometheus counters for the
recording rules and burn-rate alerts (monitoring/slo.yml), and the amounts since the
previous metric-history row, so the state store holds the same figures. `SloHistory` sums
the stored rows into availability over 1 d, 7 d and 30 d and the 30-day budget left, for
/admin/status, `appliance status`, the TUI and the `appliance_availability_ratio` gauges.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric

from appliance.domain.availability import (
    BUDGET_PERIOD_S,
    OBJECTIVE,
    WINDOWS_S,
    Availability,
    RequestClass,
    SloTotals,
    TimeClass,
    availability_of,
    classify_request,
    classify_time,
    error_budget,
)
from appliance.services.events import Event
from appliance.services.store import StateStore

# The state store's record of whether a daemon run is in progress: still "running" at the
# next start means the previous run never stopped cleanly (killed, crashed, power lost).
RUN_STATE_KEY = "daemon_run"
# What each metric-history row carries: amounts since the previous row (summed by rollups).
ROW_FIELDS = {"good": "slo_good", "bad": "slo_bad", "up_s": "slo_up_s", "down_s": "slo_down_s"}


def previous_run_crashed(store: StateStore) -> bool:
    """Mark this run as in progress; whether the previous one ended without a clean stop."""
    crashed = store.meta(RUN_STATE_KEY) == "running"
    store.set_meta(RUN_STATE_KEY, "running")
    return crashed


def mark_clean_stop(store: StateStore) -> None:
    """The run ends cleanly: the next start is planned, not a recovery."""
    store.set_meta(RUN_STATE_KEY, "stopped")


class SloMeter:
    """Counts the SLI as it happens; thread-safe (history rows are built off the loop)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        readiness: Callable[[], str],
        after_crash: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._requests = Counter(
            "appliance_slo_requests",
            "Requests that reached admission, by SLO outcome (good: answered; bad: a "
            "server-side failure or an unplanned 503; excluded: refused by design or planned)",
            ["outcome"],
            registry=registry,
        )
        self._seconds = Counter(
            "appliance_slo_ready_seconds",
            "Seconds by readiness for the SLO (up: ready; down: not ready, unplanned; "
            "excluded: paused, draining, graceful restart)",
            ["state"],
            registry=registry,
        )
        # Every label set from the start: a rule sees zero before the first failure.
        for outcome in RequestClass:
            self._requests.labels(outcome.value)
        for state in TimeClass:
            self._seconds.labels(state.value)
        self._readiness = readiness
        # A start after a crash is an outage, not planned work; so is one that keeps failing.
        self._unplanned = after_crash
        self._clock = clock
        self._lock = threading.Lock()
        self._last_s = clock()
        self._class = self._classify()
        self._totals = SloTotals()
        self._in_rows = SloTotals()

    def _classify(self) -> TimeClass:
        return classify_time(self._readiness(), self._unplanned)

    def advance(self) -> None:
        """Count the time since the last call in the readiness class seen then."""
        with self._lock:
            now = self._clock()
            elapsed = max(0.0, now - self._last_s)
            self._last_s = now
            self._seconds.labels(self._class.value).inc(elapsed)
            if self._class is TimeClass.UP:
                self._totals = self._totals + SloTotals(up_s=elapsed)
            elif self._class is TimeClass.DOWN:
                self._totals = self._totals + SloTotals(down_s=elapsed)
            self._class = self._classify()

    def record_request(self, status: str) -> RequestClass:
        """Count one finished request by its accounting status, judged by readiness now:
        accounting runs in the same step as the refusal, so "now" is why it was refused."""
        outcome = classify_request(status, classify_time(self._readiness(), self._unplanned))
        self._requests.labels(outcome.value).inc()
        with self._lock:
            if outcome is RequestClass.GOOD:
                self._totals = self._totals + SloTotals(good=1)
            elif outcome is RequestClass.BAD:
                self._totals = self._totals + SloTotals(bad=1)
        return outcome

    def on_event(self, event: Event) -> None:
        """Event sink: close the time slice at each state change, and track whether the
        start in progress is unplanned (a failed engine start makes it so until ready)."""
        if event.kind not in ("engine_state", "engine_start_failed", "thermal"):
            return
        self.advance()
        with self._lock:
            if event.kind == "engine_start_failed":
                self._unplanned = True
            elif event.kind == "engine_state" and event.data.get("state") == "ready":
                self._unplanned = False
            self._class = self._classify()

    def totals(self) -> SloTotals:
        """Everything since the daemon started."""
        self.advance()
        with self._lock:
            return self._totals

    def row_fields(self) -> dict[str, float]:
        """The amounts since the previous row, for the next metric-history row."""
        self.advance()
        with self._lock:
            now, before = self._totals, self._in_rows
            self._in_rows = now
        return {
            field: round(getattr(now, attr) - getattr(before, attr), 6)
            for attr, field in ROW_FIELDS.items()
        }


@dataclass(frozen=True)
class WindowReport:
    """One window's totals and availability."""

    window: str
    totals: SloTotals
    availability: Availability


class SloHistory:
    """Availability over the reporting windows from the stored rows, recomputed after each
    history sample (off the loop) and served from that result in between."""

    def __init__(
        self,
        store: StateStore,
        clock: Callable[[], float] = time.time,
        objective: float = OBJECTIVE,
    ) -> None:
        self._store = store
        self._clock = clock
        self._objective = objective
        self._lock = threading.Lock()
        self._latest: tuple[float, list[WindowReport]] | None = None

    def refresh(self) -> None:
        """Sum the stored rows of every window (SQLite; call it off the event loop)."""
        now = self._clock()
        reports = []
        for name, span_s in WINDOWS_S.items():
            sums = self._store.sum_metric_fields(list(ROW_FIELDS.values()), now - span_s)
            totals = SloTotals(**{attr: sums[field] for attr, field in ROW_FIELDS.items()})
            reports.append(WindowReport(name, totals, availability_of(totals)))
        with self._lock:
            self._latest = (now, reports)

    def _reports(self) -> tuple[float, list[WindowReport]]:
        if self._latest is None:
            self.refresh()  # once, before the first sample: a few small queries
        assert self._latest is not None
        return self._latest

    def snapshot(self) -> dict[str, Any]:
        """Availability per window and the 30-day budget, JSON-able (for /admin/status)."""
        as_of_s, reports = self._reports()
        period = next(r for r in reports if WINDOWS_S[r.window] == BUDGET_PERIOD_S)
        budget = error_budget(period.availability.ratio, self._objective)
        return {
            "objective": self._objective,
            "period_s": BUDGET_PERIOD_S,
            "as_of_s": as_of_s,
            "windows": {r.window: {**asdict(r.availability), **asdict(r.totals)} for r in reports},
            "budget": asdict(budget),
        }

    def describe(self) -> Iterator[Metric]:
        """The families, for registration without a query."""
        yield from self._families({}, None)

    def collect(self) -> Iterator[Metric]:
        """Scrape time: the gauges from the latest computation (NaN: no data yet)."""
        _, reports = self._reports()
        ratios = {r.window: r.availability.ratio for r in reports}
        yield from self._families(ratios, ratios.get("30d"))

    def _families(self, ratios: dict[str, float | None], month: float | None) -> Iterator[Metric]:
        avail = GaugeMetricFamily(
            "appliance_availability_ratio",
            "Availability (requests x readiness time) from the daemon's own history",
            labels=["window"],
        )
        for window in WINDOWS_S:
            value = ratios.get(window)
            avail.add_metric([window], math.nan if value is None else value)
        yield avail
        yield GaugeMetricFamily(
            "appliance_error_budget_remaining_ratio",
            f"Share of the 30-day error budget of the {OBJECTIVE:.1%} objective left "
            "(below 0: overspent)",
            value=error_budget(month, self._objective).remaining_ratio,
        )
