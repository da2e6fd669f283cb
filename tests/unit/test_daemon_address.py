"""Every client finds the daemon from the daemon's own config (a systemd install keeps its
state in /var/lib/appliance, not ./state), unless flags or the environment say."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from appliance.client import Token, add_daemon_arguments, address_from_args, find_daemon
from appliance.errors import ConfigError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("APPLIANCE_URL", "APPLIANCE_ADMIN_TOKEN", "APPLIANCE_CONFIG"):
        monkeypatch.delenv(name, raising=False)


def _config(tmp_path: Path, host: str = "0.0.0.0", port: int = 9123) -> tuple[Path, Path]:
    """A config whose state_dir holds a token file named `tok`: (config, token file)."""
    state = tmp_path / "var-lib-appliance"
    state.mkdir()
    (state / "tok").write_text("from-the-state-dir\n")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        f"state_dir: {state}\nserver: {{host: '{host}', port: {port}, admin_token_file: tok}}\n"
    )
    return cfg, state / "tok"


def test_url_and_token_come_from_the_daemons_config(tmp_path: Path) -> None:
    cfg, tok = _config(tmp_path)
    found = find_daemon(config=cfg)
    assert found.url == "http://127.0.0.1:9123"  # bound to every address: the loopback
    assert found.token == Token("from-the-state-dir", str(tok), tok)


def test_the_config_is_found_like_the_daemon_finds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, _ = _config(tmp_path, host="::1", port=8443)
    monkeypatch.setenv("APPLIANCE_CONFIG", str(cfg))
    found = find_daemon()
    assert found.url == "http://[::1]:8443" and found.token.value == "from-the-state-dir"
    # The CLI's flags lead to the same place.
    p = argparse.ArgumentParser()
    add_daemon_arguments(p)
    assert address_from_args(p.parse_args([])) == found


def test_flags_and_environment_win_without_reading_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "no-such.yaml"  # reading it would be a ConfigError
    (tmp_path / "t").write_text("flag-token")
    found = find_daemon(config=missing, url="http://h:1/", token_file=tmp_path / "t")
    assert (found.url, found.token.value) == ("http://h:1", "flag-token")
    assert found.token.source == f"--token-file {tmp_path / 't'}"
    monkeypatch.setenv("APPLIANCE_ADMIN_TOKEN", "secret")
    monkeypatch.setenv("APPLIANCE_URL", "http://h:2")
    found = find_daemon(config=missing)
    assert (found.url, found.token) == ("http://h:2", Token("secret", "$APPLIANCE_ADMIN_TOKEN"))
    monkeypatch.delenv("APPLIANCE_URL")
    with pytest.raises(ConfigError, match="not found"):
        find_daemon(config=missing)  # the URL is still open: the config must be read


def test_the_configured_token_goes_to_the_configured_daemon_only(tmp_path: Path) -> None:
    cfg, tok = _config(tmp_path, host="127.0.0.1")
    # The same daemon by another loopback name still gets it.
    assert find_daemon(config=cfg, url="http://localhost:9123").token.value is not None
    other = find_daemon(config=cfg, url="http://10.0.0.7:9123")
    assert other.token.value is None and other.token.path is None
    assert str(tok) in other.token.where and "not sent to http://10.0.0.7:9123" in other.token.where


def test_an_unreadable_token_says_why(tmp_path: Path) -> None:
    cfg, tok = _config(tmp_path)
    tok.unlink()
    token = find_daemon(config=cfg).token
    assert token.value is None and token.where == f"{tok} (No such file or directory)"
    # The daemon writes it at its first start: reading again finds it.
    tok.write_text("written-later\n")
    assert token.reread().value == "written-later"
    tok.write_text("  \n")
    assert find_daemon(url="http://h:1", token_file=tok).token.problem == "empty"
