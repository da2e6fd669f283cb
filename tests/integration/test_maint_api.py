"""Maintenance through the HTTP app (fake engine, real sockets, real SQLite and scheduler):
threshold rollback, the benchmark ceiling surviving a restart, the re-benchmark regression
event, and the restart job's growth threshold."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from appliance.api.keys import SERVICES
from appliance.config import parse_config
from appliance.daemon.app import build_app
from appliance.services.container import Services
from appliance.services.store import StateStore
from bench.servers import free_port
from tests.fakes import FakeEngine, WordTokenizer

MODEL = "fake-model"


class VisibleEngine(FakeEngine):
    """A fake engine whose 'engine process' is this test process, so it has an RSS."""

    def child_pids(self) -> list[int]:
        return [os.getpid()]


class App:
    def __init__(self, client: TestClient, token: str) -> None:
        self.client = client
        self.token = token

    @property
    def svc(self) -> Services:
        return self.client.app[SERVICES]

    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def run_job(self, name: str) -> dict[str, Any]:
        r = await self.client.post(f"/admin/jobs/{name}/run", headers=self.admin())
        assert r.status == 202, await r.text()
        for _ in range(1500):
            jobs = (await (await self.client.get("/admin/jobs", headers=self.admin())).json())[
                "jobs"
            ]
            (job,) = [j for j in jobs if j["name"] == name]
            if job["history"] and job["history"][0]["outcome"] != "running":
                return job["history"][0]
            await asyncio.sleep(0.02)
        raise AssertionError(f"{name} did not finish")


async def _start(tmp_path: Path, engine: type[FakeEngine] = FakeEngine, **maintenance: Any) -> App:
    port = free_port()
    cfg = parse_config(
        {
            "state_dir": str(tmp_path),
            "server": {"host": "127.0.0.1", "port": port},
            "engine": {
                "served_model_name": MODEL,
                "max_model_len": 64,
                "max_tokens_default": 4,
                "drain_timeout_s": 5,
                "health_interval_s": 0.05,
            },
            "admission": {"concurrency_limit": 4},
            "telemetry": {"source": "sim"},
            "maintenance": {"history_interval_s": 3600, **maintenance},
        }
    )
    app = build_app(cfg, lambda: engine(token_delay_s=0.002, max_model_len=64), WordTokenizer())
    client = TestClient(TestServer(app, host="127.0.0.1", port=port))
    await client.start_server()
    for _ in range(500):
        if (await client.get("/health/ready")).status == 200:
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("not ready")
    return App(client, (tmp_path / "admin.token").read_text().strip())


@pytest.fixture
async def started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[list[App]]:
    monkeypatch.delenv("APPLIANCE_ADMIN_TOKEN", raising=False)
    apps: list[App] = []
    yield apps
    for a in apps:
        await a.client.close()


async def test_thresholds_rollback_applies_and_rewrites_the_rules(tmp_path: Path, started):
    app = await _start(tmp_path)
    started.append(app)
    svc, c = app.svc, app.client
    configured = svc.config.thermal.derate_core_c
    rules = tmp_path / "alerts.recalibrated.yml"

    body = await (await c.get("/admin/thresholds", headers=app.admin())).json()
    assert body["active"]["source"] == "config" and body["active"]["id"] is None
    assert body["active"]["data"]["derate_core_c"] == configured and body["previous"] == []
    r = await c.post("/admin/thresholds/rollback", headers=app.admin())
    assert r.status == 409 and (await r.json())["error"]["code"] == "no_rollback"
    assert (await c.post("/admin/thresholds/rollback")).status == 401

    # A quarter's history at a steady 70 °C: recalibration derates at 73 °C.
    now = time.time()
    for i in range(40):
        svc.store.add_metric_sample(now - 1000 + i, 0, {"core_temp_c_max": 70.0})
    run = await app.run_job("recalibrate")
    assert run["outcome"] == "ok", run
    assert svc.telemetry_loop.policy_cfg.derate_core_c == 73.0 and "> 73" in rules.read_text()
    body = await (await c.get("/admin/thresholds", headers=app.admin())).json()
    assert body["active"]["source"] == "recalibration"
    assert body["active"]["data"]["derate_core_c"] == 73.0
    assert [p["source"] for p in body["previous"]] == ["config"]
    # The SLO reaches the controller through its one path: the settings and an event.
    assert svc.controller.cfg.slo_ttft_p99_s == body["active"]["data"]["slo_ttft_p99_s"]
    sources = [e.data["source"] for e in svc.events.recent(200) if e.kind == "controller_config"]
    assert sources == ["the quarterly recalibration"]

    r = await c.post("/admin/thresholds/rollback", headers=app.admin())
    assert r.status == 200, await r.text()
    body = await r.json()
    assert body["changes"]["derate_core_c"] == [73.0, configured]
    assert body["active"]["derate_core_c"] == configured
    # Applied live and the rules regenerated.
    assert svc.telemetry_loop.policy_cfg.derate_core_c == configured
    assert f"> {configured:g}" in rules.read_text() and "> 73" not in rules.read_text()
    (ev,) = [e for e in svc.events.recent(200) if e.kind == "thresholds_rolled_back"]
    assert ev.data["changes"] == body["changes"]
    ev = [e for e in svc.events.recent(200) if e.kind == "controller_config"][-1]
    assert ev.data["source"] == "a threshold rollback"
    assert svc.controller.cfg.slo_ttft_p99_s == svc.config.slo.ttft_p99_s
    body = await (await c.get("/admin/thresholds", headers=app.admin())).json()
    assert body["active"]["source"] == "config" and body["previous"] == []
    assert [t["data"]["derate_core_c"] for t in body["rolled_back"]] == [73.0]
    r = await c.post("/admin/thresholds/rollback", headers=app.admin())
    assert r.status == 409


async def test_benchmark_ceiling_survives_a_daemon_restart(tmp_path: Path, started):
    store = StateStore(tmp_path / "appliance.db")
    store.add_benchmark("maintenance", {"levels": [], "knee_limit": 6})
    # A newer sweep without a usable knee did not change the ceiling.
    store.add_benchmark("maintenance", {"levels": [], "knee_limit": None})
    store.close()
    app = await _start(tmp_path)
    started.append(app)
    assert app.svc.controller.ceiling == 6
    (ev,) = [e for e in app.svc.events.recent(200) if e.kind == "ceiling"]
    assert ev.data == {"ceiling": 6} and "stored benchmark 1" in ev.reason


async def test_rebenchmark_job_reports_a_regression(tmp_path: Path, started):
    store = StateStore(tmp_path / "appliance.db")
    # A previous run far faster than a fake engine can go.
    store.add_benchmark(
        "maintenance", {"levels": [{"point": {"output_tok_s": 1e9}}], "knee_limit": None}
    )
    store.close()
    app = await _start(
        tmp_path,
        benchmark_concurrency=[1, 2],
        benchmark_requests_per_level=2,
        benchmark_max_tokens=2,
    )
    started.append(app)
    run = await app.run_job("benchmark")
    assert run["outcome"] == "ok", run
    details = run["details"]
    assert details["regression"] is True and details["previous_best_output_tok_s"] == 1e9
    assert 0 < details["best_output_tok_s"] < 1e9
    (ev,) = [e for e in app.svc.events.recent(300) if e.kind == "benchmark_regression"]
    assert ev.data["before"] == 1e9
    assert len(app.svc.store.benchmarks()) == 2


async def test_restart_job_growth_threshold_uses_the_engine_start_baseline(tmp_path: Path, started):
    app = await _start(tmp_path, VisibleEngine, restart_min_growth_ratio=0.5)
    started.append(app)
    run = await app.run_job("restart")
    assert run["outcome"] == "ok", run
    d = run["details"]
    assert d["restarted"] is False and d["baseline_source"] == "the engine's start"
    assert d["baseline_engine_rss_bytes"] > 0 and d["growth_ratio"] < 0.5
    assert "below restart_min_growth_ratio" in d["why"]


async def test_restart_job_without_a_baseline_says_so(tmp_path: Path, started):
    app = await _start(tmp_path, restart_min_growth_ratio=0.5)  # no engine RSS to see
    started.append(app)
    run = await app.run_job("restart")
    assert run["outcome"] == "ok", run
    d = run["details"]
    assert d["restarted"] is True and "no baseline" in d["why"]
    assert d["baseline_engine_rss_bytes"] is None
