"""`appliance audit export` on a real audit file, found through a real config."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from appliance.commands import audit
from appliance.commands.audit import audit_path, parse_time, write_atomically
from appliance.services.audit_log import AuditFile, to_row
from tests.unit.test_audit_log import record

JAN_31_S = datetime(2026, 1, 31, tzinfo=UTC).timestamp()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="appliance")
    audit.register(p.add_subparsers(dest="command", required=True))
    return p


def run(*argv: str) -> int:
    args = parser().parse_args(["audit", "export", *argv])
    return int(args.func(args))


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A config whose state_dir holds an audit file: requests on Jan 30, 31 and Feb 1."""
    state = tmp_path / "state"
    audit_file = AuditFile(state / "audit.db")
    times = [JAN_31_S - 3600, JAN_31_S, JAN_31_S + 86399.5, JAN_31_S + 86400]
    # Inserted newest first: the export still reads oldest first.
    audit_file.insert(
        to_row(record(i, time_s=t), False) for i, t in reversed(list(enumerate(times)))
    )
    audit_file.close()
    path = tmp_path / "config.yaml"
    path.write_text(f"state_dir: {state}\n")
    return path


def lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]


def test_export_writes_json_lines_oldest_first(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("--config", str(config)) == 0
    out, err = capsys.readouterr()
    records = lines(out)
    assert [r["request_id"] for r in records] == ["req-0", "req-1", "req-2", "req-3"]
    first = records[0]
    assert first["time"] == "2026-01-30T23:00:00.000Z"
    assert first["time_s"] == JAN_31_S - 3600
    assert first["prompt_sha256"] == record(0).prompt_sha256
    assert (first["prompt_text"], first["answer_text"]) == (None, None)
    assert "4 records" in err


def test_a_date_alone_is_the_whole_day(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("--config", str(config), "--from", "2026-01-31", "--to", "2026-01-31") == 0
    assert [r["request_id"] for r in lines(capsys.readouterr().out)] == ["req-1", "req-2"]
    assert (
        run("--config", str(config), "--from", "2026-01-31T00:00:00Z", "--to", "2026-02-01T00:00")
        == 0
    )
    assert [r["request_id"] for r in lines(capsys.readouterr().out)] == ["req-1", "req-2"]


def test_times_are_utc_unless_they_say_otherwise() -> None:
    assert parse_time("2026-01-31T01:00:00+01:00", end=False) == JAN_31_S
    assert parse_time("2026-01-31T00:00", end=True) == JAN_31_S  # a time is itself, even as --to
    assert parse_time("2026-01-31", end=True) == JAN_31_S + 86400


def test_out_writes_the_file_whole(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "export" / "audit.jsonl"
    out.parent.mkdir()
    assert run("--config", str(config), "--from", "2026-02-01", "--out", str(out)) == 0
    assert [r["request_id"] for r in lines(out.read_text())] == ["req-3"]
    assert capsys.readouterr().out == ""
    assert list(out.parent.iterdir()) == [out]  # no temporary file left


def test_a_failed_export_leaves_the_old_file_and_no_half_one(tmp_path: Path) -> None:
    out = tmp_path / "audit.jsonl"
    out.write_text("the previous export\n")

    def records_then_failure():  # type: ignore[no-untyped-def]
        yield {"request_id": "req-0"}
        raise OSError("the disk went away")

    with pytest.raises(OSError, match="went away"):
        write_atomically(out, records_then_failure())
    assert out.read_text() == "the previous export\n"
    assert list(tmp_path.iterdir()) == [out]


@pytest.mark.parametrize("flag", ["--from", "--to"])
def test_a_bad_time_names_the_flag_and_the_format(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        run(flag, "31/01/2026")
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: '31/01/2026' is not a date or time in ISO 8601" in err


def test_from_after_to_is_refused(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("--config", str(config), "--from", "2026-02-01", "--to", "2026-01-01") == 2
    assert "--from must be before --to" in capsys.readouterr().err


def test_no_audit_file_says_where_it_looked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {tmp_path / 'empty'}\n")
    assert run("--config", str(config)) == 1
    err = capsys.readouterr().err
    assert f"no audit log at {tmp_path / 'empty' / 'audit.db'}" in err
    assert not (tmp_path / "empty").exists()  # reading never creates the file


def test_audit_path_follows_the_config() -> None:
    state = Path("/var/lib/appliance")
    assert audit_path(SimpleNamespace(state_dir=state)) == state / "audit.db"  # type: ignore[arg-type]
    with_section = SimpleNamespace(state_dir=state, audit=SimpleNamespace(path=Path("a/log.db")))
    assert audit_path(with_section) == state / "a/log.db"  # type: ignore[arg-type]
    absolute = SimpleNamespace(state_dir=state, audit=SimpleNamespace(path=Path("/srv/audit.db")))
    assert audit_path(absolute) == Path("/srv/audit.db")  # type: ignore[arg-type]


def test_a_file_that_is_no_audit_log_is_an_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "audit.db").write_text("not a database, just text that is long enough " * 50)
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {state}\n")
    assert run("--config", str(config)) == 1
    assert "audit export: file is not a database" in capsys.readouterr().err


def test_an_out_folder_that_is_missing_is_an_error(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("--config", str(config), "--out", str(tmp_path / "nowhere" / "a.jsonl")) == 1
    assert "No such file or directory" in capsys.readouterr().err
