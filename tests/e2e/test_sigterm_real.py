"""SIGTERM under load: admitted requests finish, new ones get 503, exit 0, no child left."""

from __future__ import annotations

import asyncio
import signal
import time

import aiohttp
import psutil
import pytest

from tests.conftest import Daemon

pytestmark = [pytest.mark.engine, pytest.mark.last]


async def test_sigterm_drains_then_exits_clean(daemon: Daemon):
    descendants = [p.pid for p in psutil.Process(daemon.proc.pid).children(recursive=True)]
    assert descendants
    body = {
        "model": daemon.model_name,
        "max_tokens": 48,
        "messages": [{"role": "user", "content": "Describe the sea."}],
    }
    async with aiohttp.ClientSession() as s:

        async def one() -> tuple[int, str]:
            async with s.post(daemon.url + "/v1/chat/completions", json=body) as r:
                data = await r.json()
                return r.status, data["choices"][0]["message"]["content"] if r.status == 200 else ""

        admitted = [asyncio.create_task(one()) for _ in range(6)]
        deadline = time.monotonic() + 30
        while daemon.status()["admission"]["in_flight"] < 6 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        daemon.proc.send_signal(signal.SIGTERM)
        late_status = None
        for _ in range(50):
            async with s.post(daemon.url + "/v1/chat/completions", json=body) as r:
                if r.status == 503:
                    late_status = r.status
                    assert r.headers.get("Retry-After")
                    assert (await r.json())["error"]["code"] == "draining"
                    break
            await asyncio.sleep(0.05)
        assert late_status == 503
        ready = await s.get(daemon.url + "/health/ready")
        assert ready.status == 503 and (await ready.json())["reason"] == "draining"
        results = await asyncio.gather(*admitted)
    assert all(status == 200 and text for status, text in results), results
    code = await asyncio.to_thread(daemon.proc.wait, 120)
    assert code == 0, daemon.log_tail()
    assert daemon.notify is not None
    assert any("STOPPING=1" in m.split("\n") for m in daemon.notify.lines())
    await asyncio.sleep(1)
    alive = [
        pid
        for pid in descendants
        if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    ]
    assert alive == [], alive
