"""The maintenance jobs' own logic: re-benchmark comparison and ceiling, the recalibration
event and rollback, and the restart job's growth threshold."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psutil
import pytest

from appliance.domain.threshold_fit import Bounds, Thresholds
from appliance.services.events import Event, EventBus
from appliance.services.process_memory import EngineRssBaseline
from appliance.services.store import StateStore
from maintenance import rebenchmark as rebench_mod
from maintenance.recalibrate import recalibrate_thresholds, rollback_thresholds
from maintenance.restart import defrag_restart

CURRENT = Thresholds(
    derate_core_c=85,
    protect_mem_c=95,
    slo_ttft_p99_s=5,
    slo_tpot_p99_s=0.5,
    alert_ttft_p99_s=7.5,
    alert_queue_depth=128,
)


def _bench(tok_s: float, knee: int | None) -> dict[str, Any]:
    return {"levels": [{"point": {"output_tok_s": tok_s}}], "knee_limit": knee}


class _Level:
    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency


class _Report:
    def __init__(self, tok_s: float, knee: int | None, still_rising: bool = False) -> None:
        self._d = _bench(tok_s, knee)
        self.knee_limit = knee
        self.lifts_ceiling = still_rising
        self.levels = [_Level(c) for c in (8, 16, 32)]

    def to_dict(self) -> dict[str, Any]:
        return self._d


class _Ceiling:
    """Records what the job did to the controller's ceiling."""

    def __init__(self) -> None:
        self.calls: list[int | None] = []

    def set_ceiling(self, limit: int, source: str) -> None:
        self.calls.append(limit)

    def clear_ceiling(self, source: str) -> None:
        assert "still rising at 32" in source
        self.calls.append(None)


PLAN = rebench_mod.RebenchPlan(
    mode="tuning", concurrency=(1, 2), max_concurrency=32, requests_per_level=1, max_tokens=4
)


async def _rebench(
    store, events, monkeypatch, tok_s, knee, ceiling, still_rising=False, plan=PLAN
) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def fake_tuning(settings, slo=None, max_concurrency=256, max_limit=256, weights=None):
        seen.update(settings=settings, max_concurrency=max_concurrency)
        return _Report(tok_s, knee, still_rising)

    async def fake_sweep(settings, slo=None, weights=None):
        seen.update(settings=settings, sweep=True)
        return _Report(tok_s, knee, still_rising)

    monkeypatch.setattr(rebench_mod, "run_tuning", fake_tuning)
    monkeypatch.setattr(rebench_mod, "run_sweep", fake_sweep)
    out = await rebench_mod.rebenchmark(
        "http://127.0.0.1:1",
        "token",
        store,
        events,
        plan=plan,
        regression_ratio=0.1,
        ceiling=ceiling,
    )
    # Either way the run may reach the engine's max_num_seqs, never more.
    assert seen["settings"].extend_to == 32
    assert seen.get("max_concurrency", 32) == 32
    return out


async def test_rebenchmark_regression_event_and_ceiling(tmp_path: Path, monkeypatch):
    store, events, ceiling = StateStore(tmp_path / "b.db"), EventBus(), _Ceiling()
    first = await _rebench(store, events, monkeypatch, 100.0, 8, ceiling)
    assert "regression" not in first and ceiling.calls == [8] and first["ceiling_set"] == 8
    assert first["mode"] == "tuning" and first["levels"] == [8, 16, 32]
    # 5 % slower: within regression_ratio 0.1, no event.
    within = await _rebench(store, events, monkeypatch, 95.0, 8, ceiling)
    assert "regression" not in within and within["previous_best_output_tok_s"] == 100.0
    assert "benchmark_regression" not in [e.kind for e in events.recent()]
    # 30 % below the previous run: an event naming both figures.
    slow = await _rebench(store, events, monkeypatch, 66.5, None, ceiling)
    assert slow["regression"] is True and slow["previous_best_output_tok_s"] == 95.0
    (ev,) = [e for e in events.recent() if e.kind == "benchmark_regression"]
    assert ev.data == {"before": 95.0, "now": 66.5} and "30%" in ev.reason
    # A sweep without a knee (capped by the daemon's limit) leaves the ceiling alone.
    assert ceiling.calls == [8, 8] and "ceiling_set" not in slow
    assert [b["result"]["knee_limit"] for b in store.benchmarks()] == [None, 8, 8]


async def test_rebenchmark_still_rising_lifts_the_ceiling(tmp_path: Path, monkeypatch):
    store, events, ceiling = StateStore(tmp_path / "b.db"), EventBus(), _Ceiling()
    await _rebench(store, events, monkeypatch, 100.0, 16, ceiling)
    rising = await _rebench(store, events, monkeypatch, 180.0, None, ceiling, still_rising=True)
    # The old ceiling of 16 would cap a box still scaling at 32: it goes, none replaces it.
    assert ceiling.calls == [16, None]
    assert rising["ceiling_set"] is None and rising["still_rising"] is True


