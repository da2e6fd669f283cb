"""Kill vLLM's engine core under load: 503 fast, streams end with an error, auto-restart."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import aiohttp
import psutil
import pytest

from appliance.client import parse_sse
from tests.conftest import ROOT, Daemon

pytestmark = pytest.mark.engine


def _engine_core_pid(d: Daemon) -> int:
    for pid in d.status()["engine"]["child_pids"]:
        try:
            if "EngineCore" in psutil.Process(pid).name():
                return pid
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"no EngineCore among {d.status()['engine']['child_pids']}")


async def test_killed_engine_core_is_detected_and_restarted(daemon: Daemon):
    before = daemon.status()["engine"]["restarts_total"].get("engine_dead", 0)
    body = {
        "model": daemon.model_name,
        "max_tokens": 400,
        "stream": True,
        "messages": [{"role": "user", "content": "Write a long poem about rivers."}],
    }
    async with aiohttp.ClientSession() as s:

        async def stream() -> str:
            async with s.post(daemon.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
                return (await r.read()).decode()

        streams = [asyncio.create_task(stream()) for _ in range(3)]
        deadline = time.monotonic() + 30
        while daemon.status()["engine"]["unfinished"] < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        os.kill(_engine_core_pid(daemon), signal.SIGKILL)
        killed_at = time.monotonic()
        not_ready_after = None
        while time.monotonic() - killed_at < 10:
            code, payload = daemon.get("/health/ready")
            if code == 503:
                not_ready_after = time.monotonic() - killed_at
                assert payload["reason"] in ("engine_dead", "restarting", "starting")
                break
            await asyncio.sleep(0.05)
        assert not_ready_after is not None and not_ready_after < 5, not_ready_after
        print(f"engine core killed: readiness 503 after {not_ready_after:.2f} s")
        texts = await asyncio.gather(*streams)
    for text in texts:
        events = parse_sse(text)
        assert events[-1].done
        assert events[-2].json()["error"]["code"] == "engine_dead"
    deadline = time.monotonic() + 300
    while daemon.get("/health/ready")[0] != 200 and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    assert daemon.get("/health/ready")[0] == 200, daemon.log_tail()
    snap = daemon.status()
    assert snap["engine"]["restarts_total"]["engine_dead"] == before + 1
    kinds = [e["kind"] for e in snap["events"]]
    assert "engine_started" in kinds
    async with aiohttp.ClientSession() as s:
        r = await s.post(
            daemon.url + "/v1/chat/completions", json={**body, "stream": False, "max_tokens": 8}
        )
        assert r.status == 200
    # The cause is in the metrics and in the event stream.
    code, _ = daemon.get("/health/live")
    assert code == 200
    import urllib.request

    with urllib.request.urlopen(daemon.url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    # Every cause's series exists from the start (at 0): the engine_dead one must have moved.
    line = next(
        x
        for x in text.splitlines()
        if x.startswith('appliance_engine_restarts_total{cause="engine_dead"}')
    )
    assert float(line.split()[-1]) >= 1, line
    dead = [
        e
        for e in snap["events"]
        if e["kind"] == "engine_state" and e["data"].get("state") == "engine_dead"
    ]
    assert dead and "engine core process is gone" in dead[-1]["reason"]

    # `appliance logs analyze` over this daemon's own log (not a hand-made one) finds the
    # death, reads the daemon's metric samples and request lines.
    proc = subprocess.run(
        [sys.executable, "-m", "appliance", "logs", "analyze", str(daemon.log_path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["samples"] > 0 and report["requests"] > 0, report
    assert any("engine_dead" in f["kinds"] for f in report["failures"]), report["failures"]
    assert any(e["category"] == "restart" for e in report["events"]), report["events"]
