"""Measure the console's own CPU use at its default refresh, in a real terminal (tmux).

It starts `appliance tui` (the console script next to this interpreter) and samples its CPU
time every --interval seconds for --seconds; it prints each window and the median.

Against --url (with --token-file) if given; else it serves the HTTP app with the fast fake
engine from tests/fakes.py in this process (so the daemon's CPU is not the console's) and
sends a chat request every second so the dashboard has something to redraw.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parents[1]
APPLIANCE = Path(sys.executable).with_name("appliance")
sys.path.insert(0, str(ROOT))


async def _fake_daemon(state_dir: Path) -> tuple[object, str, Path]:
    from tests.tui.test_tui_pilot import start_live

    live = await start_live(state_dir)
    return live, live.url, live.token_file


async def _load(url: str, stop: asyncio.Event) -> None:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as s:
        while not stop.is_set():
            async with s.post(url + "/v1/chat/completions", json=body) as r:
                await r.read()
            await asyncio.sleep(1.0)


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


async def measure(
    url: str | None, token_file: Path | None, seconds: float, warmup: float, interval: float
) -> int:
    """Start the console in tmux, wait for it, then sample its CPU time over `seconds`."""
    live = None
    if url is None:
        live, url, token_file = await _fake_daemon(Path(tempfile.mkdtemp(prefix="tui-cpu-")))
    stop = asyncio.Event()
    load = asyncio.create_task(_load(url, stop)) if live is not None else None
    session = f"tui-cpu-{uuid.uuid4().hex[:8]}"
    token_arg = f"--token-file {token_file}" if token_file else ""
    cmd = f"cd {ROOT} && TERM=xterm-256color {APPLIANCE} tui --url {url} {token_arg}"
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "24", cmd], check=True
    )
    try:
        pane = subprocess.run(
            ["tmux", "list-panes", "-t", session, "-F", "#{pane_pid}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()[0]
        shell = psutil.Process(int(pane))
        await asyncio.sleep(warmup)  # start-up (imports, first paint) is not the steady state
        procs = [shell, *shell.children(recursive=True)]
        tui = max(procs, key=lambda p: p.memory_info().rss)
        windows: list[float] = []
        start_cpu, start = _cpu_s(tui), time.monotonic()
        before, t0 = start_cpu, start
        while time.monotonic() - start < seconds:
            await asyncio.sleep(interval)
            now_cpu, now = _cpu_s(tui), time.monotonic()
            windows.append(100 * (now_cpu - before) / (now - t0))
            before, t0 = now_cpu, now
        used, wall = before - start_cpu, t0 - start
        screen = subprocess.run(
            ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True
        ).stdout
        pct = statistics.median(windows)
        print("per-window % of one core: " + " ".join(f"{w:.2f}" for w in windows))
        print(
            f"TUI pid {tui.pid}: {used:.2f} s CPU over {wall:.1f} s = {100 * used / wall:.2f} %"
            f" of one core on average; median of {len(windows)} x {interval:g} s windows"
            f" = {pct:.2f} %"
        )
        print("dashboard up" if "Dashboard" in screen else f"unexpected screen:\n{screen}")
        return 0 if pct < 5 else 1
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        stop.set()
        if load is not None:
            await load
        if live is not None:
            await live.server.close()  # type: ignore[attr-defined]


def main() -> int:
    """Parse arguments and measure; exit 0 when under 5 % of a core."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", help="a running daemon (default: serve the fake-engine app here)")
    p.add_argument("--token-file", type=Path)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--interval", type=float, default=5.0, help="seconds per sample window")
    p.add_argument("--warmup", type=float, default=5.0)
    args = p.parse_args()
    if shutil.which("tmux") is None:
        print("tmux is needed (the console wants a terminal)")
        return 2
    if not APPLIANCE.exists():
        print(f"{APPLIANCE} is missing: install the project (pip install -e .)")
        return 2
    return asyncio.run(measure(args.url, args.token_file, args.seconds, args.warmup, args.interval))


if __name__ == "__main__":
    sys.exit(main())
