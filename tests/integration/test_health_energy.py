"""Readiness under thermal PROTECT and a lost GPU, joules per token, per-request log lines,
and the no-retry hint on a queued deadline: the real HTTP app with the fake engine and the
simulated GPU."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integration.test_app_fake_engine import Harness, _cfg, _chat, running


@pytest.fixture
async def h(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    monkeypatch.delenv("APPLIANCE_ADMIN_TOKEN", raising=False)
    cfg = _cfg(
        tmp_path,
        admission={"concurrency_limit": 4},
        telemetry={"source": "sim", "interval_s": 0.02, "sim": {"time_constant_s": 0.05}},
        thermal={"dwell_s": 0.1, "step_interval_s": 0.05},
    )
    async with running(cfg, token_delay_s=0.002) as harness:
        yield harness


async def _until(predicate, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_lost_gpu_makes_readiness_503_protect_with_events(h: Harness):
    r = await h.client.post("/admin/telemetry/faults", headers=h.admin(), json={"name": "lost_gpu"})
    assert r.status == 200
    await _until(lambda: h.svc.admission.protect)
    ready = await h.client.get("/health/ready")
    body = await ready.json()
    assert ready.status == 503 and body["reason"] == "protect" and "Retry-After" in ready.headers
    assert "lost" in body["detail"]
    # Realtime still runs; the other lanes are told to come back.
    assert (
        await h.client.post("/v1/chat/completions", json=_chat(priority="realtime"))
    ).status == 200
    r = await h.client.post("/v1/chat/completions", json=_chat())
    assert r.status == 503 and (await r.json())["error"]["code"] is not None
    lost = [e for e in h.svc.events.recent(200) if e.kind == "gpu_lost"]
    assert len(lost) == 1 and lost[0].data["gpu"] == 0 and "SIM" in lost[0].data["uuid"]

    await h.client.delete("/admin/telemetry/faults", headers=h.admin())
    await _until(lambda: not h.svc.admission.protect)
    assert (await h.client.get("/health/ready")).status == 200
    kinds = [e.kind for e in h.svc.events.recent(200)]
    assert kinds.count("gpu_lost") == 1 and kinds.count("gpu_recovered") == 1


async def test_energy_per_token_in_metrics_and_status(h: Harness):
    text = await (await h.client.get("/metrics")).text()
    name = "appliance_energy_per_token_joules "
    assert not any(x.startswith(name) for x in text.splitlines())  # idle: no figure yet
    for _ in range(5):
        r = await h.client.post("/v1/chat/completions", json=_chat(max_tokens=8))
        assert r.status == 200
    await asyncio.sleep(0.1)  # a few telemetry ticks see the new token count
    snap = await (await h.client.get("/admin/status", headers=h.admin())).json()
    ept = snap["telemetry"]["energy_per_token_j"]
    assert ept["window_s"] == 60 and ept["recent"] > 0 and ept["lifetime"] > 0
    # The simulated GPU draws at least its idle power: J/token >= idle W x time / tokens.
    tokens = h.svc.metrics.generated_tokens
    assert tokens == 5 * 8
    assert ept["lifetime"] == pytest.approx(h.svc.telemetry_loop.energy_total_j / tokens, rel=0.2)
    text = await (await h.client.get("/metrics")).text()
    line = next(x for x in text.splitlines() if x.startswith("appliance_energy_per_token_joules "))
    assert float(line.split()[1]) > 0


async def test_each_request_logs_one_request_done_line(h: Harness, caplog):
    caplog.set_level(logging.INFO, logger="appliance.requests")
    r = await h.client.post(
        "/v1/chat/completions",
        json=_chat(max_tokens=3, priority="batch"),
        headers={"X-Request-Id": "rid-123"},
    )
    assert r.status == 200
    done = [rec for rec in caplog.records if getattr(rec, "event", None) == "request_done"]
    assert len(done) == 1
    rec = done[0]
    assert rec.ev_status == "ok" and rec.ev_priority == "batch"
    assert rec.ev_completion_tokens == 3 and rec.ev_prompt_tokens > 0
    assert 0 <= rec.ev_queue_wait_s <= rec.ev_ttft_s <= rec.ev_e2e_s
    from appliance.json_log import JsonFormatter

    line = JsonFormatter().format(rec)
    assert '"request_id": "rid-123"' in line and '"event": "request_done"' in line


async def test_queued_deadline_tells_clients_not_to_retry(h: Harness):
    h.engines[-1].token_delay_s = 0.05
    blockers = [
        asyncio.create_task(h.client.post("/v1/chat/completions", json=_chat(max_tokens=8)))
        for _ in range(4)
    ]
    await asyncio.sleep(0.02)
    r = await h.client.post("/v1/chat/completions", json=_chat(deadline_ms=30))
    assert r.status == 408
    assert r.headers["x-should-retry"] == "false"
    assert (await r.json())["error"]["code"] == "deadline_exceeded"
    for b in blockers:
        assert (await b).status == 200


async def test_history_row_carries_throughput_memory_and_gpu_load(h: Harness):
    from appliance.services.metric_row import MetricRows

    svc = h.svc
    rows = MetricRows(svc.admission, svc.supervisor, svc.telemetry_loop, svc.metrics, svc.latency)
    first = rows.row()
    assert "tokens_per_s" not in first  # no rate before a second sample
    for _ in range(3):
        assert (await h.client.post("/v1/chat/completions", json=_chat(max_tokens=5))).status == 200
    await asyncio.sleep(0.05)
    row = rows.row()
    assert row["tokens_per_s"] > 0 and row["requests_per_s"] > 0 and row["arrivals_per_s"] > 0
    assert row["rejected_per_s"] == 0
    assert 0 < row["rss_bytes"] < row["memory_limit_bytes"]
    # The simulated GPU reports utilisation and memory like NVML does.
    assert 0 <= row["gpu_util_pct"] <= 100 and 0 < row["mem_used_ratio"] < 1
    assert row["gpu_memory_used_bytes"] <= row["gpu_memory_total_bytes"]
