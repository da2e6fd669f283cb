"""systemd/appliance.service: `systemd-analyze verify` is clean and the key settings hold."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "appliance.service"
INSTALLED_EXEC = "/opt/appliance/.venv/bin/appliance"


def _analyze() -> str:
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.fail("systemd-analyze is missing: install the Debian package `systemd`")
    return exe


def _unit_with_real_exec(tmp_path: Path) -> Path:
    """The unit, with ExecStart pointed at an executable that exists on this machine.

    verify rejects an ExecStart binary that is missing, and /opt/appliance is the install
    location, not this checkout; everything else in the file stays as shipped.
    """
    exe = tmp_path / "bin" / "appliance"
    exe.parent.mkdir()
    exe.write_text(f"#!{sys.executable}\n")
    exe.chmod(0o755)
    text = UNIT.read_text()
    assert text.count(f"ExecStart={INSTALLED_EXEC} ") == 1
    out = tmp_path / "appliance.service"
    out.write_text(text.replace(f"ExecStart={INSTALLED_EXEC} ", f"ExecStart={exe} "))
    return out


def _settings() -> dict[str, dict[str, list[str]]]:
    """Section -> key -> every value (systemd keys repeat)."""
    parser = configparser.ConfigParser(
        strict=False, interpolation=None, empty_lines_in_values=False, dict_type=_MultiDict
    )
    parser.optionxform = str  # type: ignore[assignment, method-assign]
    parser.read_string(UNIT.read_text())
    return {s: {k: v.split("\n") for k, v in parser[s].items()} for s in parser.sections()}


class _MultiDict(dict):  # type: ignore[type-arg]
    """Keeps every value of a repeated key, joined by newlines."""

    def __setitem__(self, key: str, value: object) -> None:
        if isinstance(value, list) and key in self:
            self[key].extend(value)
        else:
            super().__setitem__(key, value)


def test_systemd_analyze_verify_is_clean(tmp_path: Path) -> None:
    unit = _unit_with_real_exec(tmp_path)
    proc = subprocess.run(
        [_analyze(), "verify", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    # verify exits 0 even for unknown keys and bad values; it only warns: demand silence.
    output = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 0, output
    assert output == "", f"systemd-analyze verify warned:\n{output}"


def test_verify_catches_a_broken_copy(tmp_path: Path) -> None:
    # The check above is only worth something if verify speaks up on a bad key here.
    unit = _unit_with_real_exec(tmp_path)
    unit.write_text(unit.read_text().replace("KillMode=mixed", "KillMode=mixed\nDrainSec=60"))
    proc = subprocess.run(
        [_analyze(), "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert "DrainSec" in proc.stdout + proc.stderr


def test_hardening_exposure_stays_low(tmp_path: Path) -> None:
    unit = _unit_with_real_exec(tmp_path)
    proc = subprocess.run(
        [_analyze(), "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for \S+: ([\d.]+)", proc.stdout + proc.stderr)
    assert match, proc.stdout + proc.stderr
    # 10 is unconfined; the unit scored 1.9 when written (GPU devices and the network stay).
    assert float(match.group(1)) <= 3.0


def test_the_settings_the_daemon_relies_on() -> None:
    s = _settings()
    svc = s["Service"]

    def one(key: str) -> str:
        assert len(svc[key]) == 1, (key, svc[key])
        return svc[key][0]

    assert one("Type") == "notify"
    assert one("NotifyAccess") == "main"
    assert one("ExecStart").startswith(f"{INSTALLED_EXEC} serve --config /etc/appliance/")
    assert one("Restart") == "on-failure"
    assert one("KillMode") == "mixed"
    assert one("User") == one("Group") == "appliance"
    assert one("StateDirectory") == one("ConfigurationDirectory") == "appliance"
    assert one("PrivateDevices") == "no"
    assert "APPLIANCE_CONFIG=/etc/appliance/config.yaml" in svc["Environment"]
    allowed = {v.split()[0] for v in svc["DeviceAllow"]}
    assert {"char-nvidia*", "/dev/nvidiactl", "/dev/nvidia-uvm"} <= allowed
    assert "StartLimitBurst" in s["Unit"] and "StartLimitIntervalSec" in s["Unit"]


def _seconds(value: str) -> float:
    units = {"ms": 0.001, "s": 1, "sec": 1, "min": 60, "h": 3600}
    total = 0.0
    for number, unit in re.findall(r"([\d.]+)\s*([a-z]*)", value):
        total += float(number) * units[unit or "s"]
    return total


def test_timeouts_leave_room_for_drain_and_start() -> None:
    from appliance.config import EngineConfig

    svc = _settings()["Service"]
    drain_s = EngineConfig().drain_timeout_s
    assert _seconds(svc["TimeoutStopSec"][0]) >= drain_s + 20
    # The first engine start on a GPU box can take minutes.
    assert _seconds(svc["TimeoutStartSec"][0]) >= 600
    watchdog_s = _seconds(svc["WatchdogSec"][0])
    assert 10 <= watchdog_s <= 120
