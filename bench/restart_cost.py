"""What graceful engine restarts cost the daemon: its RSS and open files after each one.

Starts the appliance (small eager engine on the default model, simulated GPU), serves a
request, then restarts the engine N times through the admin API with a request after
each, and prints the daemon process's RSS and open files after every restart.

    python bench/restart_cost.py --restarts 10
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from appliance.client import SyncAdminClient
from bench.report import MODEL_DIR
from bench.servers import free_port, small_engine, start_appliance


def rss_mib(pid: int) -> float:
    """The process's resident set, MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def chat(url: str, model: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        resp.read()


def wait_restarted(admin: SyncAdminClient, started_before: float) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        engine = admin.get("/admin/status")["engine"]
        if engine["state"] == "ready" and (engine["started_at_s"] or 0) > started_before:
            return
        time.sleep(0.5)
    raise RuntimeError("the engine did not come back within 600 s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--restarts", type=int, default=10)
    args = p.parse_args()
    state = Path(tempfile.mkdtemp(prefix="restart-cost-"))
    cfg = {
        "server": {"host": "127.0.0.1", "port": free_port()},
        "engine": {**small_engine(MODEL_DIR), "drain_timeout_s": 30},
        "telemetry": {"source": "sim"},
        "controller": {"mode": "manual"},
    }
    server = start_appliance(cfg, state, timeout_s=600)
    try:
        pid, model = server.proc.pid, MODEL_DIR.name
        admin = SyncAdminClient.at(server.admin_address(), timeout_s=60)
        chat(server.url, model)
        rows = [("start", rss_mib(pid), open_files(pid))]
        print(f"{'after':<10} {'RSS MiB':>8} {'files':>6}", flush=True)
        print(f"{'start':<10} {rows[0][1]:>8.0f} {rows[0][2]:>6}", flush=True)
        for i in range(1, args.restarts + 1):
            before = admin.get("/admin/status")["engine"]["started_at_s"] or 0
            admin.post("/admin/engine/restart", None)
            wait_restarted(admin, before)
            chat(server.url, model)
            rows.append((f"restart {i}", rss_mib(pid), open_files(pid)))
            print(f"{rows[-1][0]:<10} {rows[-1][1]:>8.0f} {rows[-1][2]:>6}", flush=True)
    finally:
        server.stop()
    first, last = rows[1], rows[-1]
    print(
        f"restart 1 -> {last[0]}: RSS {100 * (last[1] / first[1] - 1):+.1f} %, "
        f"open files {last[2] - first[2]:+d}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
