"""Long documents in parts, lane default deadlines: the real HTTP app, the fake engine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from appliance.client import parse_sse
from appliance.daemon.app import build_app
from tests.fakes import FakeEngine, WordTokenizer
from tests.integration.test_app_fake_engine import MODEL, Harness, _cfg

CTX = 512


class LongHarness(Harness):
    tok: WordTokenizer


@pytest.fixture
async def h(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LongHarness]:
    monkeypatch.delenv("APPLIANCE_ADMIN_TOKEN", raising=False)
    cfg = _cfg(
        tmp_path,
        server={"max_body_bytes": 1_000_000},
        engine={"max_model_len": CTX},
        admission={"lane_deadline_ms": {"realtime": 150}},
        long_context={
            "chunk_tokens": 128,
            "overlap_tokens": 16,
            "carry_head_tokens": 8,
            "intermediate_max_tokens": 12,
            "max_prompt_tokens": 5000,
        },
    )
    engines: list[FakeEngine] = []
    tok = WordTokenizer()

    def factory() -> FakeEngine:
        engines.append(FakeEngine(token_delay_s=0.001, max_model_len=CTX))
        return engines[-1]

    client = TestClient(TestServer(build_app(cfg, factory, tok)))
    await client.start_server()
    harness = LongHarness(client, engines, (tmp_path / "admin.token").read_text().strip())
    harness.tok = tok
    await harness.wait_ready()
    yield harness
    await client.close()


def _doc(words: int) -> str:
    return "Summarise this report: " + " ".join(f"w{i}" for i in range(words))


def _body(words: int, **kw) -> dict:
    body = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": _doc(words)},
        ],
        "max_tokens": 20,
        "long_context": "chunk",
    }
    body.update(kw)
    return body


async def test_refine_reads_every_part_in_order_and_answers(h: LongHarness):
    r = await h.client.post("/v1/chat/completions", json=_body(4 * CTX))
    assert r.status == 200, await r.text()
    out = await r.json()
    seen = h.engine.seen
    n = out["long_context"]["parts"]
    assert out["long_context"] == {"strategy": "refine", "parts": n, "passes": n}
    assert n == len(seen) and n >= 4 * CTX // 128
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["choices"][0]["message"]["content"].startswith("tok0")
    # Every pass fits the context with room for its answer.
    for req in seen:
        assert len(req.prompt_token_ids) + req.sampling.max_tokens <= CTX
    assert [r.sampling.max_tokens for r in seen] == [12] * (n - 1) + [20]
    prompts = [h.tok.decode(r.prompt_token_ids) for r in seen]
    # The system prompt and the request's opening go into every pass ...
    for p in prompts:
        assert "terse." in p and "Summarise this report:" in p, p
    # ... each part once (overlap aside), in order, with the answer so far from pass 2 on.
    assert "w0 " in prompts[0] and f"w{4 * CTX - 1}" in prompts[-1]
    assert "Answer so far:" not in prompts[0]
    assert all("Answer so far: tok0" in p for p in prompts[1:])
    assert f"Part {n} of {n}:" in prompts[-1]
    usage = out["usage"]
    assert usage["prompt_tokens"] == sum(len(r.prompt_token_ids) for r in seen)
    assert usage["completion_tokens"] == 12 * (n - 1) + 20


async def test_map_reduce_answers_parts_then_combines(h: LongHarness):
    r = await h.client.post(
        "/v1/chat/completions", json=_body(2 * CTX, long_context_strategy="map_reduce")
    )
    assert r.status == 200, await r.text()
    out = await r.json()
    n = out["long_context"]["parts"]
    assert out["long_context"] == {"strategy": "map_reduce", "parts": n, "passes": n + 1}
    prompts = [h.tok.decode(r.prompt_token_ids) for r in h.engine.seen]
    assert len(prompts) == n + 1
    assert all("Answer so far" not in p for p in prompts)
    assert "Answers per part:" in prompts[-1] and f"{n}. tok0" in prompts[-1]


async def test_stream_shows_progress_then_the_answer(h: LongHarness):
    r = await h.client.post("/v1/chat/completions", json=_body(2 * CTX, stream=True))
    assert r.status == 200
    events = parse_sse(await r.text())
    assert events[-1].done
    chunks = [e.json() for e in events[:-1]]
    progress = [c["long_context"] for c in chunks if "long_context" in c]
    n = progress[-1]["parts"]
    assert [p["part"] for p in progress] == list(range(1, n + 1))
    assert all(p["stage"] == "refine" for p in progress)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text.startswith("tok0") and chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_status_shows_a_chunked_request_in_progress(h: LongHarness):
    h.engine.token_delay_s = 0.01
    task = asyncio.create_task(h.client.post("/v1/chat/completions", json=_body(3 * CTX)))
    active: list = []
    for _ in range(300):
        snap = await (await h.client.get("/admin/status", headers=h.admin())).json()
        active = snap["long_context"]["active"]
        if active and active[0]["part"] >= 2:
            break
        await asyncio.sleep(0.01)
    assert active and active[0]["stage"] == "refine" and active[0]["parts"] >= 3
    assert (await task).status == 200
    snap = await (await h.client.get("/admin/status", headers=h.admin())).json()
    assert snap["long_context"] == {"active": [], "completed_total": 1}


@pytest.mark.parametrize(
    ("change", "status", "param", "words"),
    [
        # Not chunked: vLLM's own answer to a prompt over the context.
        ({"long_context": None}, 400, "input_tokens", "maximum context length is 512 tokens"),
        ({"long_context": "chunk", "tools": []}, 400, "tools", "not served for a document"),
        ({"long_context": "yes"}, 400, "long_context", "must be one of ['chunk', 'error']"),
        ({"long_context_strategy": "x"}, 400, "long_context_strategy", "must be one of"),
    ],
)
async def test_long_prompt_without_chunking_or_with_bad_fields(
    h: LongHarness, change: dict, status: int, param: str, words: str
):
    body = _body(2 * CTX)
    body.update(change)
    if body["long_context"] is None:
        del body["long_context"]
    r = await h.client.post("/v1/chat/completions", json=body)
    assert r.status == status
    err = (await r.json())["error"]
    assert err["param"] == param and words in err["message"], err
    assert h.engine.seen == []


async def test_over_the_hard_cap_is_413_naming_it(h: LongHarness):
    r = await h.client.post("/v1/chat/completions", json=_body(6000))
    assert r.status == 413
    err = (await r.json())["error"]
    assert "long_context.max_prompt_tokens=5000" in err["message"] and err["param"] == "messages"
    assert h.engine.seen == []


async def test_deadline_during_the_parts_returns_the_answer_so_far(h: LongHarness):
    # 12 tokens a part: >= 0.12 s each on any machine, and over a dozen parts: >1 s in all
    h.engine.token_delay_s = 0.01
    r = await h.client.post("/v1/chat/completions", json=_body(4 * CTX, deadline_ms=400))
    assert r.status == 200
    out = await r.json()
    choice = out["choices"][0]
    assert choice["finish_reason"] == "deadline"
    assert choice["message"]["content"].startswith("tok0")
    assert out["long_context"]["passes"] < out["long_context"]["parts"]
    await asyncio.sleep(0.05)
    assert h.engine.running == set()  # the cut pass was aborted


async def test_realtime_lane_default_deadline_applies(h: LongHarness):
    h.engine.token_delay_s = 0.02
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}
    r = await h.client.post("/v1/chat/completions", json={**body, "priority": "realtime"})
    out = await r.json()
    # 150 ms for realtime here; 50 tokens of 20 ms take >= 1 s on any machine
    assert out["choices"][0]["finish_reason"] == "deadline"
    assert 0 < out["usage"]["completion_tokens"] < 50
    r = await h.client.post("/v1/chat/completions", json=body)  # interactive: no default
    assert (await r.json())["choices"][0]["finish_reason"] == "length"
    text = await (await h.client.get("/metrics")).text()
    assert 'appliance_deadline_expired_total{priority="realtime",stage="generating"} 1.0' in text
