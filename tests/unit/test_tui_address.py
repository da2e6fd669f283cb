"""`appliance tui` finds the daemon from the daemon's own config (a systemd install keeps
its state in /var/lib/appliance, not ./state), unless flags or the environment say."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from appliance.commands.tui import daemon_address


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("APPLIANCE_URL", "APPLIANCE_ADMIN_TOKEN", "APPLIANCE_CONFIG"):
        monkeypatch.delenv(name, raising=False)


def _args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"config": None, "url": None, "token_file": None, **kw})


def test_url_and_token_come_from_the_daemons_config(tmp_path: Path) -> None:
    state = tmp_path / "var-lib-appliance"
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        f"state_dir: {state}\nserver: {{host: 0.0.0.0, port: 9123, admin_token_file: tok}}\n"
    )
    url, token_file = daemon_address(_args(config=str(cfg)))
    assert url == "http://127.0.0.1:9123"  # bound to every address: reach it on the loopback
    assert token_file == str(state / "tok")


def test_the_config_is_found_like_the_daemon_finds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "etc.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 's'}\nserver: {{port: 8443}}\n")
    monkeypatch.setenv("APPLIANCE_CONFIG", str(cfg))
    assert daemon_address(_args()) == ("http://127.0.0.1:8443", str(tmp_path / "s" / "admin.token"))


def test_flags_and_environment_win_without_reading_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = str(tmp_path / "no-such.yaml")  # reading it would be a ConfigError
    got = daemon_address(_args(config=missing, url="http://h:1", token_file="/t"))
    assert got == ("http://h:1", "/t")
    monkeypatch.setenv("APPLIANCE_ADMIN_TOKEN", "secret")
    assert daemon_address(_args(config=missing, url="http://h:2")) == ("http://h:2", None)
