"""The SLO service: live counting (fake clock, scripted readiness) and availability from a
real SQLite state store, across rollups and daemon restarts."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from appliance.config import parse_config
from appliance.services.events import Event
from appliance.services.metric_history import HistorySampler
from appliance.services.slo import SloHistory, SloMeter, mark_clean_stop, previous_run_crashed
from appliance.services.store import StateStore


class Script:
    """A clock and a readiness reason the test moves by hand."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.reason = "stopped"

    def clock(self) -> float:
        return self.now_s


def _meter(script: Script, after_crash: bool = False) -> tuple[SloMeter, CollectorRegistry]:
    registry = CollectorRegistry()
    return SloMeter(registry, lambda: script.reason, after_crash, clock=script.clock), registry


def _state(meter: SloMeter, script: Script, reason: str, at_s: float) -> None:
    """The supervisor changes state at at_s and emits its event."""
    script.now_s, script.reason = at_s, reason
    meter.on_event(Event(1, at_s, "engine_state", "", {"state": reason}))


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    assert value is not None, (name, labels)
    return value


def test_every_label_set_exists_at_zero() -> None:
    _, registry = _meter(Script())
    for outcome in ("good", "bad", "excluded"):
        assert _value(registry, "appliance_slo_requests_total", outcome=outcome) == 0
    for state in ("up", "down", "excluded"):
        assert _value(registry, "appliance_slo_ready_seconds_total", state=state) == 0


def test_planned_boot_restart_and_pause_count_no_down_time() -> None:
    s = Script()
    meter, registry = _meter(s)
    _state(meter, s, "starting", 0.0)
    _state(meter, s, "ready", 40.0)  # boot: 40 s excluded
    _state(meter, s, "restarting", 100.0)  # 60 s up
    _state(meter, s, "ready", 130.0)  # graceful restart: 30 s excluded
    _state(meter, s, "paused", 200.0)  # 70 s up
    _state(meter, s, "ready", 260.0)  # paused 60 s
    s.now_s = 300.0
    totals = meter.totals()
    assert totals.up_s == pytest.approx(170.0) and totals.down_s == 0
    assert _value(registry, "appliance_slo_ready_seconds_total", state="excluded") == 130.0
    assert _value(registry, "appliance_slo_ready_seconds_total", state="up") == 170.0


def test_a_crash_a_failing_restart_and_protect_count_as_down() -> None:
    s = Script()
    meter, registry = _meter(s)
    _state(meter, s, "ready", 0.0)
    _state(meter, s, "engine_dead", 10.0)
    _state(meter, s, "ready", 25.0)  # 15 s down
    _state(meter, s, "restarting", 30.0)
    s.now_s = 35.0  # the new engine fails to start: unplanned from here on
    meter.on_event(Event(2, 35.0, "engine_start_failed", "", {}))
    _state(meter, s, "ready", 45.0)  # 10 s down
    s.now_s, s.reason = 50.0, "protect"
    meter.on_event(Event(3, 50.0, "thermal", "", {"level": "protect"}))
    s.now_s, s.reason = 58.0, "ready"
    meter.on_event(Event(4, 58.0, "thermal", "", {"level": "normal"}))  # 8 s down
    s.now_s = 60.0
    assert meter.totals().down_s == pytest.approx(33.0)
    assert meter.totals().up_s == pytest.approx(22.0)
    assert _value(registry, "appliance_slo_ready_seconds_total", state="down") == 33.0


def test_a_start_after_a_crashed_run_is_down_until_ready() -> None:
    s = Script()
    meter, _ = _meter(s, after_crash=True)
    _state(meter, s, "starting", 0.0)
    _state(meter, s, "ready", 50.0)
    _state(meter, s, "restarting", 60.0)  # a later graceful restart is planned again
    _state(meter, s, "ready", 70.0)
    assert meter.totals().down_s == 50.0 and meter.totals().up_s == 10.0


def test_a_503_is_bad_only_when_nobody_planned_it() -> None:
    s = Script()
    meter, registry = _meter(s)
    _state(meter, s, "ready", 0.0)
    assert meter.record_request("ok") == "good"
    assert meter.record_request("rejected") == "excluded"
    _state(meter, s, "paused", 1.0)
    assert meter.record_request("not_ready") == "excluded"
    _state(meter, s, "engine_dead", 2.0)
    assert meter.record_request("not_ready") == "bad"
    assert meter.record_request("error") == "bad"
    assert _value(registry, "appliance_slo_requests_total", outcome="bad") == 2
    assert meter.totals().good == 1 and meter.totals().bad == 2


