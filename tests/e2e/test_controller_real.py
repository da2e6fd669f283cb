"""The batch controller on the real engine: a step load makes it move and then settle."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests.conftest import Daemon

pytestmark = pytest.mark.engine


async def test_step_load_makes_the_controller_settle(daemon: Daemon):
    body = {
        "model": daemon.model_name,
        "max_tokens": 12,
        "messages": [{"role": "user", "content": "Say something short."}],
    }
    limits: list[tuple[float, int]] = []
    stop = asyncio.Event()
    async with (
        aiohttp.ClientSession(headers=daemon.admin_headers) as admin,
        aiohttp.ClientSession() as client,
    ):
        async with admin.put(
            daemon.url + "/admin/controller", json={"mode": "auto", "min": 2, "max": 16}
        ) as r:
            assert r.status == 200
            assert (await r.json())["mode"] == "auto"

        async def worker() -> int:
            done = 0
            while not stop.is_set():
                async with client.post(daemon.url + "/v1/chat/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                    done += 1
            return done

        try:
            # The step: from idle to 20 closed-loop clients, more than the limit admits.
            workers = [asyncio.create_task(worker()) for _ in range(20)]
            t0 = time.monotonic()
            while time.monotonic() - t0 < 75:
                limits.append((time.monotonic() - t0, daemon.status()["admission"]["base_limit"]))
                await asyncio.sleep(1)
            stop.set()
            done = sum(await asyncio.gather(*workers))
        finally:
            async with admin.put(
                daemon.url + "/admin/controller", json={"mode": "manual", "limit": 8}
            ) as r:
                assert r.status == 200
        snap = daemon.status()
    values = [lim for _, lim in limits]
    assert done > 20
    assert all(2 <= v <= 16 for v in values), values
    assert len(set(values)) > 1, f"the controller never moved: {values}"
    # Settled: over the last 25 s the limit moves within a narrow band, no sawtooth.
    tail = [v for t, v in limits if t >= 50]
    assert max(tail) - min(tail) <= 3, values
    flips = sum(
        1 for a, b, c in zip(tail, tail[1:], tail[2:], strict=False) if (b - a) * (c - b) < 0
    )
    assert flips <= 2, values
    decisions = snap["controller"]["decisions"]
    assert decisions and all(d["reason"] for d in decisions)
    print("controller limits:", values)
