"""Keys, lanes, rate limits, usage and the audit log through the HTTP app (fake engine).

The same paths run on the real engine in tests/e2e/test_tenancy_real.py; here a fake engine
makes the timing exact (deadlines) and the suite fast.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from appliance.domain.api_keys import KeySpec
from appliance.domain.lanes import Lane
from appliance.services.audit_log import digest
from appliance.services.key_store import KeyStore
from appliance.services.request_ledger import prompt_of
from tests.integration.test_app_fake_engine import MODEL, Harness, _cfg, _chat, running

KEYS = {
    "team-a": KeySpec("team-a", Lane.INTERACTIVE, requests_per_min=3),
    "strict": KeySpec("strict", Lane.BATCH),
    "batchy": KeySpec("batchy", Lane.BATCH, downgrade=True),
    "tokens": KeySpec("tokens", Lane.REALTIME, tokens_per_min=200),
}


class Tenants(Harness):
    secrets: dict[str, str]
    state_dir: Path

    def auth(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secrets[name]}"}

    async def chat(self, name: str | None, **kw: Any) -> Any:
        headers = self.auth(name) if name else {}
        return await self.client.post("/v1/chat/completions", json=_chat(**kw), headers=headers)

    async def audit(self) -> list[dict[str, Any]]:
        log = self.svc.tenancy.audit
        await log.flush()
        return list(log.export(None, None))


@pytest.fixture
async def t(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Tenants]:
    monkeypatch.delenv("APPLIANCE_ADMIN_TOKEN", raising=False)
    store = KeyStore(tmp_path / "appliance.db")
    secrets = {name: store.add(spec) for name, spec in KEYS.items()}
    store.close()
    async with running(_cfg(tmp_path), Tenants, token_delay_s=0.05, start_delay_s=0.05) as harness:
        harness.secrets, harness.state_dir = secrets, tmp_path
        yield harness


async def test_a_key_is_needed_once_keys_exist(t: Tenants):
    r = await t.chat(None)
    assert r.status == 401 and (await r.json())["error"]["code"] == "invalid_api_key"
    r = await t.client.post(
        "/v1/chat/completions", json=_chat(), headers={"Authorization": "Bearer sk-app-nope"}
    )
    assert r.status == 401 and "sk-app-nope" not in await r.text()
    r = await t.client.get("/v1/models", headers=t.auth("strict"))
    assert r.status == 200


async def test_a_lane_above_the_ceiling_is_403_unless_the_key_is_downgraded(t: Tenants):
    r = await t.chat("strict", priority="interactive")
    err = (await r.json())["error"]
    assert r.status == 403 and err["param"] == "priority" and err["code"] == "lane_not_allowed"
    assert "interactive" in err["message"] and "ceiling is batch" in err["message"]
    r = await t.chat("strict")  # no priority asked: its ceiling, never a 403
    assert r.status == 200
    r = await t.chat("batchy", priority="realtime")
    assert r.status == 200 and r.headers["x-appliance-lane"] == "batch"
    lanes = {(rec["key_name"], rec["status"]): rec["lane"] for rec in await t.audit()}
    assert lanes == {
        ("strict", "forbidden"): "interactive",
        ("strict", "ok"): "batch",
        ("batchy", "ok"): "batch",
    }


async def test_requests_per_minute_answer_429_with_openai_headers(t: Tenants):
    remaining = []
    for _ in range(3):
        r = await t.chat("team-a", max_tokens=1)
        assert r.status == 200
        assert r.headers["x-ratelimit-limit-requests"] == "3"
        remaining.append(r.headers["x-ratelimit-remaining-requests"])
    assert remaining == ["2", "1", "0"]
    r = await t.chat("team-a", max_tokens=1)
    err = (await r.json())["error"]
    assert r.status == 429 and err["code"] == "rate_limit_exceeded"
    assert "team-a" in err["message"] and "3 requests per minute" in err["message"]
    assert 1 <= int(r.headers["Retry-After"]) <= 60
    assert r.headers["x-ratelimit-remaining-requests"] == "0"
    assert r.headers["x-ratelimit-reset-requests"].endswith("s")
    # Another key is not held back by team-a's limit.
    assert (await t.chat("strict")).status == 200


async def test_tokens_per_minute_are_settled_with_what_was_used(t: Tenants):
    # Charged up front: the prompt's characters / 4 + 1, plus max_tokens; once answered, the
    # real count replaces that estimate in the key's window.
    def estimate(body: dict[str, Any]) -> int:
        return len(prompt_of(body)) // 4 + 1 + body["max_tokens"]

    first = await t.chat("tokens", max_tokens=20)
    assert first.status == 200 and first.headers["x-ratelimit-limit-tokens"] == "200"
    assert int(first.headers["x-ratelimit-remaining-tokens"]) == 200 - estimate(
        _chat(max_tokens=20)
    )
    used = (await first.json())["usage"]["total_tokens"]
    second = await t.chat("tokens", max_tokens=10)
    assert second.status == 200
    assert int(second.headers["x-ratelimit-remaining-tokens"]) == 200 - used - estimate(
        _chat(max_tokens=10)
    )
    r = await t.chat("tokens", max_tokens=300)  # more than the key's whole minute
    assert r.status == 429 and "fewer tokens" in (await r.json())["error"]["message"]


async def test_usage_and_audit_match_the_requests_one_to_one(t: Tenants):
    sent = [("team-a", 200), ("team-a", 200), ("strict", 200), ("strict", 403), (None, 401)]
    bodies = []
    for name, expect in sent:
        kw = {"priority": "interactive"} if expect == 403 else {}
        body = _chat(**kw)
        bodies.append(body)
        r = await t.client.post(
            "/v1/chat/completions", json=body, headers=t.auth(name) if name else {}
        )
        assert r.status == expect
    answers = {}
    records = await t.audit()
    assert [(rec["key_name"], rec["http_status"]) for rec in records] == [
        (name or "-", status) for name, status in sent
    ]
    for rec, body in zip(records, bodies, strict=True):
        # An unauthenticated body is never read: its record hashes no prompt (the empty one).
        prompt = "" if rec["http_status"] == 401 else prompt_of(body)
        assert rec["prompt_sha256"] == digest(prompt)
        assert rec["prompt_text"] is None  # audit.store_text is off by default
        assert rec["model"] == ("" if rec["http_status"] == 401 else MODEL)
        assert rec["endpoint"] == "chat"
        answers[rec["status"]] = rec["answer_sha256"]
    assert answers["ok"] == digest("tok0 tok1 tok2 tok3 ")
    assert answers["forbidden"] is None and answers["unauthorized"] is None
    r = await t.client.get("/admin/usage", headers=t.admin())
    by_key = {k["key"]: k for k in (await r.json())["keys"]}
    assert by_key["team-a"]["requests"] == 2 and by_key["team-a"]["answered"] == 2
    assert by_key["team-a"]["completion_tokens"] == 8
    assert by_key["strict"]["by_status"] == {"ok": 1, "forbidden": 1}
    assert by_key["-"]["by_status"] == {"unauthorized": 1}
    metrics = await (await t.client.get("/metrics")).text()
    assert 'appliance_key_requests_total{key="team-a",status="ok"} 2.0' in metrics
    assert 'appliance_key_tokens_total{key="team-a",kind="completion"} 8.0' in metrics
    for secret in t.secrets.values():
        assert secret not in metrics


async def test_a_deadline_cut_and_a_queue_refusal_are_audited(t: Tenants):
    r = await t.chat("strict", max_tokens=8, deadline_ms=180)
    body = await r.json()
    assert r.status == 200 and body["choices"][0]["finish_reason"] == "deadline"
    records = await t.audit()
    assert records[-1]["status"] == "deadline" and records[-1]["finish_reason"] == "deadline"
    assert records[-1]["answer_sha256"] == digest(body["choices"][0]["message"]["content"])
    # The batch lane holds 1 waiting request (the harness config): a burst of 4 overflows it.
    gets = [asyncio.create_task(t.chat("strict", max_tokens=8)) for _ in range(4)]
    statuses = sorted([(await g).status for g in gets])
    assert statuses[0] == 200 and statuses[-1] == 429
    records = await t.audit()
    assert sorted(rec["http_status"] for rec in records[-4:]) == statuses
    refused = [rec["status"] for rec in records if rec["http_status"] == 429]
    assert refused == ["rejected"] * statuses.count(429)


async def test_a_revoked_key_is_refused_within_a_second(t: Tenants):
    assert (await t.chat("strict", max_tokens=1)).status == 200
    other_process = KeyStore(t.state_dir / "appliance.db")
    assert other_process.revoke("strict")
    other_process.close()
    loop = asyncio.get_running_loop()
    revoked_at = loop.time()
    while (await t.chat("strict", max_tokens=1)).status != 401:
        assert loop.time() - revoked_at < 1.0, "still served a second after the revoke"
        await asyncio.sleep(0.05)
    r = await t.client.get("/admin/keys", headers=t.admin())
    assert "strict" not in {k["name"] for k in (await r.json())["keys"]}


async def test_a_bad_usage_range_names_the_parameter(t: Tenants):
    r = await t.client.get("/admin/usage?from=yesterday", headers=t.admin())
    assert r.status == 400 and (await r.json())["error"]["param"] == "from"
    r = await t.client.get("/admin/usage?from=2026-12-04&to=2026-12-01", headers=t.admin())
    assert r.status == 400 and "after" in (await r.json())["error"]["message"]
