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


class _Report:
    def __init__(self, tok_s: float, knee: int | None) -> None:
        self._d = _bench(tok_s, knee)
        self.knee_limit = knee

    def to_dict(self) -> dict[str, Any]:
        return self._d


async def _rebench(store, events, monkeypatch, tok_s, knee, ceilings) -> dict[str, Any]:
    async def fake_sweep(settings, slo=None, weights=None):
        return _Report(tok_s, knee)

    monkeypatch.setattr(rebench_mod, "run_sweep", fake_sweep)
    return await rebench_mod.rebenchmark(
        "http://127.0.0.1:1",
        "token",
        store,
        events,
        concurrency=(1, 2),
        requests_per_level=1,
        max_tokens=4,
        regression_ratio=0.1,
        set_ceiling=ceilings.append,
    )


async def test_rebenchmark_regression_event_and_ceiling(tmp_path: Path, monkeypatch):
    store, events, ceilings = StateStore(tmp_path / "b.db"), EventBus(), []
    first = await _rebench(store, events, monkeypatch, 100.0, 8, ceilings)
    assert "regression" not in first and ceilings == [8] and first["ceiling_set"] == 8
    # 5 % slower: within regression_ratio 0.1, no event.
    within = await _rebench(store, events, monkeypatch, 95.0, 8, ceilings)
    assert "regression" not in within and within["previous_best_output_tok_s"] == 100.0
    assert "benchmark_regression" not in [e.kind for e in events.recent()]
    # 30 % below the previous run: an event naming both figures.
    slow = await _rebench(store, events, monkeypatch, 66.5, None, ceilings)
    assert slow["regression"] is True and slow["previous_best_output_tok_s"] == 95.0
    (ev,) = [e for e in events.recent() if e.kind == "benchmark_regression"]
    assert ev.data == {"before": 95.0, "now": 66.5} and "30%" in ev.reason
    # A sweep without a knee leaves the ceiling alone.
    assert ceilings == [8, 8] and "ceiling_set" not in slow
    assert [b["result"]["knee_limit"] for b in store.benchmarks()] == [None, 8, 8]


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
