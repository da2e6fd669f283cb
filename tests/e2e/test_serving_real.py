"""The serving foundation through the real daemon, real vLLM and the official openai client."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import openai
import pytest

from appliance.client import SseParser
from tests.conftest import Daemon

pytestmark = pytest.mark.engine

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _client(d: Daemon) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0)


async def _wait(predicate, timeout_s: float = 20.0, every_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(every_s)
    return predicate()


def test_readiness_was_503_while_starting_then_200(daemon: Daemon):
    assert daemon.ready_history[0] == (503, "starting"), daemon.ready_history
    assert daemon.ready_history[-1] == (200, "ready")
    assert daemon.get("/health/live")[0] == 200


async def test_chat_answer_through_openai_client(daemon: Daemon):
    client = _client(daemon)
    models = await client.models.list()
    assert [m.id for m in models.data] == [daemon.model_name]
    resp = await client.chat.completions.create(
        model=daemon.model_name, messages=QUESTION, temperature=0, max_tokens=32, seed=1
    )
    assert "Paris" in resp.choices[0].message.content
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.prompt_tokens > 10 and resp.usage.completion_tokens > 3


async def test_completion_and_stop_through_openai_client(daemon: Daemon):
    client = _client(daemon)
    resp = await client.completions.create(
        model=daemon.model_name, prompt="1, 2, 3, 4,", temperature=0, max_tokens=24, stop=[" 8"]
    )
    text = resp.choices[0].text
    assert "5" in text and " 8" not in text
    assert resp.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("kind", ["chat", "completion"])
async def test_streamed_text_equals_non_streamed_at_temperature_0(daemon: Daemon, kind: str):
    client = _client(daemon)
    if kind == "chat":
        kw = dict(
            model=daemon.model_name,
            messages=[{"role": "user", "content": "Name three fruits."}],
            temperature=0,
            max_tokens=40,
        )
        full = (await client.chat.completions.create(**kw)).choices[0].message.content
        parts = []
        stream = await client.chat.completions.create(stream=True, **kw)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
    else:
        kw = dict(model=daemon.model_name, prompt="The sky is", temperature=0, max_tokens=40)
        full = (await client.completions.create(**kw)).choices[0].text
        parts = []
        stream = await client.completions.create(stream=True, **kw)
        async for chunk in stream:
            parts.append(chunk.choices[0].text)
    assert full and "".join(parts) == full


async def test_sixteen_concurrent_streams_all_finish(daemon: Daemon):
    client = _client(daemon)

    async def one(i: int) -> tuple[str, str | None, int | None]:
        stream = await client.chat.completions.create(
            model=daemon.model_name,
            messages=[{"role": "user", "content": f"Count to {i + 3}."}],
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, finish, usage = [], None, None
        async for chunk in stream:
            if chunk.usage:
                usage = chunk.usage.completion_tokens
            for c in chunk.choices:
                text.append(c.delta.content or "")
                finish = c.finish_reason or finish
        return "".join(text), finish, usage

    results = await asyncio.gather(*(one(i) for i in range(16)))
    assert len(results) == 16
    for text, finish, usage in results:
        assert text and finish in ("stop", "length") and usage and usage > 0


async def test_disconnect_mid_stream_aborts_the_engine_request(daemon: Daemon):
    client = _client(daemon)
    stream = await client.chat.completions.create(
        model=daemon.model_name,
        messages=[{"role": "user", "content": "Write a long story."}],
        max_tokens=1500,
        stream=True,
        temperature=1.0,
        seed=3,
    )
    got = 0
    async for _chunk in stream:
        got += 1
        if got == 3:
            break
    assert daemon.status()["engine"]["unfinished"] >= 1
    await stream.close()

    def idle() -> bool:
        s = daemon.status()
        return s["engine"]["unfinished"] == 0 and s["admission"]["in_flight"] == 0

    assert await _wait(idle), daemon.status()


# Refused by the appliance (body, lanes, deadlines, unknown fields) or by vLLM's request
# models and sampling checks, with vLLM's messages.
BAD = [
    (b"{oops", 400, "not valid JSON"),
    (b'{"model": "\xc3\x28"}', 400, "not valid UTF-8"),
    ({"model": "nope", "messages": QUESTION}, 404, "`nope` does not exist"),
    ({"messages": QUESTION, "max_tokens": 4000}, 400, "cannot be greater than max_model_len"),
    ({"messages": [{"role": "user", "content": "word " * 2100}]}, 400, "maximum context length"),
    ({"messages": QUESTION, "temperature": -1}, 400, "temperature"),
    ({"messages": QUESTION, "top_p": 1.5}, 400, "top_p"),
    ({"messages": QUESTION, "seed": "x"}, 400, "seed: Input should be a valid integer"),
    ({"messages": QUESTION, "stop": [1]}, 400, "stop"),
    ({"messages": QUESTION, "priority": "vip"}, 400, "priority: must be one of"),
    ({"messages": QUESTION, "mirostat_tau": 5}, 400, "mirostat_tau: unknown field"),
    ({"prompt": [1, 99_999_999]}, 400, "out of vocabulary"),
    (
        b'{"model": "m", "messages": "' + b"a" * 1_100_000 + b'"}',
        413,
        "over the limit of 1048576 bytes",
    ),
]


async def test_bad_inputs_get_4xx_and_never_reach_the_engine(daemon: Daemon):
    before = daemon.status()["engine"]["counters"]["prompt_tokens_total"]
    async with aiohttp.ClientSession() as s:
        for body, status, words in BAD:
            if isinstance(body, dict):
                path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
                body = {"model": daemon.model_name, **body}
                r = await s.post(daemon.url + path, json=body)
            else:
                r = await s.post(
                    daemon.url + "/v1/chat/completions",
                    data=body,
                    headers={"Content-Type": "application/json"},
                )
            payload = await r.json()
            assert r.status == status, (body if isinstance(body, dict) else body[:40], payload)
            assert words in payload["error"]["message"], payload
    assert daemon.status()["engine"]["counters"]["prompt_tokens_total"] == before


async def test_openai_client_sees_typed_errors(daemon: Daemon):
    client = _client(daemon)
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="nope", messages=QUESTION)
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(
            model=daemon.model_name, messages=QUESTION, max_tokens=5000
        )
    assert "max_tokens" in str(err.value)


async def test_admin_without_token_is_401(daemon: Daemon):
    async with aiohttp.ClientSession() as s:
        for path in ["/admin/status", "/admin/events"]:
            r = await s.get(daemon.url + path)
            assert r.status == 401
        r = await s.post(
            daemon.url + "/admin/engine/restart", headers={"Authorization": "Bearer not-the-token"}
        )
        assert r.status == 401


async def test_queue_full_is_429_with_retry_after(daemon: Daemon):
    body = {"model": daemon.model_name, "messages": QUESTION, "max_tokens": 8, "priority": "batch"}
    async with aiohttp.ClientSession(headers=daemon.admin_headers) as s:
        assert (await s.post(daemon.url + "/admin/engine/pause")).status == 200
        try:
            waiting = [
                asyncio.create_task(s.post(daemon.url + "/v1/chat/completions", json=body))
                for _ in range(2)
            ]
            assert await _wait(
                lambda: daemon.status()["admission"]["queued"]["batch"] == 2, 10, 0.05
            )
            r = await s.post(daemon.url + "/v1/chat/completions", json=body)
            assert r.status == 429 and r.headers["Retry-After"] == "3"
            assert (await r.json())["error"]["type"] == "rate_limit_error"
        finally:
            assert (await s.post(daemon.url + "/admin/engine/resume")).status == 200
        assert [r.status for r in await asyncio.gather(*waiting)] == [200, 200]


async def test_graceful_restart_under_load_loses_no_request(daemon: Daemon):
    client = _client(daemon)
    before = daemon.status()["engine"]

    async def one(i: int) -> str:
        stream = await client.chat.completions.create(
            model=daemon.model_name,
            messages=[{"role": "user", "content": f"Tell me about {i}."}],
            max_tokens=48,
            stream=True,
        )
        parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        return "".join(parts)

    first = [asyncio.create_task(one(i)) for i in range(8)]
    assert await _wait(lambda: daemon.status()["admission"]["in_flight"] >= 4, 30, 0.1)
    async with aiohttp.ClientSession(headers=daemon.admin_headers) as s:
        r = await s.post(daemon.url + "/admin/engine/restart")
        assert r.status == 202
    ready_seen = []
    later = []
    for i in range(8):  # more requests arrive while the engine restarts
        later.append(asyncio.create_task(one(100 + i)))
        ready_seen.append(daemon.get("/health/ready")[1].get("reason"))
        await asyncio.sleep(0.5)
    results = await asyncio.gather(*first, *later, return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException) or not r]
    assert failures == [], failures
    assert "restarting" in ready_seen
    assert await _wait(lambda: daemon.get("/health/ready")[0] == 200, 120)
    after = daemon.status()["engine"]
    assert after["restarts_total"].get("manual", 0) == before["restarts_total"].get("manual", 0) + 1
    assert after["started_at_s"] > before["started_at_s"]
    metrics = daemon_metrics(daemon)
    assert 'appliance_engine_restarts_total{cause="manual"}' in metrics


def daemon_metrics(d: Daemon) -> str:
    import urllib.request

    with urllib.request.urlopen(d.url + "/metrics", timeout=10) as resp:
        return resp.read().decode()


async def test_metrics_carry_the_contract_series(daemon: Daemon):
    client = _client(daemon)
    await client.chat.completions.create(model=daemon.model_name, messages=QUESTION, max_tokens=8)
    text = daemon_metrics(daemon)
    for name in [
        "appliance_requests_total",
        "appliance_ttft_seconds_bucket",
        "appliance_tpot_seconds_bucket",
        "appliance_e2e_seconds_bucket",
        "appliance_requests_in_flight",
        'appliance_queue_depth{priority="realtime"}',
        "appliance_kv_cache_usage_ratio",
        "appliance_generated_tokens_total",
        "appliance_concurrency_limit 8.0",
    ]:
        assert name in text, name
    ok = [ln for ln in text.splitlines() if ln.startswith('appliance_requests_total{status="ok"}')]
    assert ok and float(ok[0].split()[-1]) >= 1


def _prefix_cache_tokens(d: Daemon) -> tuple[int, int]:
    counters = d.status()["engine"]["counters"]
    return counters["prefix_cache_queried_tokens_total"], counters["prefix_cache_hit_tokens_total"]


def _metric(text: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return next(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    )


async def test_a_replayed_prompt_hits_the_prefix_cache_and_a_run_tag_misses_it(daemon: Daemon):
    """Why the benches tag each run's prompts: vLLM keeps a served prompt's blocks, and the
    same prompt again skips most of its prefill; the tag makes it a prompt of its own."""
    from appliance.bench_runner import document_prompt
    from bench.goodput import run_tag

    prompt = document_prompt(5, 918_273, 400)  # ~500 tokens: several 128-token blocks
    client = _client(daemon)

    async def send(text: str) -> tuple[int, int, int]:
        before = _prefix_cache_tokens(daemon)
        resp = await client.chat.completions.create(
            model=daemon.model_name,
            messages=[{"role": "user", "content": text}],
            max_tokens=1,
        )
        # The stat logger records the step that scheduled the prompt: wait for its lookup.
        assert await _wait(lambda: _prefix_cache_tokens(daemon)[0] > before[0], 10.0)
        after = _prefix_cache_tokens(daemon)
        return resp.usage.prompt_tokens, after[0] - before[0], after[1] - before[1]

    tokens, _, _ = await send(prompt)
    assert tokens > 3 * 128
    scraped = daemon_metrics(daemon)
    _, queried, replay_hits = await send(prompt)
    assert queried >= tokens and replay_hits >= 3 * 128, (queried, replay_hits)
    # /metrics carries the same counts (the series outlive engine restarts: compare deltas).
    text = daemon_metrics(daemon)
    for name, delta in (("hit", replay_hits), ("queried", queried)):
        series = f"appliance_prefix_cache_{name}_tokens_total"
        assert _metric(text, series) - _metric(scraped, series) == delta, series
    _, _, tagged_hits = await send(run_tag() + prompt)
    # What the tagged prompt still shares is the chat template ahead of the user's text,
    # under one block.
    assert tagged_hits < 128, tagged_hits


async def test_admin_status_and_events(daemon: Daemon):
    snap = daemon.status()
    eng = snap["engine"]
    assert eng["state"] == "ready" and eng["device"] == "cpu"
    assert eng["kv_cache_tokens"] == eng["num_blocks"] * eng["block_size"]
    assert eng["child_pids"]
    async with aiohttp.ClientSession(headers=daemon.admin_headers) as s:
        r = await s.get(daemon.url + "/admin/events?history=5")
        assert r.status == 200
        parser, sse = SseParser(), None
        while sse is None:
            sse = parser.feed(await asyncio.wait_for(r.content.readline(), 5))
        event = sse.json()
        assert {"seq", "ts_s", "kind", "reason", "data"} <= set(event)
