"""A long fault mix against the real engine: what clients saw, what availability the daemon
and Prometheus computed, and whether the daemon grew.

Starts the appliance (small eager engine on the default model, simulated GPU) and a real
Prometheus (the Debian binary) that scrapes it every 5 s and evaluates the shipped
`monitoring/slo.yml`. Three client threads send chat requests throughout (a quarter
streamed). Every cycle (5 minutes by default) runs, one a minute:

    graceful restart (admin API) -> hot_room for 60 s -> engine-core SIGKILL
    -> 3x overload for 60 s (six more client threads) -> 10 client disconnects mid-stream

At the end it prints requests sent, answered, refused (4xx) and failed (5xx or no answer),
the daemon's own availability (GET /admin/status, from its SQLite history), Prometheus's
(1 - appliance:slo_errors:ratio_rate30m, and the same ratio over the whole run from the
raw counters), and the daemon's RSS and open files after the first restart and at the end.

    python bench/fault_mix.py --minutes 30 --out /tmp/fault-mix.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil

from appliance.client import SyncAdminClient
from bench.report import MODEL_DIR
from bench.restart_cost import open_files, rss_mib, wait_restarted
from bench.servers import free_port, launch, small_engine, start_appliance

ROOT = Path(__file__).resolve().parents[1]
STEADY_CLIENTS = 3
OVERLOAD_FACTOR = 3


class Tally:
    """What the clients saw, by outcome (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def add(self, outcome: str) -> None:
        with self._lock:
            self.counts[outcome] += 1

    def summary(self) -> dict[str, int]:
        with self._lock:
            c = dict(self.counts)
        sent = sum(c.values())
        return {
            "sent": sent,
            "answered_200": c.get("200", 0),
            "refused_4xx": sum(v for k, v in c.items() if k.startswith("4")),
            "failed_5xx": sum(v for k, v in c.items() if k.startswith("5")),
            "no_answer": c.get("connection_error", 0),
            "disconnected_by_client": c.get("client_disconnect", 0),
            "by_status": c,
        }


def _body(model: str, rng: random.Random, stream: bool) -> bytes:
    words = " ".join(
        rng.choice(("river", "engine", "garden", "signal", "market")) for _ in range(8)
    )
    return json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": f"Write about {words}."}],
            "max_tokens": rng.randint(8, 32),
            "stream": stream,
        }
    ).encode()


def one_request(url: str, model: str, rng: random.Random, tally: Tally) -> None:
    stream = rng.random() < 0.25
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        _body(model, rng, stream),
        {"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            resp.read()
            tally.add(str(resp.status))
    except urllib.error.HTTPError as exc:
        exc.read()
        tally.add(str(exc.code))
        if exc.code in (429, 503):
            # As real clients do (the OpenAI SDKs retry after Retry-After): no tight loop.
            time.sleep(min(5.0, float(exc.headers.get("Retry-After") or 1)))
        elif exc.code >= 500:
            time.sleep(1)
    except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException):
        tally.add("connection_error")
        time.sleep(1)


