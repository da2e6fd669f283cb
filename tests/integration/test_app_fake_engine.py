"""The HTTP app end to end over real sockets, with a fast fake engine for speed and faults."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from appliance.api.keys import SERVICES
from appliance.client import SseParser, parse_sse
from appliance.config import parse_config
from appliance.daemon.app import build_app
from tests.fakes import FakeEngine, WordTokenizer

MODEL = "fake-model"


class Harness:
    def __init__(self, client: TestClient, engines: list[FakeEngine], token: str) -> None:
        self.client = client
        self.engines = engines
        self.token = token

    @property
    def engine(self) -> FakeEngine:
        return self.engines[-1]

    @property
    def svc(self):
        return self.client.app[SERVICES]

    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def wait_ready(self, timeout_s: float = 5.0) -> None:
        for _ in range(int(timeout_s / 0.01)):
            r = await self.client.get("/health/ready")
            if r.status == 200:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("not ready")


H = TypeVar("H", bound=Harness)


@contextlib.asynccontextmanager
async def running(
    cfg: Any,
    harness: type[H] = Harness,
    **engine: Any,  # type: ignore[assignment]
) -> AsyncIterator[H]:
    """The app over cfg with fake engines (FakeEngine(**engine); max_model_len 64 unless
    given), started and ready to admit; closed on the way out."""
    engines: list[FakeEngine] = []

    def factory() -> FakeEngine:
        engines.append(FakeEngine(**{"max_model_len": 64, **engine}))
        return engines[-1]

    client = TestClient(TestServer(build_app(cfg, factory, WordTokenizer())))
    await client.start_server()
    try:
        token = (cfg.state_dir / "admin.token").read_text().strip()
        started = harness(client, engines, token)
        await started.wait_ready()
        yield started
    finally:
        await client.close()


def _cfg(tmp_path: Path, **sections: dict):
    base: dict = {
        "state_dir": str(tmp_path),
        "server": {"max_body_bytes": 4096},
        "engine": {
            "served_model_name": MODEL,
            "max_model_len": 64,
            "max_tokens_default": 8,
            "drain_timeout_s": 5,
            "health_interval_s": 0.05,
            "restart_backoff_initial_s": 0.01,
            "restart_backoff_max_s": 0.05,
        },
        "admission": {
            "concurrency_limit": 2,
            "max_queue_wait_s": 5,
            "retry_after_s": 7,
            "queue_capacity": {"realtime": 2, "interactive": 16, "batch": 1},
        },
        "telemetry": {"source": "sim"},
    }
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return parse_config(base)


def _chat(**kw):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 4,
    }
    body.update(kw)
    return body


async def test_admin_token_file_is_private(h: Harness, tmp_path: Path):
    mode = stat.S_IMODE(os.stat(tmp_path / "admin.token").st_mode)
    assert mode == 0o600


async def test_chat_and_completion_shapes(h: Harness):
    r = await h.client.post("/v1/chat/completions", json=_chat())
    assert r.status == 200
    body = await r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == "tok0 tok1 tok2 tok3 "
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 4
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 4
    r = await h.client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "a b c", "max_tokens": 2}
    )
    body = await r.json()
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == "tok0 tok1 "
    assert body["usage"]["prompt_tokens"] == 3
    r = await h.client.get("/v1/models")
    assert (await r.json())["data"][0]["id"] == MODEL


async def test_stream_ends_with_done_and_usage(h: Harness):
    r = await h.client.post(
        "/v1/chat/completions", json=_chat(stream=True, stream_options={"include_usage": True})
    )
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    events = parse_sse(await r.text())
    assert events[-1].done
    chunks = [e.json() for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "tok0 tok1 tok2 tok3 "
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4


# Bad input is refused before the engine: by the appliance (body, lanes, deadlines, fields
# no one serves) or by vLLM's own request models and sampling checks (everything else,
# with vLLM's messages: what `vllm serve` would answer).
BAD_INPUTS = [
    # (body or raw bytes, status, param, words in the message)
    (b"{not json", 400, "body", "not valid JSON"),
    (b'{"model": "\xff\xfe"}', 400, "body", "not valid UTF-8"),
    (b"[1, 2]", 400, "body", "must be a JSON object"),
    (_chat(model="gpt-9"), 404, "model", "`gpt-9` does not exist"),
    (_chat(messages="hi"), 400, "messages", "valid list"),
    (_chat(messages=[{"role": "user", "content": 5}]), 400, "messages[0].content", "valid"),
    (_chat(max_tokens=0), 400, "max_tokens", "at least 1"),
    (_chat(max_tokens="ten"), 400, "max_tokens", "valid integer"),
    (
        _chat(messages=[{"role": "user", "content": "w " * 80}]),
        400,
        "input_tokens",
        "maximum context length is 64 tokens",
    ),
    (_chat(temperature=3), 400, "temperature", "[0, 2]"),
    (_chat(temperature="hot"), 400, "temperature", "valid number"),
    (_chat(top_p=0), 400, "top_p", "(0, 1]"),
    (_chat(seed=1.5), 400, "seed", "valid integer"),
    (_chat(n=0), 400, None, "n must be at least 1"),
    (_chat(mirostat=1), 400, "mirostat", "unknown field"),
    (_chat(priority="urgent"), 400, "priority", "must be one of"),
    (_chat(priority=1), 400, "priority", "must be one of"),
    (_chat(deadline_ms=0), 400, "deadline_ms", "between 1 and 3600000"),
    (_chat(deadline_ms=1.5), 400, "deadline_ms", "must be an integer"),
    (_chat(long_context="maybe"), 400, "long_context", "must be one of"),
    ({"model": MODEL, "prompt": ""}, 400, "prompt", "non-empty"),
    ({"model": MODEL, "prompt": {"a": 1}}, 400, "prompt", "valid"),
    ({"model": MODEL, "prompt": "x", "long_context": "chunk"}, 400, "long_context", "chat"),
    (
        b'{"model": "fake-model", "prompt": "' + b"x" * 5000 + b'"}',
        413,
        "body",
        "over the limit of 4096 bytes",
    ),
]


@pytest.mark.parametrize(("body", "status", "param", "words"), BAD_INPUTS)
async def test_bad_input_never_reaches_the_engine(h: Harness, body, status, param, words):
    path = (
        "/v1/completions" if isinstance(body, dict) and "prompt" in body else "/v1/chat/completions"
    )
    if isinstance(body, bytes):
        r = await h.client.post(path, data=body, headers={"Content-Type": "application/json"})
    else:
        r = await h.client.post(path, json=body)
    assert r.status == status
    err = (await r.json())["error"]
    assert err["param"] == param
    assert words in err["message"], err["message"]
    assert set(err) == {"message", "type", "param", "code"}
    assert h.engine.seen == []


async def test_unknown_route_is_json_404(h: Harness):
    r = await h.client.get("/v1/nothing")
    assert r.status == 404 and "error" in await r.json()


async def test_admin_requires_token(h: Harness):
    for method, path in [
        ("GET", "/admin/status"),
        ("POST", "/admin/engine/restart"),
        ("GET", "/admin/events"),
    ]:
        r = await h.client.request(method, path)
        assert r.status == 401
        assert "admin.token" in (await r.json())["error"]["message"]
        r = await h.client.request(method, path, headers={"Authorization": "Bearer wrong"})
        assert r.status == 401
    r = await h.client.get("/admin/status", headers=h.admin())
    snap = await r.json()
    assert snap["engine"]["state"] == "ready" and snap["admission"]["limit"] == 2


async def test_queue_full_gives_429_with_retry_after(h: Harness):
    h.svc.supervisor.pause()  # nothing dispatches: the batch lane (capacity 1) fills
    first = asyncio.create_task(h.client.post("/v1/chat/completions", json=_chat(priority="batch")))
    await asyncio.sleep(0.05)
    r = await h.client.post("/v1/chat/completions", json=_chat(priority="batch"))
    assert r.status == 429 and r.headers["Retry-After"] == "7"
    assert (await r.json())["error"]["code"] == "queue_full"
    h.svc.supervisor.resume()
    assert (await first).status == 200


async def test_client_gone_while_queued_never_reaches_engine(h: Harness):
    h.svc.supervisor.pause()
    async with aiohttp.ClientSession() as s:
        task = asyncio.create_task(s.post(h.client.make_url("/v1/chat/completions"), json=_chat()))
        await asyncio.sleep(0.1)
        assert h.svc.admission.queued() == 1
        task.cancel()
    for _ in range(100):
        if h.svc.admission.queued() == 0:
            break
        await asyncio.sleep(0.01)
    assert h.svc.admission.queued() == 0
    h.svc.supervisor.resume()
    assert h.engine.seen == []


async def test_client_gone_mid_stream_aborts_the_engine_request(h: Harness):
    h.engine.token_delay_s = 0.05
    async with aiohttp.ClientSession() as s:
        resp = await s.post(
            h.client.make_url("/v1/chat/completions"), json=_chat(stream=True, max_tokens=50)
        )
        await resp.content.readline()
        assert h.svc.admission.in_flight == 1
        resp.close()
    for _ in range(200):
        if h.svc.admission.in_flight == 0 and not h.engine.running:
            break
        await asyncio.sleep(0.01)
    assert h.svc.admission.in_flight == 0
    assert h.engine.aborted == [h.engine.seen[0].request_id]


async def test_deadline_returns_partial_answer(h: Harness):
    # The fake engine sleeps per token: 50 take >= 1 s anywhere, so the 150 ms deadline is first.
    h.engine.token_delay_s = 0.02
    r = await h.client.post("/v1/chat/completions", json=_chat(max_tokens=50, deadline_ms=150))
    body = await r.json()
    assert body["choices"][0]["finish_reason"] == "deadline"
    assert 0 < body["usage"]["completion_tokens"] < 50
    assert h.engine.aborted == [h.engine.seen[0].request_id]


async def test_restart_under_load_loses_nothing(h: Harness):
    h.engine.token_delay_s = 0.01

    async def one(i: int) -> int:
        r = await h.client.post(
            "/v1/chat/completions", json=_chat(max_tokens=10, stream=i % 2 == 0)
        )
        await r.read()
        return r.status

    first = [asyncio.create_task(one(i)) for i in range(4)]
    await asyncio.sleep(0.02)
    r = await h.client.post("/admin/engine/restart", headers=h.admin())
    assert r.status == 202
    r = await h.client.post("/admin/engine/restart", headers=h.admin())
    assert r.status == 409
    ready = await h.client.get("/health/ready")
    assert ready.status == 503 and (await ready.json())["reason"] == "restarting"
    later = [asyncio.create_task(one(i)) for i in range(4)]
    statuses = await asyncio.gather(*first, *later)
    assert statuses == [200] * 8
    await h.wait_ready()
    assert len(h.engines) == 2 and h.engines[0].shut_down
    assert h.svc.supervisor.restarts_total == {"manual": 1}


async def test_dead_engine_goes_not_ready_and_is_restarted(h: Harness):
    h.engine.dead = True
    for _ in range(200):
        r = await h.client.get("/health/ready")
        if r.status == 503:
            break
        await asyncio.sleep(0.005)
    assert (await r.json())["reason"] == "engine_dead"
    r = await h.client.post("/v1/chat/completions", json=_chat())
    assert r.status == 503 and "Retry-After" in r.headers
    await h.wait_ready()
    assert h.svc.supervisor.restarts_total == {"engine_dead": 1}
    r = await h.client.post("/v1/chat/completions", json=_chat())
    assert r.status == 200


async def test_engine_death_mid_stream_is_an_error_event(h: Harness):
    h.engine.token_delay_s = 0.02
    r = await h.client.post("/v1/chat/completions", json=_chat(stream=True, max_tokens=50))
    await r.content.readline()
    h.engine.dead = True
    events = parse_sse(await r.text())
    assert events[-1].done
    assert any(e.json().get("error", {}).get("code") == "engine_dead" for e in events[:-1])


async def test_pause_resume_and_events_stream(h: Harness):
    r = await h.client.get("/admin/events?history=50", headers=h.admin())
    assert r.status == 200
    await h.client.post("/admin/engine/pause", headers=h.admin())
    assert (await h.client.get("/health/ready")).status == 503
    await h.client.post("/admin/engine/resume", headers=h.admin())
    states: list[str] = []
    parser = SseParser()
    while states[-2:] != ["paused", "ready"] and len(states) < 10:
        sse = parser.feed(await asyncio.wait_for(r.content.readline(), 5))
        if sse is not None:
            event = sse.json()
            if event["kind"] == "engine_state":
                states.append(event["data"]["state"])
    r.close()
    assert states == ["starting", "ready", "paused", "ready"]


async def test_metrics_exposition(h: Harness):
    await h.client.post("/v1/chat/completions", json=_chat())
    await h.client.post("/v1/chat/completions", json=_chat(model="nope"))
    text = await (await h.client.get("/metrics")).text()
    for name in [
        'appliance_requests_total{status="ok"} 1.0',
        "appliance_ttft_seconds_bucket",
        "appliance_tpot_seconds_count",
        "appliance_e2e_seconds_count",
        "appliance_requests_in_flight 0.0",
        'appliance_queue_depth{priority="batch"}',
        "appliance_kv_cache_usage_ratio",
        "appliance_generated_tokens_total 4.0",
        "appliance_concurrency_limit 2.0",
    ]:
        assert name in text, name


async def test_thermal_fault_derates_then_recovers(tmp_path: Path, monkeypatch):
    """Fast simulated thermals: a hot room under load cuts the limit; clearing it restores."""
    monkeypatch.delenv("APPLIANCE_ADMIN_TOKEN", raising=False)
    cfg = _cfg(
        tmp_path,
        admission={"concurrency_limit": 8},
        telemetry={
            "source": "sim",
            "interval_s": 0.02,
            "sim": {"time_constant_s": 0.05, "ambient_c": 25},
        },
        thermal={"dwell_s": 0.1, "step_interval_s": 0.05, "hysteresis_c": 3},
    )
    app = build_app(cfg, lambda: FakeEngine(token_delay_s=0.01), WordTokenizer())
    client = TestClient(TestServer(app))
    await client.start_server()
    h = Harness(client, [], (tmp_path / "admin.token").read_text().strip())
    try:
        await h.wait_ready()
        r = await client.post(
            "/admin/telemetry/faults", headers=h.admin(), json={"name": "hot_room", "delta_c": 60}
        )
        assert r.status == 200
        for _ in range(300):
            if h.svc.admission.limit < 8:
                break
            await asyncio.sleep(0.01)
        assert h.svc.admission.limit < 8
        snap = await (await client.get("/admin/status", headers=h.admin())).json()
        assert snap["telemetry"]["thermal"]["level"] in ("derate", "protect")
        assert snap["telemetry"]["gpus"][0]["simulated"] is True
        text = await (await client.get("/metrics")).text()
        assert 'appliance_gpu_temperature_celsius{gpu="0",simulated="true"}' in text
        assert "appliance_derate_level" in text and "appliance_energy_joules_total" in text
        r = await client.delete("/admin/telemetry/faults", headers=h.admin())
        assert (await r.json())["removed"] == 1
        for _ in range(500):
            if h.svc.admission.limit == 8 and not h.svc.admission.protect:
                break
            await asyncio.sleep(0.01)
        assert h.svc.admission.limit == 8
        kinds = [e.kind for e in h.svc.events.recent(100)]
        assert "thermal" in kinds and "fault_injected" in kinds
        r = await client.post("/admin/telemetry/faults", headers=h.admin(), json={"name": "x"})
        assert r.status == 400 and (await r.json())["error"]["param"] == "name"
    finally:
        await client.close()


async def test_jobs_api_runs_recalibrate_and_restart(h: Harness, tmp_path: Path):
    r = await h.client.get("/admin/jobs", headers=h.admin())
    jobs = {j["name"]: j for j in (await r.json())["jobs"]}
    assert set(jobs) == {"restart", "benchmark", "recalibrate", "predictor", "audit_prune"}
    assert jobs["restart"]["next_run"] and jobs["restart"]["cron"] == "0 3 * * sun"
    r = await h.client.post("/admin/jobs/nope/run", headers=h.admin())
    assert r.status == 404
    for name in ("recalibrate", "restart"):
        r = await h.client.post(f"/admin/jobs/{name}/run", headers=h.admin())
        assert r.status == 202
        for _ in range(300):
            info = {
                j["name"]: j
                for j in (await (await h.client.get("/admin/jobs", headers=h.admin())).json())[
                    "jobs"
                ]
            }
            if info[name]["history"] and info[name]["history"][0]["outcome"] != "running":
                break
            await asyncio.sleep(0.02)
        run = info[name]["history"][0]
        assert run["outcome"] == "ok", run
    assert run["details"]["restarted"] and "engine_rss_bytes" in run["details"]["after"]
    assert (tmp_path / "alerts.recalibrated.yml").is_file()
    text = await (await h.client.get("/metrics")).text()
    assert 'appliance_maintenance_runs_total{job="restart",outcome="ok"} 1.0' in text
    assert 'appliance_maintenance_runs_total{job="benchmark",outcome="failed"} 0.0' in text


async def test_put_controller_sets_mode_bounds_and_slo(h: Harness):
    r = await h.client.put(
        "/admin/controller",
        json={"mode": "auto", "min": 2, "max": 6, "slo_ttft_p99_s": 0.5, "slo_tpot_p99_s": 0.05},
        headers=h.admin(),
    )
    assert r.status == 200, await r.text()
    body = await r.json()
    assert (body["mode"], body["min"], body["max"]) == ("auto", 2, 6)
    assert (body["slo_ttft_p99_s"], body["slo_tpot_p99_s"]) == (0.5, 0.05)
    # The controller is the one owner of the SLO: what the jobs read is what was set here.
    policy = h.svc.controller.cfg
    assert (policy.slo_ttft_p99_s, policy.slo_tpot_p99_s) == (0.5, 0.05)
    (ev,) = [e for e in h.svc.events.recent(50) if e.kind == "controller_config"]
    assert ev.data["source"] == "the admin API" and "(by the admin API)" in ev.reason
    # The base limit (2 in this config) is inside [2, 6]; the status shows the same numbers.
    status = await (await h.client.get("/admin/status", headers=h.admin())).json()
    assert status["controller"]["slo_ttft_p99_s"] == 0.5
    assert 2 <= status["admission"]["base_limit"] <= 6


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"mode": "fast"}, "mode", "'auto' or 'manual'"),
        ({"limit": 0}, "limit", "between 1 and 4096"),
        ({"max": True}, "max", "between 1 and 4096"),
        ({"slo_ttft_p99_s": 0}, "slo_ttft_p99_s", "between 0.001 and 3600"),
        ({"slo_tpot_p99_s": "1"}, "slo_tpot_p99_s", "between 0.001 and 3600"),
        ({"slo_ttft_p99_s": 7200}, "slo_ttft_p99_s", "between 0.001 and 3600"),
        ({"window": 3}, "window", "unknown field"),
        ({"min": 9, "max": 4}, "max", "max_limit: must be >= min_limit"),
    ],
)
async def test_put_controller_rejects_bad_fields(h: Harness, body: dict, field: str, words: str):
    before = (await (await h.client.get("/admin/status", headers=h.admin())).json())["controller"]
    r = await h.client.put("/admin/controller", json=body, headers=h.admin())
    assert r.status == 400
    err = (await r.json())["error"]
    assert err["param"] == field and words in err["message"], err
    after = (await (await h.client.get("/admin/status", headers=h.admin())).json())["controller"]
    assert (after["mode"], after["min"], after["max"], after["slo_ttft_p99_s"]) == (
        before["mode"],
        before["min"],
        before["max"],
        before["slo_ttft_p99_s"],
    )


async def test_restart_while_paused_stays_paused_and_loses_nothing(h: Harness):
    await h.client.post("/admin/engine/pause", headers=h.admin())
    queued = asyncio.create_task(h.client.post("/v1/chat/completions", json=_chat()))
    await asyncio.sleep(0.02)
    r = await h.client.post("/admin/engine/restart", headers=h.admin())
    assert r.status == 202
    for _ in range(300):
        if len(h.engines) == 2 and h.svc.supervisor.state.value == "paused":
            break
        await asyncio.sleep(0.01)
    # The operator's pause outlives the restart: still held, nothing dispatched.
    assert h.svc.supervisor.state.value == "paused" and not queued.done()
    assert (await (await h.client.get("/health/ready")).json())["reason"] == "paused"
    await h.client.post("/admin/engine/resume", headers=h.admin())
    r = await queued
    assert r.status == 200 and len(h.engines[1].seen) == 1


async def test_sigterm_during_a_restart_runs_the_queued_requests_then_stops(h: Harness):
    h.engine.token_delay_s = 0.01

    async def one() -> int:
        r = await h.client.post("/v1/chat/completions", json=_chat(max_tokens=5))
        await r.read()
        return r.status

    running = [asyncio.create_task(one()) for _ in range(2)]
    await asyncio.sleep(0.02)
    h.svc.supervisor._factory = lambda: (  # the next engine takes a while to start
        h.engines.append(FakeEngine(token_delay_s=0.005, start_delay_s=0.3, max_model_len=64))
        or h.engines[-1]
    )
    restart = asyncio.create_task(h.svc.supervisor.restart("test", cause="manual"))
    await asyncio.sleep(0.05)
    queued = [asyncio.create_task(one()) for _ in range(3)]
    await asyncio.sleep(0.02)
    drained = await h.svc.supervisor.drain_and_stop(timeout_s=5)
    assert drained
    await restart
    assert await asyncio.gather(*running, *queued) == [200] * 5
    assert h.svc.supervisor.state.value == "stopped"
    # The three that arrived during the restart ran on the new engine, which then stopped.
    assert len(h.engines[-1].seen) >= 3 and h.engines[-1].shut_down
    assert sum(len(e.seen) for e in h.engines) == 5


async def test_prefix_cache_series_only_rise_across_engine_restarts(h: Harness):
    """Each engine counts its prefix-cache tokens from 0; /metrics adds what the running
    engine counted since the last scrape, and a new engine's totals to the old one's."""

    def counting(engine: FakeEngine, queried: int, hit: int) -> None:
        engine.counters = lambda: {  # type: ignore[method-assign]
            "prefix_cache_queried_tokens_total": queried,
            "prefix_cache_hit_tokens_total": hit,
        }

    async def scraped() -> tuple[float, float]:
        text = await (await h.client.get("/metrics")).text()
        values = {
            s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
        }
        return (
            values["appliance_prefix_cache_queried_tokens_total"],
            values["appliance_prefix_cache_hit_tokens_total"],
        )

    assert await scraped() == (0, 0)  # the fake engine has no prefix cache
    counting(h.engine, 1_000, 300)
    assert await scraped() == (1_000, 300)
    counting(h.engine, 1_500, 400)
    assert await scraped() == (1_500, 400)
    r = await h.client.post("/admin/engine/restart", headers=h.admin())
    assert r.status == 202
    await asyncio.sleep(0.05)
    await h.wait_ready()
    assert len(h.engines) == 2
    counting(h.engine, 200, 50)  # the new engine's own totals, from 0
    assert await scraped() == (1_700, 450)
    counting(h.engine, 260, 60)
    assert await scraped() == (1_760, 460)
