"""Recalibration maths, history rollups, and a store that survives being killed."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.config.maintenance import MaintenanceConfig
from appliance.domain.history import is_peak_field, rollup
from appliance.domain.latency_window import percentile
from appliance.domain.threshold_fit import (
    MIN_SAMPLES,
    Bounds,
    Thresholds,
    recalibrate,
    weighted_percentile,
)
from appliance.services.metric_history import HOUR, MINUTE, RAW, HistorySampler
from appliance.services.store import StateStore

CURRENT = Thresholds(
    derate_core_c=85,
    protect_mem_c=95,
    slo_ttft_p99_s=5,
    slo_tpot_p99_s=0.5,
    alert_ttft_p99_s=7.5,
    alert_queue_depth=128,
)


def _rows(n: int, **cols) -> list[dict]:
    return [{k: (v(i) if callable(v) else v) for k, v in cols.items()} for i in range(n)]


def test_empty_history_changes_nothing():
    r = recalibrate(CURRENT, [])
    assert r.thresholds == CURRENT and r.changes == {} and len(r.notes) == 5


def test_tiny_history_keeps_current_values():
    r = recalibrate(CURRENT, _rows(MIN_SAMPLES - 1, core_temp_c_max=60, ttft_p99_s=0.1))
    assert r.thresholds.derate_core_c == 85 and r.thresholds.slo_ttft_p99_s == 5


def test_values_follow_the_history_percentiles():
    rows = _rows(
        100,
        core_temp_c_max=lambda i: 70 + i * 0.1,
        mem_temp_c_max=80,
        ttft_p99_s=lambda i: 1 + i / 100,
        tpot_p99_s=0.1,
        queued=lambda i: i % 5,
    )
    r = recalibrate(CURRENT, rows)
    t = r.thresholds
    assert t.derate_core_c == pytest.approx(70 + 9.801 + 3, abs=0.05)  # p99 + 3
    assert t.protect_mem_c == 85.0  # p99 80 + 5
    assert t.slo_ttft_p99_s == pytest.approx((1 + 0.9405) * 1.25, abs=1e-3)  # p95 x 1.25
    assert t.alert_ttft_p99_s == pytest.approx(t.slo_ttft_p99_s * 1.5, abs=1e-3)
    assert t.alert_queue_depth == 8.0  # p99 of 0..4 = 4, x2
    assert set(r.changes) >= {"derate_core_c", "slo_ttft_p99_s"}


def test_clamped_to_the_hardware_bounds_and_derated_samples_ignored():
    hot = _rows(50, core_temp_c_max=99, mem_temp_c_max=120)
    r = recalibrate(CURRENT, hot, Bounds(max_core_c=90, max_mem_c=100))
    assert r.thresholds.derate_core_c == 90 and r.thresholds.protect_mem_c == 100
    cold = _rows(50, core_temp_c_max=20)
    assert recalibrate(CURRENT, cold).thresholds.derate_core_c == Bounds().min_core_c
    # Samples taken while derated are the hot tail being controlled, not normal running.
    derated = _rows(50, core_temp_c_max=89, derated=1)
    assert recalibrate(CURRENT, derated).thresholds.derate_core_c == 85


def test_hardware_limit_wins_over_the_lower_bound():
    # The operator's hardware limit (65 °C core, 75 °C HBM) is below the default lower bounds
    # (70, 80): recalibration must never go above the hardware limits.
    hot = _rows(50, core_temp_c_max=99, mem_temp_c_max=120)
    cold = _rows(50, core_temp_c_max=20, mem_temp_c_max=20)
    for rows in (hot, cold):
        r = recalibrate(CURRENT, rows, Bounds(max_core_c=65, max_mem_c=75))
        assert r.thresholds.derate_core_c == 65 and r.thresholds.protect_mem_c == 75
        assert any("limit wins" in n for n in r.notes)


def test_rows_count_for_the_time_they_cover():
    # A quarter: ~90 days of hourly rollups (720 raw samples each) at a steady 60 °C and
    # 0.5 s TTFT, then six hot, slow hours of raw samples. Row for row those hours dominate;
    # weighted by time they are 0.3 % of the quarter and must not set the percentiles.
    hours = [
        {"n": 720, "core_temp_c_max": 60.0, "ttft_p99_s": 0.5, "queued": 1} for _ in range(2160)
    ]
    hot = [{"core_temp_c_max": 88.0, "ttft_p99_s": 4.0, "queued": 50} for _ in range(4320)]
    r = recalibrate(CURRENT, hours + hot)
    t = r.thresholds
    assert t.derate_core_c == Bounds().min_core_c  # p99 60 + 3, clamped to the lower bound 70
    assert t.slo_ttft_p99_s == pytest.approx(0.5 * 1.25)
    assert t.alert_queue_depth == 2.0
    # Unweighted, the raw day would have set them.
    unweighted = recalibrate(
        CURRENT, [{k: v for k, v in h.items() if k != "n"} for h in hours] + hot
    )
    assert unweighted.thresholds.derate_core_c == 90.0
    assert unweighted.thresholds.slo_ttft_p99_s == pytest.approx(5.0)


@given(st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=1, max_size=60))
def test_weighted_percentile_with_unit_weights_is_the_percentile(values):
    for q in (0, 50, 95, 99, 100):
        got = weighted_percentile([(v, 1.0) for v in values], q)
        assert got == pytest.approx(percentile(values, q), rel=1e-9, abs=1e-6)


@given(
    st.lists(
        st.tuples(st.floats(min_value=-1e3, max_value=1e3), st.integers(1, 20)),
        min_size=1,
        max_size=30,
    )
)
def test_weighted_percentile_equals_the_expanded_list(pairs):
    expanded = [v for v, w in pairs for _ in range(w)]
    for q in (0, 50, 95, 99, 100):
        got = weighted_percentile([(v, float(w)) for v, w in pairs], q)
        assert got == pytest.approx(percentile(expanded, q), rel=1e-9, abs=1e-6)


def test_weighted_percentile_rejects_nothing_to_rank():
    with pytest.raises(ValueError):
        weighted_percentile([], 50)
    with pytest.raises(ValueError):
        weighted_percentile([(1.0, 0.0)], 50)
    with pytest.raises(ValueError):
        weighted_percentile([(1.0, 1.0)], 101)


def test_rollups_keep_latency_spikes():
    # One slow minute in an hour: averaging p99s would report ~0.15 s and hide it.
    minutes = [(i * 60.0, {"n": 12, "ttft_p99_s": 0.1, "ttft_p50_s": 0.05}) for i in range(59)]
    minutes.append((59 * 60.0, {"n": 12, "ttft_p99_s": 3.0, "ttft_p50_s": 0.05}))
    ((_, hour),) = rollup(minutes, 3600)
    assert hour["ttft_p99_s"] == 3.0 and hour["n"] == 720
    assert hour["ttft_p50_s"] == pytest.approx(0.05)  # a median is still averaged
    assert is_peak_field("tpot_p99_s") and is_peak_field("core_temp_c_max")
    assert not is_peak_field("ttft_p50_s") and not is_peak_field("queued")


def test_history_rows_carry_their_weight(tmp_path: Path):
    store = StateStore(tmp_path / "w.db")
    sampler = HistorySampler(store, dict, MaintenanceConfig())
    store.add_metric_sample(100.0, RAW, {"queued": 1})
    store.add_metric_sample(0.0, MINUTE, {"n": 12, "queued": 2})
    rows = sampler.history(0.0)
    assert [(r["resolution_s"], r["n"]) for r in rows] == [(MINUTE, 12), (RAW, 1)]


@given(st.lists(st.floats(min_value=-50, max_value=200), min_size=MIN_SAMPLES, max_size=200))
def test_thermal_thresholds_always_within_bounds(temps):
    b = Bounds()
    t = recalibrate(CURRENT, [{"core_temp_c_max": x, "mem_temp_c_max": x} for x in temps], b)
    assert b.min_core_c <= t.thresholds.derate_core_c <= b.max_core_c
    assert b.min_mem_c <= t.thresholds.protect_mem_c <= b.max_mem_c


def test_rollup_averages_keeps_max_and_weights():
    samples = [
        (0.0, {"a": 1.0, "t_max": 5}),
        (30.0, {"a": 3.0, "t_max": 9}),
        (60.0, {"a": 10.0, "t_max": 1}),
        (61.0, {"flag": "x"}),
    ]
    out = rollup(samples, 60)
    assert out[0] == (0, {"n": 2.0, "a": 2.0, "t_max": 9})
    assert out[1][1]["a"] == 10.0 and out[1][1]["n"] == 2.0
    # rolling a rollup up again weights by n
    twice = rollup([(0.0, {"n": 3, "a": 1.0}), (10.0, {"n": 1, "a": 5.0})], 3600)
    assert twice[0][1]["a"] == 2.0 and twice[0][1]["n"] == 4
    with pytest.raises(ValueError):
        rollup(samples, 0)


def test_history_compaction_bounds_the_database(tmp_path: Path):
    store = StateStore(tmp_path / "h.db")
    cfg = MaintenanceConfig(
        history_raw_keep_s=3600, history_minute_keep_s=86400, history_hour_keep_s=30 * 86400
    )
    now = [0.0]
    sampler = HistorySampler(
        store, lambda: {"in_flight": 3, "core_temp_c_max": 60.0}, cfg, clock=lambda: now[0]
    )
    # Two days of 5 s samples, compacting as the daemon does.
    start = 1_800_000_000.0
    for i in range(0, 2 * 86400, 5):
        now[0] = start + i
        store.add_metric_sample(now[0], RAW, {"in_flight": i % 7, "core_temp_c_max": 50 + i % 9})
        if i % 3600 == 0:
            sampler.compact(now[0])
    sampler.compact(now[0])
    counts = store.count_metric_samples()
    assert counts[RAW] <= (3600 + 60) / 5 + 1  # whole minute buckets only are rolled
    assert 0 < counts.get(MINUTE, 0) <= 86400 / 60 + 1
    assert counts.get(HOUR, 0) >= 20
    rows = sampler.history(start)
    assert rows[0]["ts_s"] < rows[-1]["ts_s"] and "core_temp_c_max" in rows[-1]
    # A year at this rate: raw 1 day + minutes 30 days + hours 400 days stays small.
    assert os.path.getsize(tmp_path / "h.db") < 5_000_000


def test_killed_writer_leaves_a_consistent_database(tmp_path: Path):
    db = tmp_path / "k.db"
    script = textwrap.dedent(f"""
        import time
        from appliance.services.store import StateStore
        s = StateStore(__import__("pathlib").Path({str(db)!r}))
        run = s.start_job_run("restart", "schedule")
        print("ready", flush=True)
        i = 0
        while True:
            s.add_event(time.time(), "k", "r", {{"i": i}})
            s.add_metric_sample(time.time() + i, 0, {{"i": i}})
            i += 1
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with sqlite3.connect(db) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        n_events = raw.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    assert n_events > 10
    store = StateStore(db)  # a restart closes the run the killed daemon left open
    run = store.job_runs("restart")[0]
    assert run.outcome == "interrupted" and run.ended_s is not None


