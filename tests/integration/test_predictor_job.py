"""The load predictor's daily job through the jobs API, and its forecast in the controller:
the real app, real SQLite history, the fake engine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from appliance.daemon.app import build_app
from appliance.predict.traces import read_rows
from tests.fakes import FakeEngine, WordTokenizer
from tests.integration.test_app_fake_engine import Harness, _cfg

TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "load_periodic.csv"


@pytest.fixture
async def h(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    monkeypatch.delenv("APPLIANCE_ADMIN_TOKEN", raising=False)
    cfg = _cfg(tmp_path, controller={"tick_s": 0.05})
    client = TestClient(TestServer(build_app(cfg, lambda: FakeEngine(), WordTokenizer())))
    await client.start_server()
    harness = Harness(client, [], (tmp_path / "admin.token").read_text().strip())
    await harness.wait_ready()
    yield harness
    await client.close()


async def _run_job(h: Harness) -> dict:
    r = await h.client.post("/admin/jobs/predictor/run?force=1", headers=h.admin())
    assert r.status == 202
    for _ in range(600):
        runs = h.svc.store.job_runs("predictor", limit=1)
        if runs and runs[0].outcome != "running" and runs[0].ended_s:
            return {"outcome": runs[0].outcome, **runs[0].details}
        await asyncio.sleep(0.05)
    raise AssertionError("the predictor job did not finish")


async def test_predictor_job_waits_for_history_then_trains_and_feeds_the_controller(
    h: Harness, tmp_path: Path
):
    first = await _run_job(h)
    assert first["outcome"] == "ok" and first["trained"] is False and first["reason"]

    # Two hours of a recorded-format trace, moved to end now, into the real history store.
    rows = read_rows(TRACE)[: 2 * 720]
    shift = time.time() - rows[-1]["ts_s"]
    for row in rows:
        data = {k: v for k, v in row.items() if k not in ("ts_s", "resolution_s")}
        h.svc.store.add_metric_sample(row["ts_s"] + shift, 0, data)
    done = await _run_job(h)
    assert done["outcome"] == "ok" and done["trained"] is True, done
    assert done["train_points"] > done["holdout_points"] > 0
    assert (tmp_path / "load_predictor.pt").exists()
    assert any(e.kind == "predictor_trained" for e in h.svc.events.recent(50))
    # The controller's forecast comes from that history now.
    await h.svc.controller.refresh_forecast()
    f = h.svc.controller.snapshot()["forecast"]
    assert f is not None and f["source"] in ("lstm", "ewma") and f["pending_expected"] >= 0
    assert f["source"] == ("lstm" if done["lstm_enabled"] else "ewma"), f
