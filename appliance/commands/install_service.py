"""`appliance install-service`: system user, systemd unit, /etc config, daemon-reload.

Every step is planned first and then either printed (`--dry-run`) or carried out. `--root`
installs under another directory tree (an image being built, or a test's temporary root);
daemon-reload only makes sense for the running system, so it is skipped there.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVICE_USER = "appliance"
UNIT_NAME = "appliance.service"
DEFAULT_PREFIX = Path("/opt/appliance")  # the path systemd/appliance.service is written for
STATE_DIR = Path("/var/lib/appliance")  # the unit's StateDirectory=
SOURCE_DIR = Path(__file__).resolve().parents[2]  # this checkout: systemd/ and config.yaml


@dataclass(frozen=True)
class Step:
    """One install step: what it does, in words, and the action that does it (None: skip)."""

    description: str
    action: Callable[[], None] | None = None


@dataclass(frozen=True)
class InstallPaths:
    """Where the pieces come from and go to, all under `root`."""

    root: Path
    prefix: Path
    source_dir: Path = SOURCE_DIR

    def under_root(self, absolute: Path) -> Path:
        """`absolute` inside the install root."""
        return self.root / absolute.relative_to("/")

    @property
    def unit_dest(self) -> Path:
        return self.under_root(Path("/etc/systemd/system") / UNIT_NAME)

    @property
    def config_dest(self) -> Path:
        return self.under_root(Path("/etc/appliance/config.yaml"))

    @property
    def is_live_system(self) -> bool:
        return self.root.resolve() == Path("/")


def _passwd_names(path: Path) -> set[str]:
    """Names in a passwd or group file (empty when it does not exist)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return set()
    return {line.split(":", 1)[0] for line in lines if line and not line.startswith("#")}


def _group_id(root: Path, name: str) -> int | None:
    """The gid of `name` in root/etc/group, read directly so a --root tree works too."""
    try:
        lines = (root / "etc" / "group").read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        parts = line.split(":")
        if len(parts) >= 3 and parts[0] == name and parts[2].isdigit():
            return int(parts[2])
    return None


def render_unit(template: str, prefix: Path) -> str:
    """The shipped unit with /opt/appliance replaced by the chosen prefix."""
    return template.replace(str(DEFAULT_PREFIX), str(prefix))


def render_config(template: str) -> str:
    """The shipped config with state_dir pointed at the unit's StateDirectory."""
    text, count = re.subn(r"(?m)^state_dir:.*$", f"state_dir: {STATE_DIR}", template)
    if count != 1:
        raise ValueError("config.yaml: expected one top-level `state_dir:` line")
    return text


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True)


def _write(path: Path, text: str, mode: int, gid: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    if gid is not None:
        os.chown(tmp, 0, gid)
    tmp.replace(path)  # readers never see a half-written file


def plan_install(paths: InstallPaths, run: Callable[[list[str]], None] = _run) -> list[Step]:
    """The steps to install the service, given what the root already holds."""
    steps: list[Step] = []
    root = paths.root

    if SERVICE_USER in _passwd_names(root / "etc" / "passwd"):
        steps.append(Step(f"system user {SERVICE_USER} exists: keep it"))
    else:
        argv = [
            "useradd",
            "--system",
            "--user-group",
            "--home-dir",
            str(STATE_DIR),
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            "--comment",
            "LLM inference appliance",
        ]
        if not paths.is_live_system:
            argv += ["--prefix", str(root)]
        argv.append(SERVICE_USER)
        steps.append(Step(f"create system user: {shlex.join(argv)}", lambda: run(argv)))

    unit_text = render_unit((paths.source_dir / "systemd" / UNIT_NAME).read_text(), paths.prefix)
    steps.append(
        Step(
            f"install {paths.unit_dest} (0644, ExecStart {paths.prefix}/.venv/bin/appliance)",
            lambda: _write(paths.unit_dest, unit_text, 0o644),
        )
    )

    if paths.config_dest.exists():
        steps.append(Step(f"{paths.config_dest} exists: keep it"))
    else:
        config_text = render_config((paths.source_dir / "config.yaml").read_text())

        def install_config() -> None:
            # root:appliance 0640: the file may hold API keys. The group exists by now.
            gid = _group_id(root, SERVICE_USER) if os.geteuid() == 0 else None
            _write(paths.config_dest, config_text, 0o640, gid)

        steps.append(
            Step(
                f"install {paths.config_dest} (root:{SERVICE_USER} 0640, state_dir {STATE_DIR})",
                install_config,
            )
        )

    if paths.is_live_system:
        reload = ["systemctl", "daemon-reload"]
        steps.append(Step(f"run {shlex.join(reload)}", lambda: run(reload)))
    else:
        steps.append(Step(f"skip systemctl daemon-reload: {root} is not the running system"))
    return steps


def execute(steps: list[Step], dry_run: bool, out: Callable[[str], None] = print) -> int:
    """Print or carry out each step; 0 when all went well, 1 at the first failure."""
    for step in steps:
        if dry_run or step.action is None:
            out(f"{'would ' if dry_run and step.action else ''}{step.description}")
            continue
        out(step.description)
        try:
            step.action()
        except (OSError, subprocess.CalledProcessError) as exc:
            out(f"failed: {exc}")
            return 1
    return 0


def register(sub: Any) -> None:
    """Add `install-service [--prefix DIR] [--root DIR] [--dry-run]` to the CLI."""
    p = sub.add_parser(
        "install-service",
        help="create the service user, install the systemd unit and config, reload systemd",
        description="Install appliance.service for the checkout at --prefix (needs root).",
    )
    p.add_argument(
        "--prefix",
        type=Path,
        default=DEFAULT_PREFIX,
        help=f"where the repository and its .venv live (default {DEFAULT_PREFIX})",
    )
    p.add_argument(
        "--root",
        type=Path,
        default=Path("/"),
        help="install into this directory tree instead of the running system",
    )
    p.add_argument("--dry-run", action="store_true", help="print each step without doing it")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Plan the install, then print it or carry it out."""
    paths = InstallPaths(root=args.root, prefix=args.prefix.resolve())
    if not args.dry_run and paths.is_live_system and os.geteuid() != 0:
        print("install-service must run as root (or pass --dry-run)", file=sys.stderr)
        return 1
    exe = paths.prefix / ".venv" / "bin" / "appliance"
    if not exe.is_file():
        print(f"warning: {exe} does not exist yet; run `make install` in {paths.prefix}")
    code = execute(plan_install(paths), args.dry_run)
    if code == 0 and not args.dry_run and paths.is_live_system:
        print(f"next: systemctl enable --now {UNIT_NAME}; journalctl -u appliance -f")
    return code