def disconnect_mid_stream(url: str, model: str, rng: random.Random, tally: Tally) -> None:
    """A streamed request abandoned after its first bytes (the socket closed under it)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            _body(model, rng, stream=True),
            {"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        if resp.status == 200:
            resp.read(1)
            tally.add("client_disconnect")
        else:
            resp.read()
            tally.add(str(resp.status))
    except (OSError, http.client.HTTPException):
        tally.add("connection_error")
    finally:
        conn.close()


def client_loop(url: str, model: str, seed: int, tally: Tally, stop: threading.Event) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        one_request(url, model, rng, tally)


def engine_core_pid(daemon_pid: int) -> int | None:
    for child in psutil.Process(daemon_pid).children(recursive=True):
        try:
            if "EngineCore" in child.name():
                return child.pid
        except psutil.Error:
            continue
    return None


def start_prometheus(target: str, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    exe = shutil.which("prometheus")
    if exe is None:
        raise SystemExit("prometheus is not installed: `make tools` installs it")
    port = free_port()
    cfg = {
        "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
        "rule_files": [str(ROOT / "monitoring" / "slo.yml")],
        "scrape_configs": [{"job_name": "appliance", "static_configs": [{"targets": [target]}]}],
    }
    (workdir / "prometheus.yml").write_text(json.dumps(cfg))
    cmd = [
        exe,
        f"--config.file={workdir / 'prometheus.yml'}",
        f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    server = launch(cmd, f"http://127.0.0.1:{port}", "/-/ready", workdir / "prom.log", 60)
    return server.proc, server.url


def prom_scalar(prom_url: str, query: str) -> float | None:
    url = prom_url + "/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=30) as resp:
        result = json.load(resp)["data"]["result"]
    return float(result[0]["value"][1]) if result else None


class Mix:
    """The fault schedule against one daemon; each step logs what it did."""

    def __init__(self, server: Any, admin: SyncAdminClient, model: str, tally: Tally) -> None:
        self.server, self.admin, self.model, self.tally = server, admin, model, tally
        self.log: list[dict[str, Any]] = []
        self.after_first_restart: tuple[float, int] | None = None

    def note(self, what: str, **extra: Any) -> None:
        row = {"t_s": round(time.monotonic() - T0, 1), "what": what, **extra}
        self.log.append(row)
        print(json.dumps(row), flush=True)

    def restart(self) -> None:
        before = self.admin.get("/admin/status")["engine"]["started_at_s"] or 0
        self.admin.post("/admin/engine/restart", None)
        wait_restarted(self.admin, before)
        pid = self.server.proc.pid
        sample = (rss_mib(pid), open_files(pid))
        if self.after_first_restart is None:
            self.after_first_restart = sample
        self.note("graceful restart", rss_mib=round(sample[0]), open_files=sample[1])

    def hot_room(self) -> None:
        self.admin.post("/admin/telemetry/faults", {"name": "hot_room", "duration_s": 60})
        self.note("hot_room for 60 s")

    def kill_engine_core(self) -> None:
        pid = engine_core_pid(self.server.proc.pid)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        self.note("engine core SIGKILL", pid=pid)

    def overload(self, seconds: float) -> None:
        stop = threading.Event()
        extra = (OVERLOAD_FACTOR - 1) * STEADY_CLIENTS
        threads = [
            threading.Thread(
                target=client_loop,
                args=(self.server.url, self.model, 1000 + i, self.tally, stop),
                daemon=True,
            )
            for i in range(extra)
        ]
        self.note(f"{OVERLOAD_FACTOR}x overload for {seconds:g} s", extra_clients=extra)
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join(timeout=300)

    def disconnects(self, n: int) -> None:
        rng = random.Random(7)
        for _ in range(n):
            disconnect_mid_stream(self.server.url, self.model, rng, self.tally)
        self.note(f"{n} client disconnects mid-stream")


T0 = time.monotonic()


def run_mix(mix: Mix, minutes: float, step_s: float) -> None:
    steps = [
        mix.restart,
        mix.hot_room,
        mix.kill_engine_core,
        lambda: mix.overload(step_s),
        lambda: mix.disconnects(10),
    ]
    end = T0 + minutes * 60
    i = 0
    while time.monotonic() < end:
        started = time.monotonic()
        steps[i % len(steps)]()
        i += 1
        time.sleep(max(0.0, min(end - time.monotonic(), step_s - (time.monotonic() - started))))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--step-s", type=float, default=60, help="seconds between fault steps")
    p.add_argument("--out", help="write the figures as JSON here too")
    args = p.parse_args()
    global T0
    work = Path(tempfile.mkdtemp(prefix="fault-mix-"))
    port = free_port()
    cfg = {
        "server": {"host": "127.0.0.1", "port": port},
        "engine": {**small_engine(MODEL_DIR), "drain_timeout_s": 30},
        "telemetry": {"source": "sim"},
    }
    server = start_appliance(cfg, work / "state", timeout_s=600)
    prom, prom_url = start_prometheus(f"127.0.0.1:{port}", work)
    tally, stop = Tally(), threading.Event()
    admin = SyncAdminClient.at(server.admin_address(), timeout_s=60)
    mix = Mix(server, admin, MODEL_DIR.name, tally)
    clients = [
        threading.Thread(
            target=client_loop, args=(server.url, MODEL_DIR.name, i, tally, stop), daemon=True
        )
        for i in range(STEADY_CLIENTS)
    ]
    try:
        pid = server.proc.pid
        start_sample = (rss_mib(pid), open_files(pid))
        T0 = time.monotonic()
        for t in clients:
            t.start()
        run_mix(mix, args.minutes, args.step_s)
        stop.set()
        for t in clients:
            t.join(timeout=300)
        time.sleep(20)  # the last scrapes and the daemon's next history row
        end_sample = (rss_mib(pid), open_files(pid))
        run_s = time.monotonic() - T0
        window = f"{int(run_s) + 60}s"
        figures = {
            "minutes": round(run_s / 60, 1),
            "clients": tally.summary(),
            "daemon_availability": admin.get("/admin/status").get("availability"),
            "prometheus": {
                "availability_30m_rule": _one_minus(
                    prom_scalar(prom_url, "appliance:slo_errors:ratio_rate30m")
                ),
                "requests_good": prom_scalar(
                    prom_url,
                    f'sum(increase(appliance_slo_requests_total{{outcome="good"}}[{window}]))',
                ),
                "requests_bad": prom_scalar(
                    prom_url,
                    f'sum(increase(appliance_slo_requests_total{{outcome="bad"}}[{window}]))',
                ),
                "ready_down_s": prom_scalar(
                    prom_url,
                    f'sum(increase(appliance_slo_ready_seconds_total{{state="down"}}[{window}]))',
                ),
            },
            "daemon_process": {
                "at_start": {"rss_mib": round(start_sample[0]), "open_files": start_sample[1]},
                "after_first_restart": None
                if mix.after_first_restart is None
                else {
                    "rss_mib": round(mix.after_first_restart[0]),
                    "open_files": mix.after_first_restart[1],
                },
                "at_end": {"rss_mib": round(end_sample[0]), "open_files": end_sample[1]},
            },
            "steps": mix.log,
        }
    finally:
        stop.set()
        prom.terminate()
        server.stop()
    text = json.dumps(figures, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


def _one_minus(value: float | None) -> float | None:
    return None if value is None else 1 - value


if __name__ == "__main__":
    sys.exit(main())
