"""`appliance status`, `jobs` and `thresholds` against the real app (fake engine, simulated
GPU) over a real socket, finding the daemon by flags or by its config alone."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from appliance import cli
from bench.servers import free_port
from tests.integration.test_app_fake_engine import Harness, _chat


def _url(h: Harness) -> str:
    return str(h.client.make_url("")).rstrip("/")


def _cli(h: Harness, tmp_path: Path, *argv: str) -> int:
    return cli.main([*argv, "--url", _url(h), "--token-file", str(tmp_path / "admin.token")])


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


async def test_the_daemons_config_alone_is_enough(
    h: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    # As on a systemd install: no flags, the config names the port and the state directory.
    for name in ("APPLIANCE_URL", "APPLIANCE_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    cfg = tmp_path / "etc-config.yaml"
    cfg.write_text(f"state_dir: {tmp_path}\nserver: {{port: {urlsplit(_url(h)).port}}}\n")
    monkeypatch.setenv("APPLIANCE_CONFIG", str(cfg))
    assert await asyncio.to_thread(cli.main, ["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["engine"]["state"] == "ready"
    assert await asyncio.to_thread(cli.main, ["jobs", "list"]) == 0
    assert "restart" in capsys.readouterr().out


async def test_jobs_run_and_its_failures(
    h: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    assert await asyncio.to_thread(_cli, h, tmp_path, "jobs", "run", "recalibrate") == 0
    assert "recalibrate: " in capsys.readouterr().out
    assert await asyncio.to_thread(_cli, h, tmp_path, "jobs", "run", "nosuch") == 1
    assert "appliance jobs: job nosuch: " in capsys.readouterr().err


async def test_a_bad_token_or_no_daemon_says_what_to_do(
    h: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    wrong = tmp_path / "wrong.token"
    wrong.write_text("not-it")
    argv = ["status", "--url", _url(h), "--token-file", str(wrong)]
    assert await asyncio.to_thread(cli.main, argv) == 1
    err = capsys.readouterr().err
    assert f"rejected the admin token from --token-file {wrong}" in err
    assert "$APPLIANCE_ADMIN_TOKEN" in err
    down = f"http://127.0.0.1:{free_port()}"
    argv = ["status", "--url", down, "--token-file", str(wrong)]
    assert await asyncio.to_thread(cli.main, argv) == 1
    assert f"daemon at {down} unreachable" in capsys.readouterr().err


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


async def test_usage_per_key_and_a_bad_day(
    h: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    for _ in range(2):
        assert (await h.client.post("/v1/chat/completions", json=_chat())).status == 200
    assert await asyncio.to_thread(_cli, h, tmp_path, "usage") == 0
    out = capsys.readouterr().out
    [row] = [line.split() for line in out.splitlines() if line.startswith("anonymous")]
    # key, requests, answered, prompt tokens, output tokens (4 each), other statuses
    assert row[1:3] == ["2", "2"] and row[4] == "8" and row[5] == "-"
    assert await asyncio.to_thread(_cli, h, tmp_path, "usage", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["keys"][0]["by_status"] == {"ok": 2}
    assert await asyncio.to_thread(_cli, h, tmp_path, "usage", "--from", "last-week") == 1
    assert "from: must be a date as YYYY-MM-DD" in capsys.readouterr().err
