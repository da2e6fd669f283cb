"""`appliance keys add|list|revoke` against a real store file in a temporary state_dir."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from appliance.commands import keys as keys_command
from appliance.domain.lanes import Lane
from appliance.services.key_store import KeyRegistry, KeyStore


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(f"state_dir: {tmp_path / 'state'}\n")
    return path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="appliance")
    keys_command.register(parser.add_subparsers(dest="command", required=True))
    return parser


def run(config: Path, *argv: str) -> int:
    args = _parser().parse_args(["keys", *argv, "--config", str(config)])
    return int(args.func(args))


def _store(config: Path) -> KeyStore:
    return KeyStore(config.parent / "state" / "appliance.db")


def _add(config: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert run(config, "add", *argv) == 0
    out, err = capsys.readouterr()
    [secret] = out.split()  # stdout is the secret alone, so `$(appliance keys add ...)` works
    assert "not be shown again" in err and secret not in err
    return secret


def test_add_prints_the_secret_once_and_list_never(
    config: Path, capsys: pytest.CaptureFixture[str]
):
    secret = _add(
        config,
        capsys,
        "alice",
        "--lanes",
        "interactive",
        "--rpm",
        "60",
        "--tpm",
        "90000",
        "--share",
        "0.5",
        "--weight",
        "3",
    )
    assert secret.startswith("sk-app-")
    [info] = _store(config).list()
    assert info.spec.max_lane == Lane.INTERACTIVE and info.spec.concurrency_share == 0.5
    assert KeyRegistry(_store(config)).authenticate(f"Bearer {secret}").name == "alice"

    assert run(config, "list") == 0
    out, _ = capsys.readouterr()
    assert secret not in out and secret[12:20] not in out
    assert f"{secret[:12]}…" in out
    assert "alice" in out and "interactive,batch" in out and "90000" in out and "0.5" in out

    assert run(config, "list", "--json") == 0
    out, _ = capsys.readouterr()
    [row] = json.loads(out)
    assert row["prefix"] == secret[:12] and row["lanes"] == ["interactive", "batch"]
    assert row["requests_per_min"] == 60 and row["revoked_s"] is None
    assert secret not in out and not {"sha256", "hash", "secret"} & set(row)


def test_revoke_and_list_all(config: Path, capsys: pytest.CaptureFixture[str]):
    secret = _add(config, capsys, "bob", "--lanes", "batch", "--downgrade")
    reg = KeyRegistry(_store(config))
    assert run(config, "revoke", "bob") == 0
    assert "'bob' revoked" in capsys.readouterr().out
    reg.refresh()
    assert reg.keys == ()

    assert run(config, "list") == 0
    assert "bob" not in capsys.readouterr().out
    assert run(config, "list", "--all", "--json") == 0
    out, _ = capsys.readouterr()
    [row] = json.loads(out)
    assert row["name"] == "bob" and row["revoked_s"] is not None and row["downgrade"] is True
    assert secret not in out

    assert run(config, "revoke", "bob") == 1  # already revoked
    assert "no active key named 'bob'" in capsys.readouterr().err


def test_list_without_keys_says_open(config: Path, capsys: pytest.CaptureFixture[str]):
    assert run(config, "list") == 0
    assert "open" in capsys.readouterr().out
    assert run(config, "list", "--json") == 0
    assert json.loads(capsys.readouterr().out) == []


def test_duplicate_name(config: Path, capsys: pytest.CaptureFixture[str]):
    _add(config, capsys, "alice", "--lanes", "realtime")
    assert run(config, "add", "alice", "--lanes", "batch") == 1
    out, err = capsys.readouterr()
    assert out == "" and "'alice'" in err


@pytest.mark.parametrize(
    ("argv", "flag", "limit"),
    [
        (["--rpm", "0"], "--rpm", "at least 1"),
        (["--tpm", "-1"], "--tpm", "at least 1"),
        (["--share", "0"], "--share", "(0, 1]"),
        (["--share", "1.5"], "--share", "(0, 1]"),
        (["--weight", "101"], "--weight", "1 to 100"),
        (["--weight", "0"], "--weight", "1 to 100"),
    ],
)
def test_bad_values_exit_2_naming_the_flag(
    config: Path, capsys: pytest.CaptureFixture[str], argv: list[str], flag: str, limit: str
):
    assert run(config, "add", "alice", "--lanes", "batch", *argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and flag in err and limit in err
    assert _store(config).list() == []


def test_bad_name_exits_2(config: Path, capsys: pytest.CaptureFixture[str]):
    assert run(config, "add", "Bad Name", "--lanes", "batch") == 2
    assert "NAME" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["add", "alice", "--lanes", "urgent"], "--lanes"),
        (["add", "alice"], "--lanes"),  # the ceiling is required
        (["add", "alice", "--lanes", "batch", "--rpm", "ten"], "--rpm"),
        (["add", "alice", "--lanes", "batch", "--share", "half"], "--share"),
    ],
)
def test_argparse_errors_exit_2_naming_the_flag(
    config: Path, capsys: pytest.CaptureFixture[str], argv: list[str], flag: str
):
    with pytest.raises(SystemExit) as exc:
        run(config, *argv)
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


def test_purge_says_when_the_api_is_open_again(
    config: Path, capsys: pytest.CaptureFixture[str]
):
    _add(config, capsys, "carol", "--lanes", "batch")
    assert run(config, "revoke", "carol") == 0
    capsys.readouterr()
    assert run(config, "purge") == 0
    out = capsys.readouterr().out
    assert "1 revoked key(s) forgotten" in out and "open to anyone" in out
    assert KeyRegistry(_store(config)).open
