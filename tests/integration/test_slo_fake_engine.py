"""The availability SLO through the real app: a graceful restart under load spends no error
budget, an engine crash does; the same figures in /metrics, the history and /admin/status."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_app_fake_engine import Harness, _chat


async def _slo(h: Harness) -> dict[tuple[str, str], float]:
    """(series, label value) -> value for the SLO series of a live scrape."""
    text = await (await h.client.get("/metrics")).text()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "appliance_slo_requests_total":
                out[("requests", s.labels["outcome"])] = s.value
            elif s.name == "appliance_slo_ready_seconds_total":
                out[("seconds", s.labels["state"])] = s.value
            elif s.name == "appliance_availability_ratio":
                out[("availability", s.labels["window"])] = s.value
            elif s.name == "appliance_error_budget_remaining_ratio":
                out[("budget", "30d")] = s.value
    return out


async def _flow(h: Harness, n: int) -> list[int]:
    async def one(i: int) -> int:
        r = await h.client.post("/v1/chat/completions", json=_chat(max_tokens=8, stream=i % 2 == 0))
        await r.read()
        return r.status

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def _status_availability(h: Harness) -> dict:
    # The sampler's tick, now: one history row, then availability from the stored rows.
    await asyncio.to_thread(h.svc.history.sample_once)
    r = await h.client.get("/admin/status", headers=h.admin())
    return (await r.json())["availability"]


async def test_slo_series_exist_at_zero_from_the_start(h: Harness):
    slo = await _slo(h)
    for key in (("requests", "good"), ("requests", "bad"), ("requests", "excluded")):
        assert slo[key] == 0
    assert slo[("seconds", "down")] == 0 and slo[("seconds", "up")] >= 0
    assert set(k for k, _ in slo) >= {"availability", "budget"}


async def test_graceful_restart_under_load_burns_no_budget(h: Harness):
    h.engine.token_delay_s = 0.01
    first = asyncio.create_task(_flow(h, 4))
    await asyncio.sleep(0.02)
    r = await h.client.post("/admin/engine/restart", headers=h.admin())
    assert r.status == 202
    during = asyncio.create_task(_flow(h, 4))  # queued through the restart
    assert await first + await during == [200] * 8
    await h.wait_ready()
    assert h.svc.supervisor.restarts_total == {"manual": 1}
    slo = await _slo(h)
    assert slo[("requests", "good")] == 8 and slo[("requests", "bad")] == 0
    assert slo[("seconds", "down")] == 0
    assert slo[("seconds", "excluded")] > 0  # the restart's time, planned: not counted
    avail = await _status_availability(h)
    assert avail["windows"]["1d"]["ratio"] == 1.0
    assert avail["windows"]["30d"]["bad"] == 0 and avail["windows"]["30d"]["down_s"] == 0
    assert avail["budget"]["remaining_ratio"] == 1.0


async def test_engine_crash_burns_budget(h: Harness):
    assert await _flow(h, 2) == [200, 200]
    h.engine.token_delay_s = 0.02
    r = await h.client.post("/v1/chat/completions", json=_chat(stream=True, max_tokens=50))
    await r.content.readline()
    h.engine.dead = True  # dies mid-answer: that request fails
    await r.read()
    for _ in range(400):
        ready = await h.client.get("/health/ready")
        if ready.status == 503:
            break
        await asyncio.sleep(0.005)
    assert (await ready.json())["reason"] == "engine_dead"
    refused = await h.client.post("/v1/chat/completions", json=_chat())
    assert refused.status == 503  # refused while dead: unplanned, so bad too
    await h.wait_ready()
    assert h.svc.supervisor.restarts_total == {"engine_dead": 1}
    slo = await _slo(h)
    assert slo[("requests", "good")] == 2
    assert slo[("requests", "bad")] >= 2
    assert slo[("seconds", "down")] > 0
    avail = await _status_availability(h)
    day = avail["windows"]["1d"]
    assert day["bad"] >= 2 and day["down_s"] > 0 and day["ratio"] < 0.999
    assert avail["budget"]["remaining_ratio"] < 0  # one crash in a short life overspends
    scraped = await _slo(h)
    assert scraped[("availability", "1d")] == day["ratio"]
    assert scraped[("budget", "30d")] == avail["budget"]["remaining_ratio"]


async def test_pause_is_planned_and_burns_nothing(h: Harness):
    await h.client.post("/admin/engine/pause", headers=h.admin())
    await asyncio.sleep(0.05)
    ready = await h.client.get("/health/ready")
    assert ready.status == 503
    await h.client.post("/admin/engine/resume", headers=h.admin())
    assert await _flow(h, 2) == [200, 200]
    slo = await _slo(h)
    assert slo[("requests", "bad")] == 0 and slo[("seconds", "down")] == 0
    assert slo[("seconds", "excluded")] >= 0.05
