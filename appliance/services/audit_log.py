"""The audit log: one append-only record per request in its own SQLite file (WAL).

A request never waits on the audit log and never fails because of it: `AuditLog.append` puts
a row on a bounded in-memory queue and returns; a writer task inserts batches in a worker
thread, each batch one transaction. A batch SQLite refuses (disk full, the file's size cap,
an unwritable directory) is dropped, counted and reported through `on_drop`, and the next
batch tries again, so the queue stays bounded and writing resumes once space returns (a
prune, a bigger cap, a freed disk). A record that cannot wait (queue full) is dropped the
same way. Records hold SHA-256 digests of the prompt and the answer; the text itself only
when `store_text` is on.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from appliance.services.sqlite_db import SqliteDb

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
DAY_S = 86400.0
MIB = 1024 * 1024
# Prune deletes in chunks, each its own transaction, so the writer never waits long for it.
PRUNE_CHUNK_ROWS = 5000
# Queue-full drops are reported at most this often (a stuck writer must not flood events).
OVERFLOW_REPORT_INTERVAL_S = 1.0
# A row's fixed fields, roughly, for the queue's size bound (the text is counted exactly).
ROW_OVERHEAD_BYTES = 256
# How long shutdown waits for the writer (a hung disk must not hold the daemon's stop).
STOP_TIMEOUT_S = 10.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY, time_s REAL NOT NULL, request_id TEXT NOT NULL,
    key_name TEXT NOT NULL, lane TEXT NOT NULL, endpoint TEXT NOT NULL, model TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, status TEXT NOT NULL,
    http_status INTEGER NOT NULL, finish_reason TEXT, latency_s REAL NOT NULL,
    prompt_sha256 TEXT NOT NULL, answer_sha256 TEXT, prompt_text TEXT, answer_text TEXT);
CREATE INDEX IF NOT EXISTS audit_time ON audit(time_s);
-- Append-only in the file itself: a record is never changed; only retention deletes it.
CREATE TRIGGER IF NOT EXISTS audit_append_only BEFORE UPDATE ON audit
BEGIN SELECT RAISE(ABORT, 'audit records are append-only'); END;
"""


@dataclass(frozen=True)
class AuditSettings:
    """Where the audit log lives, what it keeps and for how long."""

    path: Path
    store_text: bool = False
    retention_days: int = 90
    # A cap on the database (PRAGMA max_page_count); None: the disk is the cap. The WAL file
    # comes on top, up to about 4 MiB between checkpoints.
    max_size_mib: int | None = None
    # The in-memory queue's bounds: what waits for the writer, in records and in MiB.
    queue_max_records: int = 10_000
    queue_max_mib: int = 64
    batch_max_records: int = 500
    flush_interval_s: float = 0.5

    def __post_init__(self) -> None:
        positive = {
            "retention_days": self.retention_days,
            "queue_max_records": self.queue_max_records,
            "queue_max_mib": self.queue_max_mib,
            "batch_max_records": self.batch_max_records,
            "flush_interval_s": self.flush_interval_s,
            "max_size_mib": 1 if self.max_size_mib is None else self.max_size_mib,
        }
        bad = [name for name, value in positive.items() if value <= 0]
        if bad:
            raise ValueError(f"AuditSettings: {', '.join(bad)} must be positive")


@dataclass(frozen=True)
class AuditRecord:
    """What the audit log keeps of one request (accepted, rejected, cut or failed)."""

    time_s: float  # unix time the request arrived
    request_id: str
    key_name: str  # the API key's name; "anonymous" when no keys are configured
    lane: str  # realtime | interactive | batch
    endpoint: str  # chat, completion, responses, embeddings, ...
    model: str
    prompt_tokens: int
    completion_tokens: int
    # ok, deadline, rejected, rate_limited, forbidden, deadline_queued, not_ready, error,
    # cancelled
    status: str
    http_status: int
    finish_reason: str | None
    latency_s: float
    prompt_sha256: str
    answer_sha256: str | None
    prompt_text: str | None = None  # written only when store_text
    answer_text: str | None = None


# The columns in the record's field order; the two text columns come last (_row_bytes).
COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(AuditRecord))
_INSERT = f"INSERT INTO audit({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"