async def test_rebenchmark_sweep_mode_runs_the_configured_levels(tmp_path: Path, monkeypatch):
    store, events, ceiling = StateStore(tmp_path / "b.db"), EventBus(), _Ceiling()
    plan = rebench_mod.RebenchPlan("sweep", (1, 2, 4), 32, 1, 4)
    out = await _rebench(store, events, monkeypatch, 50.0, 4, ceiling, plan=plan)
    assert out["mode"] == "sweep" and ceiling.calls == [4]


async def test_recalibration_event_carries_the_diff_and_keeps_config_for_rollback(
    tmp_path: Path,
):
    store, events, applied = StateStore(tmp_path / "r.db"), EventBus(), []
    rules = tmp_path / "rules.yml"
    rows = [{"core_temp_c_max": 70.0, "ttft_p99_s": 1.0} for _ in range(40)]
    out = await recalibrate_thresholds(
        store, lambda since: rows, CURRENT, Bounds(), events, rules, applied.append
    )
    (ev,) = [e for e in events.recent() if e.kind == "recalibrated"]
    assert ev.data["changes"]["derate_core_c"] == [85.0, 73.0]
    assert ev.data["changes"]["slo_ttft_p99_s"] == [5.0, 1.25]
    assert "derate_core_c 85 -> 73" in ev.reason and "from 40 samples" in ev.reason
    assert out["changes"] == ev.data["changes"]
    assert applied[-1].derate_core_c == 73.0 and "> 73" in rules.read_text()
    # The configured values were stored first, so there is a set to roll back to.
    sets = store.thresholds()
    assert [(t["source"], t["state"]) for t in sets] == [
        ("recalibration", "active"),
        ("config", "previous"),
    ]
    assert sets[1]["data"] == CURRENT.to_dict()

    back = rollback_thresholds(store, applied[-1], events, rules, applied.append)
    assert back is not None and applied[-1] == CURRENT
    assert back["changes"]["derate_core_c"] == [73.0, 85.0]
    assert "> 85" in rules.read_text()
    (rb,) = [e for e in events.recent() if e.kind == "thresholds_rolled_back"]
    assert rb.data["changes"] == back["changes"] and rb.data["restored_id"] == sets[1]["id"]
    assert rollback_thresholds(store, CURRENT, events, rules, applied.append) is None


class _Engine:
    def __init__(self, pids: list[int]) -> None:
        self.pids = pids

    def child_pids(self) -> list[int]:
        return self.pids


class _Supervisor:
    def __init__(self, pids: list[int]) -> None:
        self.engine = _Engine(pids)
        self.restarts = 0

    async def restart(self, reason: str, *, cause: str) -> float:
        self.restarts += 1
        return 0.5


def _rss() -> int:
    return psutil.Process(os.getpid()).memory_info().rss


async def test_restart_growth_threshold():
    sup = _Supervisor([os.getpid()])  # this process stands in for the engine's
    # Grown ~5 % since the baseline: under 20 %, no restart, and the details say why.
    out = await defrag_restart(
        sup,
        list,
        min_growth_ratio=0.2,
        baseline_engine_rss_bytes=int(_rss() / 1.05),
        baseline_source="the engine's start",
    )
    assert out["restarted"] is False and sup.restarts == 0
    assert out["growth_ratio"] == pytest.approx(0.05, abs=0.03)
    assert "below restart_min_growth_ratio 20%" in out["why"]
    assert "the engine's start" in out["why"]
    # Doubled: restart, with the growth recorded.
    out = await defrag_restart(
        sup,
        list,
        min_growth_ratio=0.2,
        baseline_engine_rss_bytes=_rss() // 2,
        baseline_source="the engine's start",
    )
    assert out["restarted"] is True and sup.restarts == 1
    assert out["growth_ratio"] == pytest.approx(1.0, abs=0.1) and "after" in out
    # Threshold 0: always restart, no growth check in the details.
    out = await defrag_restart(sup, list, min_growth_ratio=0, baseline_engine_rss_bytes=None)
    assert out["restarted"] is True and "why" not in out


async def test_restart_without_a_baseline_says_so():
    sup = _Supervisor([os.getpid()])
    out = await defrag_restart(sup, list, min_growth_ratio=0.2, baseline_engine_rss_bytes=None)
    assert out["restarted"] is True and "no baseline" in out["why"]
    assert out["baseline_engine_rss_bytes"] is None
    # An engine whose processes cannot be seen: growth unknown, also said.
    blind = _Supervisor([])
    out = await defrag_restart(blind, list, min_growth_ratio=0.2, baseline_engine_rss_bytes=10)
    assert out["restarted"] is True and "not measurable" in out["why"]


def test_rss_baseline_follows_engine_starts():
    figures = iter([0, 1000, 2000])
    baseline = EngineRssBaseline(lambda: next(figures))
    baseline.take()
    assert baseline.rss_bytes is None  # 0: nothing seen is no baseline
    baseline.on_event(Event(1, 0.0, "engine_state", "x"))
    assert baseline.rss_bytes is None
    baseline.on_event(Event(2, 0.0, "engine_started", "engine started"))
    assert baseline.rss_bytes == 1000
    baseline.on_event(Event(3, 0.0, "engine_started", "engine started"))
    assert baseline.rss_bytes == 2000 and baseline.taken_s
