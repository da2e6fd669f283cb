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
