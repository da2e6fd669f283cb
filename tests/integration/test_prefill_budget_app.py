"""The prefill budget through the app: measured from real first tokens (fake engine), shown in
/admin/status, /metrics and the event log; manual mode drops it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.integration.test_app_fake_engine import _cfg, _chat, running


async def _metric(client, name: str) -> float:  # type: ignore[no-untyped-def]
    text = await (await client.get("/metrics")).text()
    line = next(ln for ln in text.splitlines() if ln.startswith(name + " "))
    return float(line.split()[1])


async def test_auto_mode_rates_prefill_and_sets_a_budget(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("APPLIANCE_ADMIN_TOKEN", raising=False)
    cfg = _cfg(tmp_path, controller={"mode": "auto", "tick_s": 0.05})
    async with running(cfg, token_delay_s=0.02) as h:
        assert (await (await h.client.get("/admin/status", headers=h.admin())).json())[
            "controller"
        ]["prefill"]["budget_tokens"] is None
        for _ in range(5):
            r = await h.client.post("/v1/chat/completions", json=_chat())
            assert r.status == 200
        budget = None
        for _ in range(100):
            status = await (await h.client.get("/admin/status", headers=h.admin())).json()
            budget = status["controller"]["prefill"]["budget_tokens"]
            if budget:
                break
            await asyncio.sleep(0.05)
        prefill = status["controller"]["prefill"]
        assert budget and budget >= 1, prefill
        assert prefill["rate_tok_s"] > 0 and "prefill budget" in prefill["reason"]
        assert status["admission"]["prefill_budget_tokens"] == budget
        assert status["admission"]["prefill_outstanding_tokens"] == 0
        assert await _metric(h.client, "appliance_prefill_budget_tokens") == budget
        assert await _metric(h.client, "appliance_prefill_outstanding_tokens") == 0
        kinds = [e.kind for e in h.svc.events.recent(100)]
        assert "prefill_budget" in kinds

        r = await h.client.put(
            "/admin/controller", json={"mode": "manual", "limit": 2}, headers=h.admin()
        )
        assert r.status == 200
        status = await (await h.client.get("/admin/status", headers=h.admin())).json()
        assert status["admission"]["prefill_budget_tokens"] is None
        assert "manual mode" in status["controller"]["prefill"]["reason"]
        assert await _metric(h.client, "appliance_prefill_budget_tokens") == 0


async def test_auto_mode_sheds_what_would_start_too_late_and_counts_it(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("APPLIANCE_ADMIN_TOKEN", raising=False)
    # One slot, and a shed threshold of 0.05 s (0.01 x the 5 s SLO) against a fake engine
    # that prefills a ~4-token prompt in 0.02 s: a handful queued ahead is too many.
    cfg = _cfg(
        tmp_path,
        controller={"mode": "auto", "tick_s": 0.05, "max_limit": 1, "shed_above_ttft_ratio": 0.01},
    )
    async with running(cfg, token_delay_s=0.02) as h:
        for _ in range(5):
            assert (await h.client.post("/v1/chat/completions", json=_chat())).status == 200
        for _ in range(100):
            status = await (await h.client.get("/admin/status", headers=h.admin())).json()
            if (
                status["admission"]["shed_above_s"]
                and status["controller"]["prefill"]["rate_tok_s"]
            ):
                break
            await asyncio.sleep(0.05)
        assert status["admission"]["shed_above_s"] == 0.05
        assert status["controller"]["prefill"]["shed_above_s"] == 0.05
        burst = [h.client.post("/v1/chat/completions", json=_chat(max_tokens=8)) for _ in range(8)]
        responses = await asyncio.gather(*burst)
        shed = [r for r in responses if r.status == 429]
        assert shed and any(r.status == 200 for r in responses)
        body = await shed[0].json()
        assert body["error"]["code"] == "ttft_unreachable", body
        assert "shed_above_ttft_ratio" in body["error"]["message"]
        assert int(shed[0].headers["Retry-After"]) >= 1
        text = await (await h.client.get("/metrics")).text()
        assert (
            f'appliance_admission_shed_total{{priority="interactive"}} {float(len(shed))}' in text
        )
        status = await (await h.client.get("/admin/status", headers=h.admin())).json()
        assert status["controller"]["prefill"]["shed_total"] == len(shed)

        # Manual mode: the operator's limit and the queue's bounds alone, nothing shed.
        r = await h.client.put(
            "/admin/controller", json={"mode": "manual", "limit": 1}, headers=h.admin()
        )
        assert r.status == 200
        status = await (await h.client.get("/admin/status", headers=h.admin())).json()
        assert status["admission"]["shed_above_s"] is None
        burst = [h.client.post("/v1/chat/completions", json=_chat(max_tokens=8)) for _ in range(8)]
        assert all(r.status == 200 for r in await asyncio.gather(*burst))