def test_thresholds_keep_the_previous_set_for_rollback(tmp_path: Path):
    store = StateStore(tmp_path / "t.db")
    assert store.active_thresholds() is None and store.rollback_thresholds() is None
    store.save_thresholds("config", {"derate_core_c": 85})
    store.save_thresholds("recalibration", {"derate_core_c": 82})
    assert [t["active"] for t in store.thresholds()] == [True, False]
    restored = store.rollback_thresholds()
    assert restored is not None and restored["data"] == {"derate_core_c": 85}
    assert restored["source"] == "config" and restored["state"] == "active"
    assert store.active_thresholds()["data"] == {"derate_core_c": 85}
    # The rolled-back set stays on record but is never a rollback target again.
    assert [t["state"] for t in store.thresholds()] == ["rolled_back", "active"]
    assert store.rollback_thresholds() is None
    store.save_thresholds("recalibration", {"derate_core_c": 80})
    assert store.rollback_thresholds()["data"] == {"derate_core_c": 85}
    assert [t["state"] for t in store.thresholds()] == ["rolled_back", "rolled_back", "active"]
    # The active set is found however many sets were stored after it.
    for i in range(12):
        store.save_thresholds("recalibration", {"derate_core_c": 70 + i})
        store.rollback_thresholds()
    assert store.active_thresholds()["data"] == {"derate_core_c": 85}


def test_rendered_rules_pass_promtool(tmp_path: Path):
    import shutil

    from maintenance.recalibrate import render_rules

    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: apt-get install prometheus (make test does)"
    path = tmp_path / "rules.yml"
    path.write_text(render_rules(CURRENT))
    out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "> 85" in path.read_text()
