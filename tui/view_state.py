"""What the TUI knows about the daemon: last snapshot plus short histories (pure, no I/O)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tui import prom

HISTORY = 60  # points per sparkline: 2 minutes at the default 2 s refresh
EVENTS_KEPT = 500
LATENCY_WINDOW_S = 30.0  # percentiles over this much recent traffic, not one noisy poll


class Link(StrEnum):
    CONNECTING = "connecting"
    UP = "up"
    DOWN = "down"
    UNAUTHORIZED = "unauthorized"


@dataclass
class Connection:
    """The state of the link to the daemon, shown by the banner."""

    link: Link = Link.CONNECTING
    message: str = ""
    retry_in_s: float | None = None
    events_live: bool = False


def _series() -> deque[float]:
    return deque(maxlen=HISTORY)


@dataclass
class GpuHistory:
    """Recent readings of one GPU."""

    core_c: deque[float] = field(default_factory=_series)
    mem_c: deque[float] = field(default_factory=_series)
    power_w: deque[float] = field(default_factory=_series)
    util_pct: deque[float] = field(default_factory=_series)


@dataclass
class Scrape:
    """One /metrics reading, reduced to what the TUI derives from it."""

    t_s: float
    tokens: float | None
    ttft: prom.Buckets
    tpot: prom.Buckets


def latency_from_status(status: dict[str, Any]) -> dict[str, float | None]:
    """P50/P99 TTFT/TPOT seconds if the daemon reports them itself (keys may be missing)."""
    lat = status.get("latency") or (status.get("controller") or {}).get("latency") or {}
    out: dict[str, float | None] = {}
    for key in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s"):
        value = lat.get(key) if isinstance(lat, dict) else None
        out[key] = float(value) if isinstance(value, int | float) else None
    return out


class Model:
    """Everything the screens draw from; updated by the app's workers."""

    def __init__(self) -> None:
        self.status: dict[str, Any] | None = None
        self.connection = Connection()
        self.gpus: dict[int, GpuHistory] = {}
        self.tokens_per_s: deque[float] = _series()
        self.latency: dict[str, deque[float]] = {
            k: _series() for k in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")
        }
        self.latest_latency: dict[str, float | None] = dict.fromkeys(self.latency)
        self.events: deque[dict[str, Any]] = deque(maxlen=EVENTS_KEPT)
        self.events_added = 0  # moves with every new event: screens skip work when it stands
        # Counts job_* events seen: the Maintenance and Benchmarks screens refetch when it moves.
        self.job_events = 0
        self._seen_seq: set[int] = set()
        self._scrapes: deque[Scrape] = deque()
        self.jobs: dict[str, Any] | None = None
        self.jobs_error: str | None = None
        self.benchmarks: dict[str, Any] | None = None
        self.benchmarks_error: str | None = None
        self.thresholds: dict[str, Any] | None = None  # /admin/thresholds
        self.thresholds_error: str | None = None
        self.usage: dict[str, Any] | None = None  # /admin/usage
        self.keys: dict[str, Any] | None = None  # /admin/keys
        self.usage_error: str | None = None

    def ingest_status(self, status: dict[str, Any]) -> None:
        """Take a /admin/status snapshot: GPU histories and any events not seen yet."""
        self.status = status
        for gpu in (status.get("telemetry") or {}).get("gpus") or []:
            hist = self.gpus.setdefault(int(gpu.get("index", 0)), GpuHistory())
            for key, series in (
                ("core_temp_c", hist.core_c),
                ("mem_temp_c", hist.mem_c),
                ("power_w", hist.power_w),
                ("gpu_util_pct", hist.util_pct),
            ):
                value = gpu.get(key)
                if isinstance(value, int | float):
                    series.append(float(value))
        for event in status.get("events") or []:
            self.add_event(event)
        reported = latency_from_status(status)
        if any(v is not None for v in reported.values()):
            self._set_latency(reported)

    def add_event(self, event: dict[str, Any]) -> bool:
        """Keep an event once (SSE and status both carry them); True if it was new."""
        seq = event.get("seq")
        if isinstance(seq, int):
            if seq in self._seen_seq:
                return False
            self._seen_seq.add(seq)
            if len(self._seen_seq) > 4 * EVENTS_KEPT:
                self._seen_seq = {e["seq"] for e in self.events if isinstance(e.get("seq"), int)}
        self.events.append(event)
        self.events_added += 1
        if str(event.get("kind", "")).startswith("job_"):
            self.job_events += 1
        return True

    def ingest_metrics(self, text: str, now_s: float) -> None:
        """Take a /metrics scrape: tokens/s since the last one, percentiles over the window."""
        scrape = Scrape(
            now_s,
            prom.scalar(text, "appliance_generated_tokens_total"),
            prom.buckets(text, "appliance_ttft_seconds"),
            prom.buckets(text, "appliance_tpot_seconds"),
        )
        if self._scrapes:
            last = self._scrapes[-1]
            dt = scrape.t_s - last.t_s
            if dt > 0 and scrape.tokens is not None and last.tokens is not None:
                # A restarted daemon starts its counter again: count from zero then.
                delta = scrape.tokens - last.tokens
                self.tokens_per_s.append((delta if delta >= 0 else scrape.tokens) / dt)
        self._scrapes.append(scrape)
        while len(self._scrapes) > 2 and now_s - self._scrapes[1].t_s >= LATENCY_WINDOW_S:
            self._scrapes.popleft()
        if self.status is not None and any(
            v is not None for v in latency_from_status(self.status).values()
        ):
            return  # the daemon's own percentiles win
        oldest = self._scrapes[0]
        if oldest is scrape:
            return
        ttft = prom.diff(scrape.ttft, oldest.ttft)
        tpot = prom.diff(scrape.tpot, oldest.tpot)
        self._set_latency(
            {
                "ttft_p50_s": prom.quantile(0.5, ttft),
                "ttft_p99_s": prom.quantile(0.99, ttft),
                "tpot_p50_s": prom.quantile(0.5, tpot),
                "tpot_p99_s": prom.quantile(0.99, tpot),
            }
        )

    def _set_latency(self, values: dict[str, float | None]) -> None:
        self.latest_latency = values
        for key, value in values.items():
            if value is not None:
                self.latency[key].append(value)