def test_rows_carry_the_amounts_since_the_previous_row() -> None:
    s = Script()
    meter, _ = _meter(s)
    _state(meter, s, "ready", 0.0)
    meter.record_request("ok")
    s.now_s = 5.0
    assert meter.row_fields() == {"slo_good": 1, "slo_bad": 0, "slo_up_s": 5.0, "slo_down_s": 0}
    meter.record_request("error")
    s.now_s = 10.0
    assert meter.row_fields() == {"slo_good": 0, "slo_bad": 1, "slo_up_s": 5.0, "slo_down_s": 0}


def test_the_run_marker_tells_a_crash_from_a_clean_stop(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "appliance.db")
    assert previous_run_crashed(store) is False  # a fresh box
    assert previous_run_crashed(store) is True  # the last run never stopped cleanly
    mark_clean_stop(store)
    assert previous_run_crashed(store) is False
    store.close()


DAY = 86400.0


def test_history_windows_sum_rows_across_rollups_and_restarts(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "appliance.db")
    now = 100 * DAY
    rows = [
        # 20 days ago, as hours: one bad day (a crash and its down time)
        (
            now - 20 * DAY,
            3600,
            {"slo_good": 9000, "slo_bad": 10, "slo_up_s": 3500, "slo_down_s": 100},
        ),
        # 3 days ago, as minutes
        (now - 3 * DAY, 60, {"slo_good": 1000, "slo_bad": 0, "slo_up_s": 60, "slo_down_s": 0}),
        # today, raw rows of two daemon runs (each run's amounts start from its own zero)
        (now - 600, 0, {"slo_good": 500, "slo_bad": 0, "slo_up_s": 5, "slo_down_s": 0}),
        (now - 300, 0, {"slo_good": 499, "slo_bad": 1, "slo_up_s": 5, "slo_down_s": 0}),
        (now - 40 * DAY, 3600, {"slo_good": 0, "slo_bad": 1000, "slo_up_s": 0, "slo_down_s": 3600}),
    ]
    for ts, res, data in rows:
        store.add_metric_sample(ts, res, data)
    history = SloHistory(store, clock=lambda: now)
    history.refresh()
    snap = history.snapshot()
    day, week, month = (snap["windows"][w] for w in ("1d", "7d", "30d"))
    assert (day["good"], day["bad"]) == (999, 1) and day["ratio"] == pytest.approx(0.999)
    assert week["good"] == 1999 and week["ratio"] == pytest.approx(1999 / 2000)
    # 30 d: requests 10999/11010, time 3570/3670; the 40-day-old outage is outside.
    expected = (10999 / 11010) * (3570 / 3670)
    assert month["ratio"] == pytest.approx(expected)
    assert snap["budget"]["remaining_ratio"] == pytest.approx(1 - (1 - expected) / 0.001)
    gauges = {
        s.labels.get("window", "budget"): s.value
        for family in history.collect()
        for s in family.samples
    }
    assert gauges["30d"] == pytest.approx(expected) and gauges["budget"] < 0
    store.close()


def test_no_history_is_no_data_and_a_whole_budget(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "appliance.db")
    history = SloHistory(store, clock=lambda: 1000.0)
    snap = history.snapshot()
    assert snap["windows"]["1d"]["ratio"] is None and snap["budget"]["remaining_ratio"] == 1.0
    values = [s.value for family in history.collect() for s in family.samples]
    assert math.isnan(values[0]) and values[-1] == 1.0
    store.close()


def test_the_sampler_stores_the_amounts_and_refreshes_availability(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "appliance.db")
    s = Script()
    meter, _ = _meter(s)
    _state(meter, s, "ready", 0.0)
    history = SloHistory(store, clock=lambda: 1000.0)
    cfg = parse_config({}).maintenance
    sampler = HistorySampler(
        store, meter.row_fields, cfg, clock=lambda: 990.0, after_sample=history.refresh
    )
    meter.record_request("ok")
    meter.record_request("error")
    s.now_s = 5.0
    sampler.sample_once()
    day = history.snapshot()["windows"]["1d"]
    assert (day["good"], day["bad"], day["up_s"]) == (1, 1, 5.0)
    assert day["ratio"] == pytest.approx(0.5)
    store.close()


def test_status_and_tui_lines_show_every_window_and_the_budget() -> None:
    from appliance.commands.status import availability_line
    from tui.widgets.engine_panel import availability_line as tui_line

    avail = {
        "objective": 0.999,
        "windows": {"1d": {"ratio": 0.99962}, "7d": {"ratio": None}, "30d": {"ratio": 0.9998}},
        "budget": {"remaining_ratio": -0.5},
    }
    line = availability_line(avail)
    assert "1d 99.962 %" in line and "7d n/a" in line and "30d 99.980 %" in line
    assert "budget left -50.0 % of 30 d (objective 99.9 %)" in line
    assert "n/a" in availability_line(None)
    assert tui_line(avail) == "avail 1d 99.96%  7d n/a\n      30d 99.98%  budget [bold red]-50%[/]"
    assert tui_line(None) == "avail n/a"
