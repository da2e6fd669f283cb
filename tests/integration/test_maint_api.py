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


async def _start(
    tmp_path: Path,
    engine: type[FakeEngine] = FakeEngine,
    max_num_seqs: int = 64,
    **maintenance: Any,
) -> App:
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
                "max_num_seqs": max_num_seqs,
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


class SleepyEngine(FakeEngine):
    """100 ms a token, however many run: the benchmark's own overhead stays small beside it,
    so throughput scales with concurrency like a box far from saturation."""

    def __init__(self, token_delay_s: float, **kw: Any) -> None:
        super().__init__(token_delay_s=0.1, **kw)


async def test_rebenchmark_still_rising_extends_to_max_num_seqs_and_sets_no_ceiling(
    tmp_path: Path, started
):
    app = await _start(
        tmp_path,
        SleepyEngine,
        max_num_seqs=16,
        benchmark_mode="sweep",
        benchmark_concurrency=[1, 2],
        benchmark_requests_per_level=2,
        benchmark_max_tokens=4,
    )
    started.append(app)
    ctl = app.svc.controller
    ctl.set_ceiling(2, "an older run")
    mode, limit = ctl.mode, app.svc.admission.base_limit
    run = await app.run_job("benchmark")
    assert run["outcome"] == "ok", run
    d = run["details"]
    # Doubled past the configured [1, 2] up to engine.max_num_seqs (16), never beyond.
    assert d["levels"] == [1, 2, 4, 8, 16] and d["mode"] == "sweep"
    assert d["still_rising"] is True and d["knee_limit"] is None and d["ceiling_set"] is None
    # The old ceiling of 2 would have capped a box still scaling at 16: it is gone, for good.
    assert ctl.ceiling is None and app.svc.store.kept_ceiling()[0] is None
    lifted = [e for e in app.svc.events.recent(300) if e.kind == "ceiling"][-1]
    assert "lifted" in lifted.reason and "still rising at 16" in lifted.reason
    # The daemon's limit was opened for the run only: mode and limit are back.
    assert ctl.mode == mode and app.svc.admission.base_limit == limit
    sources = [
        e.data["source"] for e in app.svc.events.recent(300) if e.kind == "controller_config"
    ]
    assert sources == ["the monthly benchmark", "the monthly benchmark, ended"]


async def test_rebenchmark_runs_the_three_phase_tuning_by_default(tmp_path: Path, started):
    app = await _start(
        tmp_path, SleepyEngine, benchmark_requests_per_level=2, benchmark_max_tokens=4
    )
    started.append(app)
    run = await app.run_job("benchmark")
    assert run["outcome"] == "ok", run
    d = run["details"]
    levels = d["levels"]
    # Baseline 8, then doubling while throughput pays, up to engine.max_num_seqs (64).
    assert d["mode"] == "tuning" and levels == [8, 16, 32, 64][: len(levels)] and levels[1:]
    tuning = app.svc.store.benchmarks(limit=1)[0]["result"]["tuning"]
    assert tuning["baseline"]["concurrency"] == 8
    if tuning["knee"]["still_rising"]:  # how it should look on this fake, on a quiet box
        assert levels[-1] == 64 and d["ceiling_set"] is None is app.svc.controller.ceiling
    else:  # a loaded box can bend the fake's curve: then the knee, with a level past it
        assert tuning["knee"]["throughput_knee"] < levels[-1]
        assert d["ceiling_set"] == tuning["recommended_limit"] == app.svc.controller.ceiling


def _sweep_report() -> dict[str, Any]:
    from appliance.domain.sweep_analysis import SweepPoint, find_knee, pareto_front

    def point(c: int, tok: float, p99: float) -> SweepPoint:
        return SweepPoint(c, tok, c / 2, p99 / 2, p99, 0.02, 0.04, p99 + 1)

    points = [point(1, 40, 0.1), point(2, 75, 0.12), point(4, 130, 0.2), point(8, 190, 0.5)]
    points += [point(16, 200, 1.9), point(32, 195, 3.0)]
    knee = find_knee(points)
    return {
        "levels": [{"concurrency": p.concurrency, "point": p.to_dict()} for p in points],
        "knee": knee.to_dict(),
        "knee_limit": knee.concurrency,
        "pareto": [p.concurrency for p in pareto_front(points)],
        "capped_by_daemon_limit": None,
    }


async def test_apply_a_stored_run_by_objective(tmp_path: Path, started):
    app = await _start(tmp_path)
    started.append(app)
    c, ctl = app.client, app.svc.controller
    r = await c.post("/admin/benchmarks", json=_sweep_report(), headers=app.admin())
    bench_id = (await r.json())["id"]
    url = f"/admin/benchmarks/{bench_id}/apply"
    assert (await c.post(url, json={})).status == 401
    r = await c.post(url, json={}, headers=app.admin())
    assert r.status == 200 and (await r.json())["ceiling"] == 8 == ctl.ceiling
    r = await c.post(url, json={"objective": "level", "level": 4}, headers=app.admin())
    body = await r.json()
    assert body["ceiling"] == 4 and body["reason"].startswith("the Pareto point 4 chosen")
    r = await c.post(
        url,
        json={"objective": "score", "weights": {"latency": 1, "throughput": 0}},
        headers=app.admin(),
    )
    assert (await r.json())["ceiling"] == 1 == ctl.ceiling
    ev = [e for e in app.svc.events.recent(100) if e.kind == "ceiling"][-1]
    assert f"benchmark run {bench_id}, objective score: the best weighted score" in ev.reason
    for body, param, text in (
        ({"objective": "level", "level": 32}, "level", "level: 32 is not on this run's Pareto"),
        ({"objective": "best"}, "objective", "objective: must be one of knee, score, level"),
        ({"objective": "score", "weights": {"latency": -1}}, "weights", "weights.latency"),
        ({"weight": 1}, "weight", "weight: unknown field"),
        ({"objective": "score", "weights": {"speed": 1}}, "weights", "weights: an object of"),
    ):
        r = await c.post(url, json=body, headers=app.admin())
        err = (await r.json())["error"]
        assert r.status == 400 and err["param"] == param and text in err["message"], err
    assert ctl.ceiling == 1
    r = await c.post("/admin/benchmarks/999/apply", json={}, headers=app.admin())
    assert r.status == 404
    # ?apply=1&objective= on the CLI's POST does the same in one call.
    r = await c.post(
        "/admin/benchmarks?apply=1&objective=16", json=_sweep_report(), headers=app.admin()
    )
    assert (await r.json())["ceiling"] == 16 == ctl.ceiling


async def test_the_kept_ceiling_wins_over_older_runs_at_start(tmp_path: Path, started):
    app = await _start(tmp_path)
    r = await app.client.post("/admin/benchmarks", json=_sweep_report(), headers=app.admin())
    bench_id = (await r.json())["id"]
    r = await app.client.post(
        f"/admin/benchmarks/{bench_id}/apply", json={"objective": "4"}, headers=app.admin()
    )
    assert (await r.json())["ceiling"] == 4
    await app.client.close()
    again = await _start(tmp_path)
    started.append(again)
    # Not the stored run's knee (8): the level the operator chose, and who chose it.
    assert again.svc.controller.ceiling == 4
    ev = [e for e in again.svc.events.recent(100) if e.kind == "ceiling"][-1]
    assert ev.reason.startswith("concurrency ceiling set to 4 from the kept ceiling (benchmark")
    again.svc.controller.clear_ceiling("a run still rising")
    assert again.svc.store.kept_ceiling() == (None, "a run still rising")


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
