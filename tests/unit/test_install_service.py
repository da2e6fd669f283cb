"""`appliance install-service`: the dry run, and real runs into a temporary root (never /etc)."""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.commands import install_service
from appliance.commands.install_service import render_config
from appliance.config import load_config

LIVE_PATHS = [Path("/etc/systemd/system/appliance.service"), Path("/etc/appliance/config.yaml")]


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    install_service.register(sub)
    args = parser.parse_args(["install-service", *argv])
    return int(args.func(args))


def _fake_root(tmp_path: Path, with_user: bool) -> Path:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    passwd = "root:x:0:0:root:/root:/bin/bash\n"
    group = "root:x:0:\n"
    if with_user:
        passwd += "appliance:x:990:990::/var/lib/appliance:/usr/sbin/nologin\n"
        group += "appliance:x:990:\n"
    (root / "etc" / "passwd").write_text(passwd)
    (root / "etc" / "group").write_text(group)
    (root / "etc" / "shadow").write_text("root:*:19000:0:99999:7:::\n")
    (root / "etc" / "gshadow").write_text("root:*::\n")
    return root


def _prefix(tmp_path: Path) -> Path:
    prefix = tmp_path / "opt-appliance"
    exe = prefix / ".venv" / "bin" / "appliance"
    exe.parent.mkdir(parents=True)
    exe.write_text(f"#!{sys.executable}\n")
    exe.chmod(0o755)
    return prefix


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_dry_run_into_a_root_prints_every_step_and_touches_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _fake_root(tmp_path, with_user=False)
    before = _tree(root)
    code = _cli("--root", str(root), "--prefix", str(_prefix(tmp_path)), "--dry-run")
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert _tree(root) == before
    steps = [line for line in out if line.startswith(("would ", "skip ", "system user"))]
    assert [s.split(":")[0].split(" /")[0] for s in steps] == [
        "would create system user",
        "would install",
        "would install",
        "skip systemctl daemon-reload",
    ]
    assert f"--prefix {root}" in steps[0] and steps[0].endswith(" appliance")
    assert "--system" in steps[0]
    assert str(root / "etc/systemd/system/appliance.service") in steps[1]
    assert str(root / "etc/appliance/config.yaml") in steps[2]


def test_dry_run_on_the_live_system_changes_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = {p: (p.exists(), p.exists() and p.stat().st_mtime_ns) for p in LIVE_PATHS}
    assert _cli("--dry-run") == 0
    out = capsys.readouterr().out
    assert {p: (p.exists(), p.exists() and p.stat().st_mtime_ns) for p in LIVE_PATHS} == before
    assert "would run systemctl daemon-reload" in out
    assert "--prefix" not in out  # useradd acts on the real /etc here


def test_install_into_a_root_with_the_user(tmp_path: Path) -> None:
    root = _fake_root(tmp_path, with_user=True)
    prefix = _prefix(tmp_path)
    assert _cli("--root", str(root), "--prefix", str(prefix)) == 0

    unit = root / "etc/systemd/system/appliance.service"
    text = unit.read_text()
    assert f"ExecStart={prefix}/.venv/bin/appliance serve --config /etc/appliance/" in text
    assert "/opt/appliance" not in text
    assert stat.S_IMODE(unit.stat().st_mode) == 0o644
    # The installed unit, prefix and all, is still one systemd accepts without a word.
    verify = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert (verify.returncode, verify.stdout + verify.stderr) == (0, "")

    config = root / "etc/appliance/config.yaml"
    assert stat.S_IMODE(config.stat().st_mode) == 0o640
    if os.geteuid() == 0:
        assert config.stat().st_gid == 990  # the appliance group of this root
    cfg = load_config(config)
    assert cfg.state_dir == Path("/var/lib/appliance")
    assert "# Listen address" in config.read_text()  # the comments travel along

    # Idempotent: a second run keeps the operator's config and refreshes the unit.
    config.write_text(config.read_text().replace("port: 8000", "port: 8100"))
    unit.write_text("stale")
    assert _cli("--root", str(root), "--prefix", str(prefix)) == 0
    assert load_config(config).server.port == 8100
    assert unit.read_text() == text
    assert not list(root.rglob(".*.tmp"))


def test_install_into_a_root_creates_the_user_with_useradd(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("useradd --prefix needs root; the run with an existing user covers the rest")
    root = _fake_root(tmp_path, with_user=False)
    host_passwd = Path("/etc/passwd").read_text()
    assert _cli("--root", str(root), "--prefix", str(_prefix(tmp_path))) == 0
    assert Path("/etc/passwd").read_text() == host_passwd
    entry = next(
        line.split(":")
        for line in (root / "etc/passwd").read_text().splitlines()
        if line.startswith("appliance:")
    )
    assert entry[5:] == ["/var/lib/appliance", "/usr/sbin/nologin"]
    assert int(entry[2]) < 1000  # a system account
    gid = int(entry[3])
    assert (root / "etc/appliance/config.yaml").stat().st_gid == gid


def test_a_failing_step_stops_the_install(tmp_path: Path) -> None:
    root = _fake_root(tmp_path, with_user=False)
    paths = install_service.InstallPaths(root=root, prefix=_prefix(tmp_path))

    def refuse(argv: list[str]) -> None:
        raise subprocess.CalledProcessError(9, argv)

    lines: list[str] = []
    steps = install_service.plan_install(paths, run=refuse)
    assert install_service.execute(steps, dry_run=False, out=lines.append) == 1
    assert lines[-1].startswith("failed:")
    assert not (root / "etc/systemd/system/appliance.service").exists()


def test_render_config_needs_the_state_dir_line() -> None:
    shipped = (install_service.SOURCE_DIR / "config.yaml").read_text()
    assert "state_dir: /var/lib/appliance" in render_config(shipped)
    with pytest.raises(ValueError, match="state_dir"):
        render_config("server:\n  port: 8000\n")
