"""`appliance status` and `appliance thresholds` against the real app (fake engine, simulated
GPU) over a real socket."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from appliance import cli
from tests.integration.test_app_fake_engine import Harness, _chat


def _cli(h: Harness, tmp_path: Path, *argv: str) -> int:
    url = str(h.client.make_url("")).rstrip("/")
    token = tmp_path / "admin.token"
    return cli.main([*argv, "--url", url, "--token-file", str(token)])


async def test_status_text_shows_controller_thermal_and_simulated_gpus(
    h: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    assert (await h.client.post("/v1/chat/completions", json=_chat())).status == 200
    for _ in range(100):  # the telemetry loop's first sample
        if h.svc.telemetry_loop.latest_samples:
            break
        await asyncio.sleep(0.02)
    assert await asyncio.to_thread(_cli, h, tmp_path, "status") == 0
    out = capsys.readouterr().out
    assert "engine     ready" in out and "controller " in out and "SLO p99 TTFT" in out
    assert "thermal    normal" in out and "SIMULATED" in out and "gpu0 " in out


async def test_thresholds_list_and_rollback(
    h: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    assert await asyncio.to_thread(_cli, h, tmp_path, "thresholds", "list") == 0
    out = capsys.readouterr().out
    assert "in force (from config" in out and "derate_core_c" in out
    assert "earlier sets (rollback targets, newest first): none" in out
    # Nothing to roll back to yet: the daemon says so, the command fails.
    assert await asyncio.to_thread(_cli, h, tmp_path, "thresholds", "rollback") == 1
    assert "HTTP 409" in capsys.readouterr().err
    assert await asyncio.to_thread(_cli, h, tmp_path, "thresholds", "list", "--json") == 0
    assert json.loads(capsys.readouterr().out)["active"]["source"] == "config"