Row = tuple[Any, ...]


def digest(text: str) -> str:
    """The hex SHA-256 of the text's UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def iso_utc(time_s: float) -> str:
    """Unix time as ISO 8601 UTC with milliseconds, e.g. 2026-01-31T14:00:00.000Z."""
    stamp = datetime.fromtimestamp(time_s, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def to_row(record: AuditRecord, store_text: bool) -> Row:
    """The record as the columns hold it; the text only when store_text (the log decides,
    whatever the caller handed). Raises on a field that is not what its column holds."""

    # Checked here, one record at a time: a value SQLite refuses (NaN in a NOT NULL column,
    # an integer past 64 bits) would otherwise cost its whole batch.
    def opt_str(value: Any) -> str | None:
        return None if value is None else str(value)

    def finite(name: str, value: Any) -> float:
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"{name} is {number}")
        return number

    def int64(name: str, value: Any) -> int:
        number = int(value)
        if not -(2**63) <= number < 2**63:
            raise ValueError(f"{name} is past 64 bits")
        return number

    r = record
    return (
        finite("time_s", r.time_s),
        str(r.request_id),
        str(r.key_name),
        str(r.lane),
        str(r.endpoint),
        str(r.model),
        int64("prompt_tokens", r.prompt_tokens),
        int64("completion_tokens", r.completion_tokens),
        str(r.status),
        int64("http_status", r.http_status),
        opt_str(r.finish_reason),
        finite("latency_s", r.latency_s),
        str(r.prompt_sha256),
        opt_str(r.answer_sha256),
        opt_str(r.prompt_text) if store_text else None,
        opt_str(r.answer_text) if store_text else None,
    )


def _row_bytes(row: Row) -> int:
    """About what a queued row holds in memory: the text exactly, the rest roughly."""
    return ROW_OVERHEAD_BYTES + sum(len(v) for v in row[-2:] if v is not None)


def is_full_error(exc: BaseException) -> bool:
    """Whether SQLite refused for want of space (the disk, or the file's cap)."""
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL


class AuditFile:
    """The audit SQLite file: schema, batched inserts, retention. Thread-safe (one lock)."""

    def __init__(self, path: Path, max_size_mib: int | None = None) -> None:
        self.path = path
        # One connection, used from the writer's worker threads in turn under its lock.
        self._sql = SqliteDb(path, _SCHEMA)
        try:
            if max_size_mib is not None:
                self.set_max_size_mib(max_size_mib)
            with self._sql.tx() as cur:
                cur.execute(
                    "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )
        except BaseException:
            self._sql.close()
            raise

    def set_max_size_mib(self, max_size_mib: int) -> None:
        """Cap the database at about this size (never below what it holds now)."""
        page_size = int(self._sql.query("PRAGMA page_size")[0][0])
        pages = max(1, max_size_mib * MIB // page_size)
        self._sql.query(f"PRAGMA max_page_count={pages}")

    def insert(self, rows: Iterable[Row]) -> int:
        """Insert the rows in one transaction (all or none); how many."""
        with self._sql.tx() as cur:
            cur.executemany(_INSERT, rows)
            return cur.rowcount

    def delete_before(self, cutoff_s: float) -> int:
        """Delete the records that arrived before cutoff_s, a chunk per transaction."""
        deleted = 0
        while True:
            with self._sql.tx() as cur:
                cur.execute(
                    "DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE time_s < ? LIMIT ?)",
                    (cutoff_s, PRUNE_CHUNK_ROWS),
                )
                count = cur.rowcount
            deleted += count
            if count < PRUNE_CHUNK_ROWS:
                return deleted

    def close(self) -> None:
        self._sql.close()


def read_records(
    path: Path, from_s: float | None = None, to_s: float | None = None
) -> Iterator[dict[str, Any]]:
    """The records that arrived in [from_s, to_s), oldest first, each a dict of the columns
    plus `time` (ISO 8601 UTC). Opens the file read-only: works with the daemon running or
    stopped; FileNotFoundError when there is no file."""
    path = Path(path).resolve()
    if not path.is_file():  # checked now, not at the first record: mode=ro would say less
        raise FileNotFoundError(f"no audit log at {path}")
    db = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        cur = db.execute(
            f"SELECT {', '.join(COLUMNS)} FROM audit WHERE time_s >= ? AND time_s < ? "
            "ORDER BY time_s, id",
            (float("-inf") if from_s is None else from_s, float("inf") if to_s is None else to_s),
        )
    except BaseException:
        db.close()
        raise
    return _rows(db, cur)


def _rows(db: sqlite3.Connection, cur: sqlite3.Cursor) -> Iterator[dict[str, Any]]:
    try:
        while chunk := cur.fetchmany(1000):
            for row in chunk:
                record = dict(zip(COLUMNS, row, strict=True))
                yield {"time": iso_utc(record["time_s"]), **record}
    finally:
        db.close()


DropHandler = Callable[[int, str], None]


@dataclass(frozen=True)
class _BatchResult:
    written: int
    error: str | None


class AuditLog:
    """The daemon's audit log: `append` from the request path, a writer task does the disk."""

    def __init__(
        self,
        settings: AuditSettings,
        *,
        on_drop: DropHandler | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._on_drop = on_drop
        self._clock = clock
        self._queue: deque[Row] = deque()
        self._queued_bytes = 0
        self._file: AuditFile | None = None
        # The writer's threads and a prune's may both find the file unopened.
        self._open_lock = threading.Lock()
        self._dropped_total = 0
        self._written_total = 0
        self._last_error: str | None = None
        self._overflow_pending = 0
        self._overflow_reported_s = float("-inf")
        # One batch in flight at a time, so flush() also waits for the writer's batch.
        self._batch_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._in_flight = 0

    # -- the request path: memory only, never raises ---------------------------------

    def append(self, record: AuditRecord) -> None:
        """Queue the record for the writer. Never raises and touches no disk; call it from
        the event loop's thread. A record that cannot be queued is dropped and reported."""
        try:
            row = to_row(record, self.settings.store_text)
        except Exception as exc:  # a malformed record must not fail its request
            self._drop_now(1, f"audit record not recordable: {exc!r}")
            return
        size = _row_bytes(row)
        if (
            len(self._queue) >= self.settings.queue_max_records
            or self._queued_bytes + size > self.settings.queue_max_mib * MIB
        ):
            self._dropped_total += 1
            self._overflow_pending += 1
            self._report_overflow(force=False)
            return
        self._queue.append(row)
        self._queued_bytes += size
        if len(self._queue) >= self.settings.batch_max_records:
            self._wake.set()

    # -- the writer ------------------------------------------------------------------

    async def start(self) -> None:
        """Open the file and start the writer. A file that does not open is not fatal:
        last_error says why and each batch tries again (and is dropped while it fails)."""
        await asyncio.to_thread(self._open)
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="audit-writer")

    async def flush(self) -> None:
        """Write everything queued now (the writer's batch in flight included)."""
        while self._queue:
            await self._write_batch()
        async with self._batch_lock:  # a batch the writer took before we looked
            pass
        self._report_overflow(force=True)

    async def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop the writer, write what is queued, close the file. A writer stuck on the disk
        does not hold shutdown past timeout_s: what it had not written counts as dropped."""
        try:
            await asyncio.wait_for(self._finish(), timeout_s)
        except TimeoutError:
            self._task = None
            self._report_overflow(force=True)
            lost = len(self._queue) + self._in_flight
            self._queue.clear()
            self._queued_bytes = 0
            self._in_flight = 0
            if lost:
                self._drop_now(
                    lost,
                    f"audit writer still busy {timeout_s:g} s into shutdown: {lost} records "
                    "not written (a batch in flight may yet reach the file)",
                )

    async def _finish(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task
            self._task = None
        await self.flush()
        async with self._batch_lock:
            await asyncio.to_thread(self._close)

    async def _run(self) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.flush_interval_s)
            self._wake.clear()
            try:
                while self._queue and not self._stopping:
                    await self._write_batch()
                self._report_overflow(force=True)
            except Exception:  # the writer must outlive any surprise; stop() flushes the rest
                log.exception("audit writer round failed")

    async def _write_batch(self) -> None:
        async with self._batch_lock:
            count = min(len(self._queue), self.settings.batch_max_records)
            if not count:
                return
            batch = [self._queue.popleft() for _ in range(count)]
            self._queued_bytes -= sum(_row_bytes(row) for row in batch)
            # Left standing when cancelled (a stop that gave up): stop() counts it as lost.
            self._in_flight = count
            result = await asyncio.to_thread(self._write_rows, batch)
            self._in_flight = 0
        self._written_total += result.written
        if result.error is not None:
            self._drop_now(len(batch), result.error)

    def _open(self) -> AuditFile | None:
        """The file, opened now if need be; None (and last_error) when it does not open."""
        with self._open_lock:
            if self._file is not None:
                return self._file
            try:
                self._file = AuditFile(self.settings.path, self.settings.max_size_mib)
            except (sqlite3.Error, OSError) as exc:
                self._last_error = f"audit log {self.settings.path} does not open: {exc}"
                log.warning("%s", self._last_error)
        return self._file

    def _close(self) -> None:
        with self._open_lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _write_rows(self, batch: list[Row]) -> _BatchResult:
        """In a worker thread: the batch in one transaction, or why not."""
        audit_file = self._open()
        if audit_file is None:
            return _BatchResult(0, f"audit batch of {len(batch)} lost: {self._last_error}")
        try:
            return _BatchResult(audit_file.insert(batch), None)
        except Exception as exc:  # whatever it is, the batch is lost and must be counted
            cap = self.settings.max_size_mib
            where = f"{self.settings.path}" + (f", cap {cap} MiB" if cap else "")
            self._last_error = f"audit batch of {len(batch)} lost: {exc} ({where})"
            if not is_full_error(exc):  # perhaps a broken connection: open afresh next batch
                with contextlib.suppress(sqlite3.Error):
                    self._close()
            return _BatchResult(0, self._last_error)

    # -- drops -----------------------------------------------------------------------

    def _drop_now(self, count: int, reason: str) -> None:
        self._dropped_total += count
        self._last_error = reason
        log.warning("%s", reason)
        self._notify(count, reason)

    def _report_overflow(self, *, force: bool) -> None:
        """Report the queue-full drops not yet reported: at once for the first, then at
        most once per OVERFLOW_REPORT_INTERVAL_S (force: now, for the writer and flush)."""
        if not self._overflow_pending:
            return
        now_s = self._clock()
        if not force and now_s - self._overflow_reported_s < OVERFLOW_REPORT_INTERVAL_S:
            return
        count, self._overflow_pending = self._overflow_pending, 0
        self._overflow_reported_s = now_s
        reason = (
            f"audit queue full ({self.settings.queue_max_records} records or "
            f"{self.settings.queue_max_mib} MiB waiting): the writer is behind or stuck"
        )
        self._last_error = reason
        log.warning("%s; %d records lost", reason, count)
        self._notify(count, reason)

    def _notify(self, count: int, reason: str) -> None:
        if self._on_drop is None:
            return
        try:
            self._on_drop(count, reason)
        except Exception:  # the handler's failure must not reach the request either
            log.exception("audit on_drop handler failed")

    # -- retention and reading -------------------------------------------------------

    def prune(self, now_s: float | None = None) -> int:
        """Delete the records older than retention_days; how many. Blocking: run it in a
        thread. Frees pages inside the file that later batches reuse (the file keeps its
        size on disk)."""
        audit_file = self._open()
        if audit_file is None:
            raise OSError(self._last_error)
        now_s = self._clock() if now_s is None else now_s
        return audit_file.delete_before(now_s - self.settings.retention_days * DAY_S)

    def export(self, from_s: float | None, to_s: float | None) -> Iterator[dict[str, Any]]:
        """The written records that arrived in [from_s, to_s), oldest first. Blocking."""
        return read_records(self.settings.path, from_s, to_s)

    # -- state -----------------------------------------------------------------------

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def dropped_total(self) -> int:
        return self._dropped_total

    @property
    def written_total(self) -> int:
        return self._written_total

    @property
    def last_error(self) -> str | None:
        return self._last_error


def record_from_row(row: dict[str, Any]) -> AuditRecord:
    """An exported row back as a record (the columns, without `time` and `id`)."""
    return AuditRecord(**{name: row[name] for name in COLUMNS})
