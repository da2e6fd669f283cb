"""Config: defaults, every bad key named at once, the CLI's exit status 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from appliance.cli import main
from appliance.config import Config, find_config_path, load_config, resolve_model_dir
from appliance.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_config_is_valid_and_equals_the_defaults():
    assert load_config(ROOT / "config.yaml") == Config()


def test_every_bad_key_is_reported_at_once(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "server:\n  port: 70000\n  colour: blue\n"
        "engine:\n  max_model_len: 10\n  drain_timeout_s: -1\n"
        "admission:\n  queue_capacity:\n    batch: -5\n"
        "nonsense: 1\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    keys = {k for k, _ in err.value.problems}
    assert keys == {
        "server.port",
        "server.colour",
        "engine.max_model_len",
        "engine.drain_timeout_s",
        "admission.queue_capacity.batch",
        "nonsense",
    }
    msg = dict(err.value.problems)
    assert msg["server.colour"] == "unknown key"
    assert "65535" in msg["server.port"]


def test_config_check_exits_2_and_names_each_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine:\n  dtype: float8\n  modle: x\n")
    assert main(["config", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "engine.dtype" in err and "engine.modle: unknown key" in err


def test_config_check_ok_and_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["config", "check", str(ROOT / "config.yaml")]) == 0
    assert main(["config", "check", str(tmp_path / "nope.yaml")]) == 2
    assert "not found" in capsys.readouterr().err


def test_yaml_syntax_error_is_a_config_error(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("server: [unclosed\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert err.value.problems[0][0] == "<yaml>"


def test_backoff_order_is_checked():
    from appliance.config import parse_config

    with pytest.raises(ConfigError) as err:
        parse_config({"engine": {"restart_backoff_initial_s": 10, "restart_backoff_max_s": 1}})
    assert "restart_backoff_max_s" in err.value.problems[0][1]


def test_search_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("APPLIANCE_CONFIG", raising=False)
    explicit = tmp_path / "a.yaml"
    assert find_config_path(str(explicit)) == explicit
    monkeypatch.setenv("APPLIANCE_CONFIG", str(tmp_path / "env.yaml"))
    assert find_config_path(None) == tmp_path / "env.yaml"
    monkeypatch.delenv("APPLIANCE_CONFIG")
    (tmp_path / "config.yaml").write_text("{}\n")
    if not Path("/etc/appliance/config.yaml").exists():
        assert find_config_path(None) == Path("config.yaml")


def test_default_model_lives_in_the_state_dir(tmp_path: Path):
    cfg = Config(state_dir=tmp_path)
    assert resolve_model_dir(cfg) == (tmp_path / "models" / "SmolLM2-135M-Instruct").resolve()


def test_python_dash_m_runs_the_cli():
    out = subprocess.run(
        [sys.executable, "-m", "appliance", "--help"], capture_output=True, text=True, check=True
    )
    assert "serve" in out.stdout and "config" in out.stdout
