"""The audit log against real SQLite files: one record per append with every field, text kept
out unless asked, retention, ranges, a real full database (max_page_count), a full queue, a
writer killed mid-transaction."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from appliance.services.audit_log import (
    DAY_S,
    AuditFile,
    AuditLog,
    AuditRecord,
    AuditSettings,
    digest,
    read_records,
    record_from_row,
    to_row,
)
from maintenance.audit_prune import prune_audit

ROOT = Path(__file__).resolve().parents[2]
NOW_S = 1_790_000_000.0  # 2026-09-21


def record(i: int = 0, *, time_s: float = NOW_S, text: str | None = None) -> AuditRecord:
    """A record with every field set and distinct per i."""
    prompt = text if text is not None else f"prompt {i}"
    answer = f"answer {i}"
    return AuditRecord(
        time_s=time_s,
        request_id=f"req-{i}",
        key_name="team-a" if i % 2 else "anonymous",
        lane=("realtime", "interactive", "batch")[i % 3],
        endpoint=("chat", "completion", "embeddings")[i % 3],
        model="SmolLM2-135M-Instruct",
        prompt_tokens=10 + i,
        completion_tokens=20 + i,
        status=("ok", "deadline", "rate_limited")[i % 3],
        http_status=(200, 200, 429)[i % 3],
        finish_reason=("stop", "length", None)[i % 3],
        latency_s=0.25 + i,
        prompt_sha256=digest(prompt),
        answer_sha256=digest(answer) if i % 3 != 2 else None,
        prompt_text=prompt,
        answer_text=answer,
    )


class Drops:
    """An on_drop handler that keeps every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []

    def __call__(self, count: int, reason: str) -> None:
        self.calls.append((count, reason))

    @property
    def total(self) -> int:
        return sum(count for count, _ in self.calls)


class Clock:
    def __init__(self, now_s: float = NOW_S) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def settings(tmp_path: Path, **overrides: object) -> AuditSettings:
    return AuditSettings(path=tmp_path / "state" / "audit.db", **overrides)  # type: ignore[arg-type]


def raw_rows(path: Path) -> list[sqlite3.Row]:
    db = sqlite3.connect(path)
    db.row_factory = sqlite3.Row
    try:
        return list(db.execute("SELECT * FROM audit ORDER BY id"))
    finally:
        db.close()


