"""Smoke test in a real terminal: the console in tmux against a running daemon app."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.tui.test_tui_pilot import Live, start_live

ROOT = Path(__file__).resolve().parents[2]
# The console script installed next to this interpreter: what an operator types.
APPLIANCE = Path(sys.executable).with_name("appliance")

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


def tmux(*args: str) -> str:
    return subprocess.run(
        ["tmux", *args], check=True, capture_output=True, text=True, timeout=10
    ).stdout


async def screen_shows(session: str, *texts: str, timeout_s: float = 15.0) -> str:
    """Poll capture-pane until every text is on screen; the screen on success."""
    deadline = time.monotonic() + timeout_s
    while True:
        screen = await asyncio.to_thread(tmux, "capture-pane", "-p", "-t", session)
        if all(t in screen for t in texts):
            return screen
        if time.monotonic() > deadline:
            raise AssertionError(f"{texts} not on screen:\n{screen}")
        await asyncio.sleep(0.2)


@pytest.fixture
async def live(tmp_path: Path) -> Live:
    running = await start_live(tmp_path)
    yield running
    await running.server.close()


async def test_tui_in_tmux(live: Live) -> None:
    assert APPLIANCE.exists(), f"{APPLIANCE} missing: install the project (pip install -e .)"
    session = f"tui-test-{uuid.uuid4().hex[:8]}"
    command = (
        f"cd {ROOT} && env -u APPLIANCE_ADMIN_TOKEN TERM=xterm-256color {APPLIANCE} "
        f"tui --url {live.url} --token-file {live.token_file} --refresh 0.5"
    )
    tmux("new-session", "-d", "-s", session, "-x", "80", "-y", "24", command)
    try:
        screen = await screen_shows(session, "Dashboard", "READY", "SIMULATED", "GPU 0")
        assert "Queues" in screen
        tmux("send-keys", "-t", session, "e")
        await screen_shows(session, "Events", "engine_state", "engine ready")
        tmux("send-keys", "-t", session, "c")
        await screen_shows(session, "Controls", "Pause (p)")
        tmux("send-keys", "-t", session, "p")
        await screen_shows(session, "engine paused")
        assert live.svc.supervisor.state.value == "paused"
        tmux("send-keys", "-t", session, "r")
        await screen_shows(session, "engine ready")
        tmux("send-keys", "-t", session, "?")
        await screen_shows(session, "graceful restart (asks first)")
        tmux("send-keys", "-t", session, "Escape")
        # A key right after Escape would read as Alt+key: wait for the help to close first.
        deadline = time.monotonic() + 10
        while "asks first" in await asyncio.to_thread(tmux, "capture-pane", "-p", "-t", session):
            assert time.monotonic() < deadline, "escape did not close the help"
            await asyncio.sleep(0.2)
        tmux("send-keys", "-t", session, "q")
        deadline = time.monotonic() + 10
        while session in await asyncio.to_thread(
            lambda: subprocess.run(["tmux", "ls"], capture_output=True, text=True).stdout
        ):
            assert time.monotonic() < deadline, "the console did not quit on q"
            await asyncio.sleep(0.2)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
