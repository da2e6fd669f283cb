"""SVG snapshots of the main screens, fed a fixed status through a stub of the client."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from textual.pilot import Pilot

from tui.app import ApplianceTui, build_app

T0 = 1_700_000_000.0  # fixed wall clock: snapshots must not depend on when they run

GPU = {
    "index": 0,
    "name": "Simulated GPU (SIMULATED)",
    "core_temp_c": 71.0,
    "mem_temp_c": 78.0,
    "slowdown_temp_c": 90.0,
    "mem_max_temp_c": 95.0,
    "power_w": 410.0,
    "power_limit_w": 700.0,
    "sm_clock_mhz": 1830,
    "mem_clock_mhz": 2619,
    "gpu_util_pct": 64.0,
    "mem_used_bytes": 60 * 2**30,
    "mem_total_bytes": 80 * 2**30,
    "throttle_reasons": [],
    "lost": False,
}

STATUS: dict[str, Any] = {
    "time_s": T0,
    "engine": {
        "state": "ready",
        "model": "SmolLM2-135M-Instruct",
        "stats": {"running": 3, "waiting": 1, "kv_cache_usage_ratio": 0.42},
    },
    "admission": {
        "limit": 6,
        "base_limit": 8,
        "in_flight": 4,
        "protect": False,
        "queued": {"realtime": 0, "interactive": 2, "batch": 1},
        "running": {"realtime": 1, "interactive": 3, "batch": 0},
    },
    "config": {"queue_capacity": {"realtime": 16, "interactive": 128, "batch": 2}},
    "controller": {
        "mode": "auto",
        "limit": 8,
        "min": 1,
        "max": 32,
        "decisions": [
            {"ts_s": T0 - 30, "limit": 10, "reason": "p99 TTFT 2.1 s > 1.5 s: down to 8"},
            {"ts_s": T0 - 10, "limit": 8, "reason": "derate x0.75: effective 6"},
        ],
    },
    "latency": {"ttft_p50_s": 0.21, "ttft_p99_s": 0.93, "tpot_p50_s": 0.031, "tpot_p99_s": 0.07},
    "availability": {
        "objective": 0.999,
        "windows": {"1d": {"ratio": 0.99962}, "7d": {"ratio": 0.99991}, "30d": {"ratio": 0.99978}},
        "budget": {"remaining_ratio": 0.78},
    },
    "telemetry": {
        "simulated": True,
        "gpus": [GPU],
        "thermal": {"level": "derate", "factor": 0.75},
    },
    "events": [
        {"seq": 1, "ts_s": T0 - 60, "kind": "engine_state", "reason": "engine ready", "data": {}},
        {
            "seq": 2,
            "ts_s": T0 - 20,
            "kind": "thermal",
            "reason": "gpu0 core 86.0 °C vs derate 85.0 °C: derate",
            "data": {"level": "derate"},
        },
        {"seq": 3, "ts_s": T0 - 5, "kind": "job_run", "reason": "restart ok", "data": {}},
    ],
}

JOBS = {
    "jobs": [
        {
            "name": "restart",
            "schedule": "cron 03:00",
            "next_run_s": T0 + 3600,
            # Newest first, as the daemon sends it (StateStore.job_runs: ORDER BY id DESC).
            "history": [
                {"started_s": T0 - 600, "trigger": "manual", "outcome": "ok"},
                {
                    "started_s": T0 - 86400,
                    "trigger": "schedule",
                    "outcome": "failed",
                    "error": "engine busy",
                },
            ],
        },
        {
            "name": "rebenchmark",
            "schedule": "weekly sun 04:00",
            "next_run_s": T0 + 86400,
            "history": [
                {"started_s": T0 - 7200, "trigger": "schedule", "outcome": "skipped"},
            ],
        },
    ]
}


def _point(c: int, tok: float, p99: float) -> dict[str, Any]:
    return {"concurrency": c, "output_tok_s": tok, "ttft_p99_s": p99, "request_per_s": c / 2}


BENCH = {
    "benchmarks": [
        {
            "id": 2,
            "ts_s": T0 - 3600,
            "source": "rebench",
            "result": {
                "points": [
                    _point(1, 40, 0.1),
                    _point(2, 75, 0.12),
                    _point(4, 130, 0.2),
                    _point(8, 190, 0.5),
                    _point(16, 200, 1.9),
                ],
                "knee": {"concurrency": 8, "reason": "throughput +5 % for 2x concurrency"},
                "pareto": [1, 2, 4, 8],
                "scores": {
                    "scores": [{"concurrency": 8, "score": 0.81}, {"concurrency": 4, "score": 0.74}]
                },
                "recommended_limit": 8,
            },
        },
        {"id": 1, "ts_s": T0 - 90000, "source": "cli", "result": {"points": [], "knee": {}}},
    ]
}


USAGE = {
    "from": "2026-11-28",
    "to": "2026-12-04",
    "keys": [
        {
            "key": "chat-app",
            "requests": 1840,
            "answered": 1822,
            "prompt_tokens": 412000,
            "completion_tokens": 150300,
            "by_status": {"ok": 1800, "deadline": 22, "rate_limited": 18},
        },
        {
            "key": "nightly-batch",
            "requests": 310,
            "answered": 306,
            "prompt_tokens": 980000,
            "completion_tokens": 61000,
            "by_status": {"ok": 306, "forbidden": 4},
        },
        {
            "key": "-",
            "requests": 3,
            "answered": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "by_status": {"unauthorized": 3},
        },
    ],
    "days": [],
}
KEYS = {
    "open": False,
    "keys": [
        {
            "name": "chat-app",
            "lanes": ["interactive", "batch"],
            "requests_per_min": 120,
            "tokens_per_min": 60000,
            "concurrency_share": 0.5,
            "weight": 2,
            "running": 3,
            "queued": 1,
        },
        {
            "name": "nightly-batch",
            "lanes": ["batch"],
            "requests_per_min": None,
            "tokens_per_min": None,
            "concurrency_share": 0.25,
            "weight": 1,
            "running": 2,
            "queued": 14,
        },
    ],
}


THRESHOLDS: dict[str, Any] = {
    "active": {
        "id": 2,
        "ts_s": T0 - 86400,
        "source": "recalibration",
        "data": {"derate_core_c": 83.0, "protect_mem_c": 94.0, "slo_ttft_p99_s": 4.5},
    },
    "previous": [
        {
            "id": 1,
            "ts_s": T0 - 90 * 86400,
            "source": "config",
            "state": "previous",
            "data": {"derate_core_c": 85.0, "protect_mem_c": 95.0, "slo_ttft_p99_s": 5.0},
        }
    ],
    "rolled_back": [],
}


class StubClient:
    """The interface of appliance.client.AdminClient, answering fixed data (snapshots only)."""

    url = "http://127.0.0.1:8000"

    async def status(self) -> dict[str, Any]:
        return copy.deepcopy(STATUS)

    async def metrics_text(self) -> str:
        return "appliance_generated_tokens_total 1000\n"

    async def events(self, history: int = 50) -> AsyncIterator[dict[str, Any]]:
        await asyncio.Event().wait()  # a stream that stays open and quiet
        yield {}

    async def engine(self, action: str) -> dict[str, Any]:
        return {"status": action}

    async def set_controller(self, **fields: Any) -> dict[str, Any]:
        return fields

    async def jobs(self) -> dict[str, Any]:
        return copy.deepcopy(JOBS)

    async def run_job(self, name: str) -> dict[str, Any]:
        return {"job": name}

    async def benchmarks(self) -> dict[str, Any]:
        return copy.deepcopy(BENCH)

    async def apply_benchmark(self, bench_id: int, objective: dict[str, Any]) -> dict[str, Any]:
        return {"id": bench_id, "applied": True, "ceiling": 8, "reason": "the knee at 8"}

    async def thresholds(self) -> dict[str, Any]:
        return copy.deepcopy(THRESHOLDS)

    async def rollback_thresholds(self) -> dict[str, Any]:
        return {"restored": {"id": 1, "source": "config"}}

    async def usage(self, from_day: str | None = None, to_day: str | None = None) -> dict[str, Any]:
        return copy.deepcopy(USAGE)

    async def keys(self) -> dict[str, Any]:
        return copy.deepcopy(KEYS)

    async def inject_fault(self, body: dict[str, Any]) -> dict[str, Any]:
        return {}

    async def clear_faults(self) -> dict[str, Any]:
        return {}

    async def close(self) -> None:
        return None


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()


def make_app() -> ApplianceTui:
    return build_app(StubClient(), refresh_s=3600)  # one poll only: nothing moves


async def with_history(pilot: Pilot[Any]) -> None:
    """Wait for the first poll, then add a fixed two-minute history and redraw."""
    app: ApplianceTui = pilot.app  # type: ignore[assignment]
    while app.model.status is None:
        await pilot.pause(0.02)
    for i in range(40):
        status = copy.deepcopy(STATUS)
        gpu = status["telemetry"]["gpus"][0]
        gpu["core_temp_c"] = 55 + (i * 7) % 31
        gpu["mem_temp_c"] = 60 + (i * 5) % 30
        gpu["power_w"] = 200 + (i * 37) % 400
        app.model.ingest_status(status)
        app.model.tokens_per_s.append(100 + (i * 13) % 90)
        app.model.latency["ttft_p99_s"].append(0.5 + (i % 7) / 10)
        app.model.latency["tpot_p99_s"].append(0.05 + (i % 5) / 100)
    app.refresh_view()
    await pilot.pause(0.1)


def test_dashboard(snap_compare: Any) -> None:
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=with_history)


def test_dashboard_wide(snap_compare: Any) -> None:
    assert snap_compare(make_app(), terminal_size=(120, 40), run_before=with_history)


def test_events(snap_compare: Any) -> None:
    assert snap_compare(make_app(), press=["e"], terminal_size=(80, 24), run_before=with_history)


def test_controls(snap_compare: Any) -> None:
    assert snap_compare(make_app(), press=["c"], terminal_size=(80, 24), run_before=with_history)


def test_maintenance(snap_compare: Any) -> None:
    async def before(pilot: Pilot[Any]) -> None:
        await with_history(pilot)
        await pilot.press("j")
        await pilot.pause(0.2)

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=before)


def test_benchmarks(snap_compare: Any) -> None:
    async def before(pilot: Pilot[Any]) -> None:
        await with_history(pilot)
        await pilot.press("b")
        await pilot.pause(0.2)

    assert snap_compare(make_app(), terminal_size=(100, 24), run_before=before)


def test_usage(snap_compare: Any) -> None:
    async def before(pilot: Pilot[Any]) -> None:
        await with_history(pilot)
        await pilot.press("u")
        await pilot.pause(0.2)

    assert snap_compare(make_app(), terminal_size=(100, 24), run_before=before)


def test_restart_confirmation(snap_compare: Any) -> None:
    assert snap_compare(make_app(), press=["R"], terminal_size=(80, 24), run_before=with_history)


def test_help(snap_compare: Any) -> None:
    assert snap_compare(
        make_app(), press=["question_mark"], terminal_size=(80, 24), run_before=with_history
    )
