"""Shared fixtures: one real daemon (real vLLM on the CPU) per test session."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import settings

from appliance.client import SyncAdminClient, Token
from bench.servers import free_port, small_engine, start_appliance

# Property tests draw the same examples on every run (HYPOTHESIS_PROFILE=explore for fresh
# ones): in CI a failure is then a regression to look at, not a roll of the dice. No
# deadline: a loaded 2-core box runs one example slower now and then.
settings.register_profile("deterministic", derandomize=True, deadline=None)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / "state" / "models" / "SmolLM2-135M-Instruct"
START_TIMEOUT_S = 420

# vLLM arguments both the shared daemon (engine.vllm) and vLLM's own server get.
PARITY_ENGINE_VLLM = {"tool_call_parser": "hermes", "enable_auto_tool_choice": True}
PARITY_VLLM_ARGS = ["--tool-call-parser", "hermes", "--enable-auto-tool-choice"]
# The test engine's weights and KV cache in float32: on a CPU without native bf16 (AVX2 only,
# no AVX512_BF16/AMX) torch's bf16 matmuls run 3-8x slower than float32 ones (a prompt's
# prefill most of all), which would make every test that waits for tokens slow. vLLM's own
# server in the parity test runs the same dtype, so the two still answer alike.
TEST_DTYPE = "float32"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `last` stop the shared daemon: run them after everything else."""
    items.sort(key=lambda item: item.get_closest_marker("last") is not None)


class NotifyListener:
    """A unix datagram socket standing in for systemd's NOTIFY_SOCKET; keeps what arrives."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.messages: list[tuple[float, str]] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(path))
        self._sock.settimeout(0.5)
        self._thread = threading.Thread(target=self._run, daemon=True, name="notify-listener")
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            self.messages.append((time.monotonic(), data.decode(errors="replace")))

    def lines(self) -> list[str]:
        return [m for _, m in self.messages]


@dataclass
class Daemon:
    url: str
    token: str
    model_dir: Path
    model_name: str
    state_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes]
    ready_history: list[tuple[int, str]] = field(default_factory=list)
    notify: NotifyListener | None = None

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def admin(self) -> SyncAdminClient:
        """The daemon's admin API through the one client every caller uses."""
        token_file = self.state_dir / "admin.token"
        return SyncAdminClient(self.url, Token(self.token, str(token_file), token_file), 30)

    def get(self, path: str) -> tuple[int, dict]:
        """GET a public path (health, models); (status, decoded JSON body)."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def status(self) -> dict:
        """GET /admin/status (an AdminError says why it failed)."""
        return self.admin.get("/admin/status")

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


def ensure_model() -> Path:
    from appliance.model_prep import prepare_default_model

    return prepare_default_model(MODEL_DIR)


def start_daemon(state_dir: Path, **overrides: object) -> Daemon:
    """Start `appliance serve` as a real subprocess; wait until ready (recording readiness)."""
    model_dir = ensure_model()
    port = free_port()
    cfg: dict = {
        "server": {"host": "127.0.0.1", "port": port},
        "engine": {
            # Eager (small_engine): the compiled default costs minutes per start on this CPU.
            **small_engine(model_dir),
            "dtype": TEST_DTYPE,
            "drain_timeout_s": 90,
            "health_interval_s": 1,
            # vLLM's own arguments: a tool parser, so forced and auto tool calls are served
            # (test_vllm_parity starts vLLM's server with the same flags).
            "vllm": PARITY_ENGINE_VLLM,
        },
        "admission": {
            "concurrency_limit": 8,
            "max_queue_wait_s": 300,
            "retry_after_s": 3,
            "queue_capacity": {"realtime": 16, "interactive": 128, "batch": 2},
        },
        # Fast simulated thermals so a derate cycle fits in a test; without a fault the
        # simulated GPU peaks near 81 °C at full load and never derates the other tests.
        "telemetry": {"source": "sim", "interval_s": 0.5, "sim": {"time_constant_s": 3}},
        "thermal": {"dwell_s": 3, "step_interval_s": 2},
        # Manual: the tests expect the limit they configured; the controller test switches
        # to auto itself.
        "controller": {"mode": "manual", "tick_s": 1, "window_s": 10, "min_samples": 4},
        "slo": {"ttft_p99_s": 4.0, "tpot_p99_s": 1.0},
        # Short part answers keep the 4x-context document test near half a minute.
        "long_context": {"intermediate_max_tokens": 48},
        # Small maintenance loads so the jobs can run inside the suite.
        "maintenance": {
            "history_interval_s": 1,
            "benchmark_concurrency": [1, 2],
            "benchmark_requests_per_level": 2,
            "benchmark_max_tokens": 8,
        },
    }
    for key, value in overrides.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    notify = NotifyListener(state_dir / "notify.sock")
    # A real sd_notify socket, as systemd would give, with a 2 s watchdog (pings every 1 s).
    server = start_appliance(
        cfg,
        state_dir,
        timeout_s=START_TIMEOUT_S,
        extra_env={"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "2000000"},
    )
    token = (state_dir / "admin.token").read_text().strip()
    return Daemon(
        url=server.url,
        token=token,
        model_dir=model_dir,
        model_name=model_dir.name,
        state_dir=state_dir,
        log_path=server.log_path,
        proc=server.proc,
        ready_history=server.ready_history,
        notify=notify,
    )


def stop_daemon(d: Daemon) -> None:
    if d.proc.poll() is None:
        d.proc.send_signal(signal.SIGTERM)
        try:
            d.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            d.proc.wait()


@pytest.fixture(scope="session")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """The one real daemon of this test session (real vLLM engine on SmolLM2)."""
    d = start_daemon(tmp_path_factory.mktemp("daemon-state"))
    yield d
    stop_daemon(d)
