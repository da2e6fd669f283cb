"""Start and stop HTTP servers as subprocesses (the appliance, vLLM's own), wait for ready."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from appliance.client import DaemonAddress, read_token_file


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def small_engine(model_dir: Path) -> dict[str, Any]:
    """engine: keys for a small daemon on model_dir, as the test daemon and the benches that
    start a daemon per arm run it. Eager: the compiled default costs minutes per engine start
    on a CPU."""
    return {
        "model": str(model_dir),
        "max_model_len": 2048,
        "max_num_seqs": 32,
        "kv_cache_space_gib": 1,
        "enforce_eager": True,
    }


@dataclass
class ServerProc:
    """A started server: its process, URL, log, and the readiness answers seen while starting."""

    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    ready_history: list[tuple[int, str]] = field(default_factory=list)
    admin_token_path: Path | None = None  # an appliance's; vLLM's own server has none

    def admin_address(self) -> DaemonAddress:
        """An appliance's URL and the admin token it wrote (start_appliance set its path)."""
        if self.admin_token_path is None:
            raise ValueError(f"{self.url}: not an appliance, it has no admin token")
        return DaemonAddress(self.url, read_token_file(self.admin_token_path))

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self, timeout_s: float = 120) -> int:
        """SIGTERM, wait, SIGKILL if it will not go; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


def launch(
    cmd: list[str],
    url: str,
    ready_path: str,
    log_path: Path,
    timeout_s: float,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> ServerProc:
    """Run cmd; poll url+ready_path until 200, recording each distinct non-200 answer."""
    proc = subprocess.Popen(
        cmd, stdout=log_path.open("wb"), stderr=subprocess.STDOUT, env=env, cwd=cwd
    )
    server = ServerProc(proc, url, log_path)
    history = server.ready_history
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[:4]} exited {proc.returncode}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(url + ready_path, timeout=5) as resp:
                history.append((resp.status, "ready"))
                return server
        except urllib.error.HTTPError as exc:
            try:
                reason = json.loads(exc.read() or b"{}").get("reason", "")
            except ValueError:
                reason = ""
            if not history or history[-1] != (exc.code, reason):
                history.append((exc.code, reason))
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.25)
    proc.kill()
    raise RuntimeError(f"{cmd[:4]} not ready in {timeout_s:g} s:\n{server.log_tail()}")


def start_appliance(
    config: dict, state_dir: Path, timeout_s: float = 420, extra_env: dict[str, str] | None = None
) -> ServerProc:
    """`python -m appliance serve` with config (a dict written as YAML-compatible JSON)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = state_dir / "config.yaml"
    cfg_path.write_text(json.dumps({"state_dir": str(state_dir), **config}))
    port = config["server"]["port"]
    env = {k: v for k, v in os.environ.items() if k != "APPLIANCE_ADMIN_TOKEN"}
    env.update(extra_env or {})
    server = launch(
        [sys.executable, "-m", "appliance", "serve", "--config", str(cfg_path)],
        f"http://127.0.0.1:{port}",
        "/health/ready",
        state_dir / "daemon.log",
        timeout_s,
        env=env,
    )
    # $APPLIANCE_ADMIN_TOKEN is kept from the daemon above, so it uses its own token file.
    token_name = config["server"].get("admin_token_file", "admin.token")
    server.admin_token_path = state_dir / token_name
    return server


def start_vllm_server(
    model_dir: Path,
    port: int,
    log_path: Path,
    kv_space_gib: float,
    max_model_len: int,
    max_num_seqs: int,
    timeout_s: float = 420,
    extra_args: list[str] | None = None,
    dtype: str = "bfloat16",
) -> ServerProc:
    """vLLM's own OpenAI server on the test daemon's engine settings (eager, the same
    context, sequences, dtype and seed), plus extra_args."""
    cmd, env = vllm_defaults_command(model_dir, port, kv_space_gib)
    cmd += [
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        str(max_num_seqs),
        "--dtype",
        dtype,
        "--enforce-eager",
        "--seed",
        "0",
        *(extra_args or []),
    ]
    return launch(cmd, f"http://127.0.0.1:{port}", "/health", log_path, timeout_s, env=env)


def vllm_defaults_command(
    model_dir: Path, port: int, kv_space_gib: float, served_model_name: str | None = None
) -> tuple[list[str], dict[str, str]]:
    """vLLM's own OpenAI server with vLLM's defaults: (argv, env).

    Only the model, its served name, the listen address and the KV budget are set. The CPU
    engine takes its KV size from VLLM_CPU_KVCACHE_SPACE (whole GiB); a fractional budget goes
    in as --kv-cache-memory-bytes instead, the same setting that variable feeds.
    """
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    kv_args: list[str] = []
    if float(kv_space_gib).is_integer():
        env["VLLM_CPU_KVCACHE_SPACE"] = str(int(kv_space_gib))
    else:
        kv_args = ["--kv-cache-memory-bytes", str(round(kv_space_gib * 2**30))]
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        served_model_name or model_dir.name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *kv_args,
    ]
    return cmd, env


def start_vllm_defaults(
    model_dir: Path,
    port: int,
    log_path: Path,
    kv_space_gib: float,
    served_model_name: str | None = None,
    timeout_s: float = 900,
) -> ServerProc:
    """Start vllm_defaults_command; ready when GET /health answers 200."""
    cmd, env = vllm_defaults_command(model_dir, port, kv_space_gib, served_model_name)
    return launch(cmd, f"http://127.0.0.1:{port}", "/health", log_path, timeout_s, env=env)