def test_digest_is_the_hex_sha256_of_the_utf8_text() -> None:
    assert digest("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert digest("abc") == hashlib.sha256(b"abc").hexdigest()
    assert digest("café ☕") == hashlib.sha256("café ☕".encode()).hexdigest()


def test_settings_refuse_a_non_positive_bound(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="retention_days, max_size_mib"):
        AuditSettings(path=tmp_path / "a.db", retention_days=0, max_size_mib=0)


async def test_one_record_per_append_with_every_field(tmp_path: Path) -> None:
    audit = AuditLog(settings(tmp_path, store_text=True))
    await audit.start()
    records = [record(i, time_s=NOW_S + i) for i in range(6)]
    for r in records:
        audit.append(r)
    await audit.stop()
    assert (audit.written_total, audit.dropped_total, audit.last_error) == (6, 0, None)
    exported = list(read_records(audit.settings.path))
    assert [record_from_row(row) for row in exported] == records
    assert exported[0]["time"] == "2026-09-21T14:13:20.000Z"


async def test_the_text_stays_out_of_the_file_unless_store_text(tmp_path: Path) -> None:
    audit = AuditLog(settings(tmp_path))
    await audit.start()
    audit.append(record(1, text="the secret plan"))
    await audit.stop()
    (row,) = raw_rows(audit.settings.path)
    assert (row["prompt_text"], row["answer_text"]) == (None, None)
    assert row["prompt_sha256"] == digest("the secret plan")
    assert row["answer_sha256"] == digest("answer 1")
    # Nowhere in the file either (stop() closed it: the WAL is checkpointed and gone).
    files = list(audit.settings.path.parent.iterdir())
    assert not any(b"secret plan" in f.read_bytes() for f in files), files


def test_append_touches_no_disk(tmp_path: Path) -> None:
    audit = AuditLog(settings(tmp_path))
    for i in range(3):
        audit.append(record(i))
    assert audit.queued == 3
    assert not audit.settings.path.parent.exists()


async def test_the_writer_writes_on_its_own(tmp_path: Path) -> None:
    # Every flush_interval_s, and at once when a batch is waiting.
    audit = AuditLog(settings(tmp_path, flush_interval_s=0.05))
    await audit.start()
    audit.append(record(0))
    await _until(lambda: audit.written_total == 1)
    batchy = AuditLog(settings(tmp_path / "b", flush_interval_s=30.0, batch_max_records=2))
    await batchy.start()
    batchy.append(record(1))
    batchy.append(record(2))
    await _until(lambda: batchy.written_total == 2)
    await audit.stop()
    await batchy.stop()


async def _until(done: object, timeout_s: float = 5.0) -> None:
    async def wait() -> None:
        while not done():  # type: ignore[operator]
            await asyncio.sleep(0.01)

    await asyncio.wait_for(wait(), timeout_s)


async def test_records_are_append_only_in_the_file(tmp_path: Path) -> None:
    audit = AuditLog(settings(tmp_path))
    await audit.start()
    audit.append(record(0))
    await audit.stop()
    db = sqlite3.connect(audit.settings.path)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        db.execute("UPDATE audit SET status = 'ok'")
    db.close()


async def test_prune_deletes_what_is_past_retention(tmp_path: Path) -> None:
    audit = AuditLog(settings(tmp_path, retention_days=90), clock=Clock())
    await audit.start()
    for i, age_days in enumerate([120, 90.01, 89.99, 1, 0]):
        audit.append(record(i, time_s=NOW_S - age_days * DAY_S))
    await audit.flush()
    assert audit.prune() == 2
    assert [r["request_id"] for r in audit.export(None, None)] == ["req-2", "req-3", "req-4"]
    details = await prune_audit(audit, now_s=NOW_S + 2 * DAY_S)  # the maintenance job
    assert details == {"deleted": 1, "retention_days": 90, "audit_dropped_total": 0}
    await audit.stop()


async def test_export_takes_a_half_open_range_oldest_first(tmp_path: Path) -> None:
    audit = AuditLog(settings(tmp_path))
    await audit.start()
    for i in [3, 0, 4, 1, 2]:  # finished out of order: the export orders by arrival
        audit.append(record(i, time_s=NOW_S + i * 10))
    await audit.flush()
    ids = [r["request_id"] for r in audit.export(NOW_S + 10, NOW_S + 40)]
    assert ids == ["req-1", "req-2", "req-3"]
    assert [r["request_id"] for r in audit.export(None, NOW_S + 10)] == ["req-0"]
    assert len(list(audit.export(NOW_S + 40, None))) == 1
    # A reader beside the running writer (the command while the daemon serves).
    assert len(list(read_records(audit.settings.path))) == 5
    await audit.stop()


async def test_a_full_database_drops_batches_says_so_and_recovers(tmp_path: Path) -> None:
    """The real thing: SQLite's own SQLITE_FULL, from a 1 MiB cap (PRAGMA max_page_count)."""
    drops = Drops()
    audit = AuditLog(
        settings(tmp_path, store_text=True, max_size_mib=1, batch_max_records=5),
        on_drop=drops,
        clock=Clock(),
    )
    await audit.start()
    big = "x" * 20_000
    appended = 0
    for i in range(120):  # ~2.4 MB of text into a 1 MiB file
        audit.append(record(i, time_s=NOW_S - 365 * DAY_S, text=big + str(i)))  # never raises
        appended += 1
        if i % 10 == 9:
            await audit.flush()
    await audit.flush()
    assert 0 < audit.written_total < appended
    assert audit.dropped_total == appended - audit.written_total == drops.total
    assert all(count == 5 for count, _ in drops.calls)  # one call per lost batch
    assert "database or disk is full" in drops.calls[0][1]
    assert "cap 1 MiB" in drops.calls[0][1]
    assert audit.last_error is not None and "full" in audit.last_error

    # Still full: the next batch is dropped too, and reported.
    audit.append(record(500, text=big))
    await audit.flush()
    assert audit.dropped_total == appended - audit.written_total + 1

    # Space returns (retention frees pages inside the file): new records are written again.
    assert audit.prune() == audit.written_total
    written_before = audit.written_total
    for i in range(1000, 1010):
        audit.append(record(i, text=big))
    await audit.flush()
    assert audit.written_total == written_before + 10
    await audit.stop()
    assert sorted(r["request_id"] for r in read_records(audit.settings.path)) == sorted(
        f"req-{i}" for i in range(1000, 1010)
    )


async def test_a_bigger_cap_takes_records_again(tmp_path: Path) -> None:
    drops = Drops()
    small = AuditLog(settings(tmp_path, store_text=True, max_size_mib=1), on_drop=drops)
    await small.start()
    small.append(record(0, text="y" * 2_000_000))  # bigger than the whole cap
    await small.stop()
    assert (small.written_total, small.dropped_total) == (0, 1)
    bigger = AuditLog(settings(tmp_path, store_text=True, max_size_mib=8))
    await bigger.start()
    bigger.append(record(1, text="y" * 2_000_000))
    await bigger.stop()
    assert (bigger.written_total, bigger.dropped_total) == (1, 0)


async def test_a_full_queue_drops_and_reports_without_flooding(tmp_path: Path) -> None:
    drops = Drops()
    clock = Clock()
    audit = AuditLog(settings(tmp_path, queue_max_records=3), on_drop=drops, clock=clock)
    for i in range(3 + 50):  # no writer: the queue fills
        audit.append(record(i))
    assert audit.dropped_total == 50
    assert drops.calls[0][0] == 1 and len(drops.calls) == 1  # the first at once, then held
    assert "audit queue full (3 records" in drops.calls[0][1]
    clock.now_s += 1.5
    audit.append(record(99))
    assert drops.calls[-1][0] == 50 - 1 + 1 and len(drops.calls) == 2
    audit.append(record(100))
    await audit.flush()  # writes the queue, reports what was held
    assert drops.total == audit.dropped_total == 52
    assert audit.written_total == 3
    audit.append(record(101))  # room again
    await audit.stop()
    assert audit.written_total == 4


def test_the_queue_is_bounded_in_bytes_too(tmp_path: Path) -> None:
    audit = AuditLog(settings(tmp_path, store_text=True, queue_max_mib=1))
    for i in range(4):
        audit.append(record(i, text="z" * 300_000))
    assert (audit.queued, audit.dropped_total) == (3, 1)


async def test_a_file_that_does_not_open_costs_records_not_requests(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    drops = Drops()
    audit = AuditLog(AuditSettings(path=blocker / "audit.db"), on_drop=drops)
    await audit.start()  # does not raise
    assert audit.last_error is not None and "does not open" in audit.last_error
    audit.append(record(0))
    await audit.stop()
    assert (audit.dropped_total, drops.total) == (1, 1)
    assert "does not open" in drops.calls[0][1]


async def test_a_bad_record_or_a_failing_handler_never_reaches_the_request(
    tmp_path: Path,
) -> None:
    def failing(count: int, reason: str) -> None:
        raise RuntimeError("the event bus is down")

    audit = AuditLog(settings(tmp_path), on_drop=failing)
    await audit.start()
    audit.append(dataclasses.replace(record(0), prompt_tokens="many"))  # type: ignore[arg-type]
    audit.append(record(1))
    await audit.stop()
    assert (audit.written_total, audit.dropped_total) == (1, 1)
    assert audit.last_error is not None and "not recordable" in audit.last_error


def test_the_log_decides_on_text_whatever_the_caller_hands() -> None:
    row = to_row(record(0), store_text=False)
    assert row[-2:] == (None, None)
    assert to_row(record(0), store_text=True)[-2:] == ("prompt 0", "answer 0")


_KILLED_WRITER = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from tests.unit.test_audit_log import record
    from appliance.services.audit_log import AuditFile, to_row

    audit_file = AuditFile(Path(sys.argv[1]))
    audit_file.insert([to_row(record(i), True) for i in range(5)])

    def rows_then_death():
        # ~5 MB of rows, more than SQLite's page cache: frames reach the WAL uncommitted.
        for i in range(100, 150):
            yield to_row(record(i, text="w" * 100_000), True)
        os._exit(9)

    audit_file.insert(rows_then_death())
    """
)


def test_a_writer_killed_mid_batch_leaves_a_consistent_file(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_WRITER, str(path)], cwd=ROOT, timeout=60, check=False
    )
    assert done.returncode == 9
    assert Path(f"{path}-wal").stat().st_size > 1_000_000  # the batch was on its way
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    db.close()
    # Reopened as the daemon would: the first batch whole, nothing of the second.
    assert [r["request_id"] for r in read_records(path)] == [f"req-{i}" for i in range(5)]
    reopened = AuditFile(path)
    assert reopened.insert([to_row(record(7), False)]) == 1
    reopened.close()
    assert len(list(read_records(path))) == 6


async def test_a_stuck_writer_costs_records_not_requests_nor_shutdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk that hangs: the queue fills and drops (reported), stop() gives up in time."""
    release = threading.Event()
    insert = AuditFile.insert

    def hung_insert(self: AuditFile, rows: object) -> int:
        release.wait(10)
        return insert(self, rows)  # type: ignore[arg-type]

    monkeypatch.setattr(AuditFile, "insert", hung_insert)
    drops = Drops()
    audit = AuditLog(
        settings(tmp_path, queue_max_records=4, batch_max_records=2, flush_interval_s=0.01),
        on_drop=drops,
    )
    await audit.start()
    try:
        audit.append(record(0))
        audit.append(record(1))
        await _until(lambda: audit.queued == 0)  # the writer took them and hangs
        for i in range(2, 10):
            audit.append(record(i))  # 4 wait, 4 are dropped
        assert (audit.queued, audit.dropped_total) == (4, 4)
        assert "queue full" in drops.calls[0][1]
        await asyncio.wait_for(audit.stop(timeout_s=0.2), 5)
    finally:
        release.set()
    assert audit.dropped_total == drops.total == 4 + 4 + 2  # the queue and the batch in flight
    assert "still busy 0.2 s into shutdown: 6 records" in drops.calls[-1][1]


@pytest.mark.parametrize(
    ("field", "value"),
    [("time_s", float("nan")), ("latency_s", float("inf")), ("completion_tokens", 2**64)],
)
async def test_a_value_sqlite_refuses_costs_its_record_not_its_batch(
    tmp_path: Path, field: str, value: object
) -> None:
    audit = AuditLog(settings(tmp_path))
    await audit.start()
    audit.append(record(0))
    audit.append(dataclasses.replace(record(1), **{field: value}))
    audit.append(record(2))
    await audit.stop()
    assert (audit.written_total, audit.dropped_total) == (2, 1)
    assert field in (audit.last_error or "")
