"""The early-warning service over a real state store: each finding is one event when it
starts and one when it ends, and the series follow it tick by tick."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from appliance.config.maintenance import MaintenanceConfig
from appliance.services.early_warning import EarlyWarning
from appliance.services.events import EventBus
from appliance.services.metric_history import RAW, HistorySampler
from appliance.services.metrics import Metrics
from appliance.services.store import StateStore

GiB = 1024**3
LIMIT = 64 * GiB
T0 = 1_800_000_000.0


class Clock:
    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


class Box:
    """A store, the history over it, and the early warning reading that history."""

    def __init__(self, tmp_path: Path, **cfg: float) -> None:
        self.clock = Clock(T0)
        self.store = StateStore(tmp_path / "appliance.db")
        self.cfg = MaintenanceConfig(**cfg)
        history = HistorySampler(self.store, dict, self.cfg, clock=self.clock)
        self.events = EventBus()
        self.metrics = Metrics()
        self.warning = EarlyWarning(
            history.history, self.events, self.metrics.early_warning, self.cfg, clock=self.clock
        )

    def row(self, at_s: float, rss_ratio: float, **extra: float) -> None:
        data = {
            "rss_bytes": int(rss_ratio * LIMIT),
            "memory_limit_bytes": LIMIT,
            "gpu_memory_used_bytes": 72 * GiB,
            "gpu_memory_total_bytes": 80 * GiB,
            **extra,
        }
        self.store.add_metric_sample(T0 + at_s, RAW, data)

    def tick(self, at_s: float) -> None:
        self.clock.now_s = T0 + at_s
        self.warning.check_once()

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events.recent()]

    def value(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return Box(tmp_path)


def test_series_start_quiet(box: Box) -> None:
    for resource in ("rss", "gpu_memory"):
        assert box.value("appliance_oom_precursor", resource=resource) == 0
        assert math.isnan(box.value("appliance_oom_eta_seconds", resource=resource))
    for metric in ("ttft", "tpot"):
        assert box.value("appliance_latency_spike_active", metric=metric) == 0
    for kind in ("oom_precursor", "latency_spike"):
        assert box.value("appliance_early_warnings_total", kind=kind) == 0


def test_memory_growth_is_reported_once_and_cleared_when_it_stops(box: Box) -> None:
    # An hour of RSS growing 50 % -> 80 % of the limit, a row a minute: the limit in 40 min.
    for minute in range(61):
        box.row(minute * 60, 0.5 + 0.3 * minute / 60)
    box.tick(3600)
    assert box.kinds() == ["oom_precursor"]
    event = box.events.recent()[-1]
    assert event.data["resource"] == "rss"
    assert event.data["eta_s"] == pytest.approx(2400, rel=0.02)
    assert "the limit in ~40 min" in event.reason
    assert box.value("appliance_oom_precursor", resource="rss") == 1
    assert box.value("appliance_oom_eta_seconds", resource="rss") == pytest.approx(2400, rel=0.02)
    assert box.value("appliance_oom_precursor", resource="gpu_memory") == 0
    assert box.value("appliance_oom_eta_seconds", resource="gpu_memory") == math.inf
    assert box.value("appliance_early_warnings_total", kind="oom_precursor") == 1

    # Growth goes on for 5 more minutes: still one event, the gauge stays at 1.
    for minute in range(61, 66):
        box.row(minute * 60, 0.5 + 0.3 * minute / 60)
        box.tick(minute * 60)
    assert box.kinds() == ["oom_precursor"]
    assert box.value("appliance_oom_precursor", resource="rss") == 1

    # Then it stops: flat rows until the precursor clears, within the window's last quarter.
    level = 0.5 + 0.3 * 65 / 60
    cleared_at = None
    for minute in range(66, 66 + 30):
        box.row(minute * 60, level)
        box.tick(minute * 60)
        if box.value("appliance_oom_precursor", resource="rss") == 0:
            cleared_at = minute
            break
    assert cleared_at is not None and cleared_at - 65 <= 15
    assert box.kinds() == ["oom_precursor", "oom_precursor_cleared"]
    assert box.events.recent()[-1].data["resource"] == "rss"
    assert box.value("appliance_early_warnings_total", kind="oom_precursor") == 1

    # Flat from then on: nothing new.
    for minute in range(cleared_at + 1, cleared_at + 10):
        box.row(minute * 60, level)
        box.tick(minute * 60)
    assert box.kinds() == ["oom_precursor", "oom_precursor_cleared"]


def test_only_the_window_counts(tmp_path: Path) -> None:
    # The same growth, but it ended two hours ago: outside a one-hour window.
    box = Box(tmp_path)
    for minute in range(61):
        box.row(minute * 60, 0.5 + 0.3 * minute / 60)
    box.tick(3 * 3600)
    assert box.kinds() == []
    assert math.isnan(box.value("appliance_oom_eta_seconds", resource="rss"))


def test_latency_spike_is_reported_once_and_cleared(box: Box) -> None:
    ttft = [0.2] * 20 + [2.5] * 5 + [0.2] * 30  # 10 s rows
    for i, v in enumerate(ttft):
        box.row(i * 10, 0.5, ttft_p99_s=v)
        box.tick(i * 10)
    assert box.kinds() == ["latency_spike", "latency_spike_cleared"]
    spike = box.events.recent()[0]
    assert spike.data["metric"] == "ttft"
    assert spike.data["peak_s"] == 2.5 and spike.data["baseline_s"] == 0.2
    assert box.value("appliance_latency_spike_active", metric="ttft") == 0
    assert box.value("appliance_early_warnings_total", kind="latency_spike") == 1


async def test_runs_on_its_schedule(tmp_path: Path) -> None:
    box = Box(tmp_path, early_warning_interval_s=0.01)
    for minute in range(61):
        box.row(minute * 60, 0.5 + 0.3 * minute / 60)
    box.clock.now_s = T0 + 3600
    await box.warning.start()
    assert box.warning.running
    try:
        for _ in range(500):
            if box.warning.last is not None:
                break
            await asyncio.sleep(0.01)
    finally:
        await box.warning.stop()
    assert not box.warning.running
    assert box.warning.last is not None and box.warning.last.rows == 61
    assert box.kinds() == ["oom_precursor"]
