"""vLLM's serving layer under the appliance, over the fake engine: the endpoints vLLM
serves, its probes, and the appliance's lanes and deadlines through them."""

from __future__ import annotations

import asyncio
import json

from appliance.client import parse_sse
from tests.integration.test_app_fake_engine import MODEL, Harness, _chat


async def _sse(resp) -> list[str]:  # type: ignore[no-untyped-def]
    return [event.data for event in parse_sse(await resp.text())]


async def test_vllm_probes_answer_as_vllm_does(h: Harness):
    for method, path in (("GET", "/health"), ("GET", "/ping"), ("POST", "/ping")):
        r = await h.client.request(method, path)
        assert (r.status, await r.read()) == (200, b""), path
    r = await h.client.get("/version")
    body = await r.json()
    assert r.status == 200 and set(body) == {"version", "appliance"}


async def test_health_is_503_while_the_engine_is_dead(h: Harness):
    h.engine.dead = True
    r = await h.client.get("/health")
    assert r.status == 503 and await r.read() == b""


async def test_stream_cut_at_its_deadline_ends_with_a_deadline_chunk(h: Harness):
    # The fake engine sleeps per token: 50 take >= 1 s anywhere, so the 150 ms deadline is first.
    h.engine.token_delay_s = 0.02
    r = await h.client.post(
        "/v1/chat/completions", json=_chat(max_tokens=50, deadline_ms=150, stream=True)
    )
    frames = await _sse(r)
    assert r.status == 200 and frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "deadline"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text.startswith("tok0") and "tok49" not in text
    assert h.engine.aborted  # the engine request was stopped, not run to 50 tokens


async def test_every_open_choice_is_cut_at_the_deadline(h: Harness):
    h.engine.token_delay_s = 0.02  # >= 1 s for 50 tokens on any machine: the deadline is first
    r = await h.client.post("/v1/chat/completions", json=_chat(max_tokens=50, n=2, deadline_ms=150))
    body = await r.json()
    assert r.status == 200
    assert [c["finish_reason"] for c in body["choices"]] == ["deadline", "deadline"]
    assert body["choices"][0]["message"]["content"].startswith("tok0")


async def test_lane_becomes_the_engine_priority(h: Harness):
    for lane, priority in (("realtime", 0), ("interactive", 1), ("batch", 2)):
        r = await h.client.post("/v1/chat/completions", json=_chat(priority=lane))
        assert r.status == 200
        assert h.engine.seen[-1].priority == priority, lane


async def test_open_max_tokens_gets_the_configured_default(h: Harness):
    body = _chat()
    del body["max_tokens"]
    r = await h.client.post("/v1/chat/completions", json=body)
    assert (await r.json())["usage"]["completion_tokens"] == 8  # engine.max_tokens_default


async def test_responses_tokenize_and_detokenize(h: Harness):
    r = await h.client.post(
        "/v1/responses", json={"model": MODEL, "input": "hello", "max_output_tokens": 3}
    )
    body = await r.json()
    assert r.status == 200 and body["object"] == "response"
    assert body["output"][-1]["content"][0]["text"].startswith("tok0")
    r = await h.client.post("/tokenize", json={"model": MODEL, "prompt": "hello there"})
    tokens = (await r.json())["tokens"]
    assert r.status == 200 and tokens
    r = await h.client.post("/detokenize", json={"model": MODEL, "tokens": tokens})
    assert (await r.json())["prompt"] == "hello there"
    assert h.engine.seen[-1].sampling.max_tokens == 3  # only the responses call generated


async def test_models_lists_the_served_name_with_its_context(h: Harness):
    body = await (await h.client.get("/v1/models")).json()
    assert [(m["id"], m["max_model_len"]) for m in body["data"]] == [(MODEL, 64)]


async def test_queue_full_on_a_stream_is_a_429_status_not_an_event(h: Harness):
    h.svc.supervisor.pause()
    first = asyncio.create_task(
        h.client.post("/v1/chat/completions", json=_chat(priority="batch", stream=True))
    )
    await asyncio.sleep(0.05)
    r = await h.client.post("/v1/chat/completions", json=_chat(priority="batch", stream=True))
    assert r.status == 429 and r.headers["Retry-After"] == "7"
    h.svc.supervisor.resume()
    assert (await first).status == 200


async def test_responses_stream_is_vllms_event_stream(h: Harness):
    r = await h.client.post(
        "/v1/responses",
        json={"model": MODEL, "input": "hello", "max_output_tokens": 3, "stream": True},
    )
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    stream = parse_sse(await r.text())
    events = [e.event for e in stream]
    assert events[0] == "response.created" and events[-1] == "response.completed"
    done = stream[-1].json()
    assert done["response"]["output"][-1]["content"][0]["text"].startswith("tok0")
