"""Thermal derating end to end: real engine load heats the simulated GPU, the limit drops,
it cools, the limit comes back."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from tests.conftest import Daemon

pytestmark = pytest.mark.engine


async def test_load_heats_past_85_derates_and_recovers(daemon: Daemon):
    base = daemon.status()["admission"]["base_limit"]
    async with aiohttp.ClientSession(headers=daemon.admin_headers) as admin:
        # A hot room: idle stays cool (~46 °C), full engine load would reach ~96 °C.
        r = await admin.post(
            daemon.url + "/admin/telemetry/faults", json={"name": "hot_room", "delta_c": 15}
        )
        assert r.status == 200
    # ignore_eos + min_tokens: the load holds until the test cancels it. An essay that ends
    # on its own (sooner on a faster engine) would let the room cool before it derates.
    body = {
        "model": daemon.model_name,
        "max_tokens": 1000,
        "min_tokens": 1000,
        "ignore_eos": True,
        "stream": True,
        "messages": [{"role": "user", "content": "Write a very long essay."}],
    }
    trace: list[tuple[float, float, int, str]] = []
    started = time.monotonic()

    def observe() -> dict:
        snap = daemon.status()
        gpu = snap["telemetry"]["gpus"][0]
        trace.append(
            (
                time.monotonic() - started,
                gpu["core_temp_c"],
                snap["admission"]["limit"],
                snap["telemetry"]["thermal"]["level"],
            )
        )
        return snap

    async with aiohttp.ClientSession() as s:

        async def stream() -> None:
            async with s.post(daemon.url + "/v1/chat/completions", json=body) as resp:
                async for _ in resp.content:
                    pass

        load = [asyncio.create_task(stream()) for _ in range(base)]
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                if observe()["admission"]["limit"] < base:
                    break
                await asyncio.sleep(0.5)
            assert trace[-1][2] < base, trace
            await asyncio.sleep(4)  # hold the load a little: the limit must not bounce
            observe()
        finally:
            for t in load:
                t.cancel()
            await asyncio.gather(*load, return_exceptions=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        snap = observe()
        if snap["admission"]["limit"] == base and snap["telemetry"]["thermal"]["level"] == "normal":
            break
        await asyncio.sleep(0.5)
    assert trace[-1][2] == base and trace[-1][3] == "normal", trace
    async with aiohttp.ClientSession(headers=daemon.admin_headers) as admin:
        await admin.delete(daemon.url + "/admin/telemetry/faults")
    peak = max(t for _, t, _, _ in trace)
    hot = [ts for ts, t, _, _ in trace if t >= 85]
    derated = [ts for ts, _, lim, _ in trace if lim < base]
    report = {
        "peak_core_c": round(peak, 2),
        "overshoot_above_85_c": round(max(0.0, peak - 85), 2),
        "time_derated_s": round(derated[-1] - derated[0], 1) if derated else 0.0,
        "time_above_85_s": round(hot[-1] - hot[0], 1) if hot else 0.0,
        "lowest_limit": min(lim for _, _, lim, _ in trace),
    }
    (daemon.state_dir / "thermal_report.json").write_text(json.dumps(report, indent=1))
    print("thermal report:", report)
    assert peak >= 85 and report["lowest_limit"] < base
    events = [e["kind"] for e in daemon.status()["events"]]
    assert "thermal" in events
