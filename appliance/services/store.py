"""The state store: one SQLite file (WAL) for events, job runs, benchmarks, metric history,
controller decisions, threshold sets and daily usage per API key. Every write is one
transaction, so a killed daemon leaves a consistent database."""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.services.sqlite_db import SqliteDb

SCHEMA_VERSION = 1
# meta key of the controller's ceiling and who set it (services/control_loop.py keeps it).
_CEILING_KEY = "controller_ceiling"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY, ts_s REAL NOT NULL, kind TEXT NOT NULL, reason TEXT NOT NULL,
    data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_ts ON events(ts_s);
CREATE TABLE IF NOT EXISTS job_runs (
    id INTEGER PRIMARY KEY, job TEXT NOT NULL, trigger TEXT NOT NULL, started_s REAL NOT NULL,
    ended_s REAL, outcome TEXT NOT NULL, details TEXT NOT NULL DEFAULT '{}', error TEXT);
CREATE INDEX IF NOT EXISTS job_runs_job ON job_runs(job, started_s);
CREATE TABLE IF NOT EXISTS benchmarks (
    id INTEGER PRIMARY KEY, ts_s REAL NOT NULL, source TEXT NOT NULL, result TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS metric_samples (
    ts_s REAL NOT NULL, resolution_s INTEGER NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (resolution_s, ts_s));
CREATE TABLE IF NOT EXISTS controller_decisions (
    id INTEGER PRIMARY KEY, ts_s REAL NOT NULL, limit_value INTEGER NOT NULL,
    reason TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS usage_daily (
    day TEXT NOT NULL, key TEXT NOT NULL, status TEXT NOT NULL, requests INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,
    PRIMARY KEY (day, key, status));
CREATE TABLE IF NOT EXISTS thresholds (
    id INTEGER PRIMARY KEY, ts_s REAL NOT NULL, active INTEGER NOT NULL, source TEXT NOT NULL,
    data TEXT NOT NULL);
"""


@dataclass(frozen=True)
class JobRun:
    """One run of a maintenance job as stored."""

    id: int
    job: str
    trigger: str
    started_s: float
    ended_s: float | None
    outcome: str
    details: dict[str, Any]
    error: str | None


@dataclass(frozen=True)
class UsageRow:
    """One key's requests of one status on one UTC day, and their tokens."""

    day: str
    key: str
    status: str
    requests: int
    prompt_tokens: int
    completion_tokens: int


class StateStore:
    """Thread-safe access to appliance.db; small synchronous transactions."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._sql = SqliteDb(path, _SCHEMA)
        self._sql.conn.execute("PRAGMA foreign_keys=ON")
        with self._tx() as cur:
            cur.execute(
                "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
        # Runs left 'running' by a daemon that died mid-job are closed as interrupted.
        with self._tx() as cur:
            cur.execute(
                "UPDATE job_runs SET outcome='interrupted', ended_s=? WHERE outcome='running'",
                (time.time(),),
            )

    def _tx(self) -> AbstractContextManager[sqlite3.Cursor]:
        return self._sql.tx()

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return self._sql.query(sql, args)

    def close(self) -> None:
        self._sql.close()

    # -- events ----------------------------------------------------------------------

    def add_event(self, ts_s: float, kind: str, reason: str, data: dict[str, Any]) -> None:
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO events(ts_s, kind, reason, data) VALUES (?, ?, ?, ?)",
                (ts_s, kind, reason, json.dumps(data, default=str)),
            )

    def events(self, limit: int = 100, kind: str | None = None) -> list[dict[str, Any]]:
        """Newest events last."""
        where, args = ("WHERE kind = ?", (kind,)) if kind else ("", ())
        rows = self._query(
            f"SELECT ts_s, kind, reason, data FROM events {where} ORDER BY id DESC LIMIT ?",
            (*args, limit),
        )
        return [
            {"ts_s": ts, "kind": k, "reason": r, "data": json.loads(d)}
            for ts, k, r, d in reversed(rows)
        ]

    # -- job runs --------------------------------------------------------------------

    def start_job_run(self, job: str, trigger: str) -> int:
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO job_runs(job, trigger, started_s, outcome) "
                "VALUES (?, ?, ?, 'running')",
                (job, trigger, time.time()),
            )
            return int(cur.lastrowid or 0)

    def finish_job_run(
        self, run_id: int, outcome: str, details: dict[str, Any], error: str | None = None
    ) -> None:
        with self._tx() as cur:
            cur.execute(
                "UPDATE job_runs SET ended_s=?, outcome=?, details=?, error=? WHERE id=?",
                (time.time(), outcome, json.dumps(details, default=str), error, run_id),
            )

    def job_runs(self, job: str | None = None, limit: int = 20) -> list[JobRun]:
        """Newest first."""
        where, args = ("WHERE job = ?", (job,)) if job else ("", ())
        rows = self._query(
            "SELECT id, job, trigger, started_s, ended_s, outcome, details, error FROM job_runs "
            f"{where} ORDER BY id DESC LIMIT ?",
            (*args, limit),
        )
        return [JobRun(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]), r[7]) for r in rows]

    # -- benchmarks ------------------------------------------------------------------

    def add_benchmark(self, source: str, result: dict[str, Any]) -> int:
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO benchmarks(ts_s, source, result) VALUES (?, ?, ?)",
                (time.time(), source, json.dumps(result, default=str)),
            )
            return int(cur.lastrowid or 0)

    def benchmarks(self, limit: int = 10) -> list[dict[str, Any]]:
        """Newest first, each {id, ts_s, source, result}."""
        rows = self._query(
            "SELECT id, ts_s, source, result FROM benchmarks ORDER BY id DESC LIMIT ?", (limit,)
        )
        return [{"id": i, "ts_s": ts, "source": s, "result": json.loads(r)} for i, ts, s, r in rows]

    def benchmark(self, bench_id: int) -> dict[str, Any] | None:
        """One stored run {id, ts_s, source, result}, or None."""
        rows = self._query(
            "SELECT id, ts_s, source, result FROM benchmarks WHERE id = ?", (bench_id,)
        )
        return next(
            ({"id": i, "ts_s": ts, "source": s, "result": json.loads(r)} for i, ts, s, r in rows),
            None,
        )

    # -- controller decisions --------------------------------------------------------

    def add_decision(self, ts_s: float, limit: int, reason: str) -> None:
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO controller_decisions(ts_s, limit_value, reason) VALUES (?, ?, ?)",
                (ts_s, limit, reason),
            )

    def decisions(self, limit: int = 50) -> list[dict[str, Any]]:
        rows = self._query(
            "SELECT ts_s, limit_value, reason FROM controller_decisions ORDER BY id DESC LIMIT ?",
            (limit,),
        )
        return [{"ts_s": t, "limit": lim, "reason": r} for t, lim, r in reversed(rows)]

    # -- metric history --------------------------------------------------------------

    def add_metric_sample(self, ts_s: float, resolution_s: int, data: dict[str, Any]) -> None:
        with self._tx() as cur:
            cur.execute(
                "INSERT OR REPLACE INTO metric_samples(ts_s, resolution_s, data) VALUES (?, ?, ?)",
                (ts_s, resolution_s, json.dumps(data)),
            )

    def metric_samples(
        self, resolution_s: int, since_s: float = 0.0, until_s: float | None = None
    ) -> list[tuple[float, dict[str, Any]]]:
        until = until_s if until_s is not None else float("inf")
        rows = self._query(
            "SELECT ts_s, data FROM metric_samples WHERE resolution_s=? AND ts_s>=? AND ts_s<? "
            "ORDER BY ts_s",
            (resolution_s, since_s, until),
        )
        return [(ts, json.loads(d)) for ts, d in rows]

    def replace_metric_samples(
        self,
        resolution_s: int,
        delete_before_s: float,
        add: list[tuple[float, dict[str, Any]]],
        add_resolution_s: int,
    ) -> None:
        """Roll fine samples into a coarser tier in one transaction (nothing lost midway)."""
        with self._tx() as cur:
            cur.executemany(
                "INSERT OR REPLACE INTO metric_samples(ts_s, resolution_s, data) VALUES (?, ?, ?)",
                [(ts, add_resolution_s, json.dumps(d)) for ts, d in add],
            )
            cur.execute(
                "DELETE FROM metric_samples WHERE resolution_s=? AND ts_s<?",
                (resolution_s, delete_before_s),
            )

    def sum_metric_fields(self, fields: list[str], since_s: float) -> dict[str, float]:
        """Each field summed over every stored row (all resolutions) from since_s on, in
        SQLite: a 30-day window is tens of thousands of rows, too many to decode in Python."""
        if not fields:
            return {}
        sums = ", ".join("COALESCE(SUM(json_extract(data, ?)), 0)" for _ in fields)
        paths = tuple(f"$.{f}" for f in fields)
        (row,) = self._query(f"SELECT {sums} FROM metric_samples WHERE ts_s>=?", (*paths, since_s))
        return {f: float(v) for f, v in zip(fields, row, strict=True)}

    def count_metric_samples(self) -> dict[int, int]:
        rows = self._query(
            "SELECT resolution_s, COUNT(*) FROM metric_samples GROUP BY resolution_s"
        )
        return {int(r): int(n) for r, n in rows}

    # -- thresholds ------------------------------------------------------------------
    # `active`: 1 the set in force, 0 an earlier set (a rollback target), -1 a set that was
    # rolled back (kept for the record, never a rollback target again).

    def save_thresholds(self, source: str, data: dict[str, Any]) -> int:
        """Store a new active set; the previous ones stay for rollback."""
        with self._tx() as cur:
            cur.execute("UPDATE thresholds SET active=0 WHERE active=1")
            cur.execute(
                "INSERT INTO thresholds(ts_s, active, source, data) VALUES (?, 1, ?, ?)",
                (time.time(), source, json.dumps(data)),
            )
            return int(cur.lastrowid or 0)

    def thresholds(self, limit: int = 10) -> list[dict[str, Any]]:
        """Newest first, each {id, ts_s, active, state, source, data}."""
        rows = self._query(
            "SELECT id, ts_s, active, source, data FROM thresholds ORDER BY id DESC LIMIT ?",
            (limit,),
        )
        return [_threshold_row(r) for r in rows]

    def active_thresholds(self) -> dict[str, Any] | None:
        """The set in force (as in thresholds()), or None while the configured values apply."""
        rows = self._query(
            "SELECT id, ts_s, active, source, data FROM thresholds WHERE active=1 "
            "ORDER BY id DESC LIMIT 1"
        )
        return _threshold_row(rows[0]) if rows else None

    def rollback_thresholds(self) -> dict[str, Any] | None:
        """Retire the active set and make the newest earlier one active again, in one
        transaction; returns the restored row (as in thresholds()), None if there is none."""
        with self._tx() as cur:
            active = cur.execute(
                "SELECT id FROM thresholds WHERE active=1 ORDER BY id DESC LIMIT 1"
            ).fetchone()
            if active is None:
                return None
            target = cur.execute(
                "SELECT id, ts_s, active, source, data FROM thresholds "
                "WHERE active=0 AND id<? ORDER BY id DESC LIMIT 1",
                (active[0],),
            ).fetchone()
            if target is None:
                return None
            cur.execute("UPDATE thresholds SET active=-1 WHERE id=?", (active[0],))
            cur.execute("UPDATE thresholds SET active=1 WHERE id=?", (target[0],))
        return _threshold_row((target[0], target[1], 1, target[3], target[4]))

    # -- meta ------------------------------------------------------------------------

    # -- usage per key and day -------------------------------------------------------

    def add_usage(self, rows: list[UsageRow]) -> None:
        """Add rows to the daily totals (one transaction)."""
        with self._tx() as cur:
            cur.executemany(
                "INSERT INTO usage_daily(day, key, status, requests, prompt_tokens, "
                "completion_tokens) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(day, key, status) DO UPDATE SET "
                "requests = requests + excluded.requests, "
                "prompt_tokens = prompt_tokens + excluded.prompt_tokens, "
                "completion_tokens = completion_tokens + excluded.completion_tokens",
                [
                    (r.day, r.key, r.status, r.requests, r.prompt_tokens, r.completion_tokens)
                    for r in rows
                ],
            )

    def usage(self, from_day: str, to_day: str) -> list[UsageRow]:
        """The daily totals from from_day to to_day (ISO dates, both included)."""
        rows = self._query(
            "SELECT day, key, status, requests, prompt_tokens, completion_tokens "
            "FROM usage_daily WHERE day >= ? AND day <= ? ORDER BY day, key, status",
            (from_day, to_day),
        )
        return [UsageRow(*row) for row in rows]

    def keep_ceiling(self, ceiling: int | None, source: str) -> None:
        """The controller's ceiling now (None: none) and who set it, for the next start."""
        self.set_meta(_CEILING_KEY, json.dumps({"ceiling": ceiling, "source": source}))

    def kept_ceiling(self) -> tuple[int | None, str] | None:
        """What keep_ceiling kept last; None when nothing was ever kept."""
        raw = self.meta(_CEILING_KEY)
        if raw is None:
            return None
        kept = json.loads(raw)
        return kept.get("ceiling"), str(kept.get("source", ""))

    def meta(self, key: str) -> str | None:
        rows = self._query("SELECT value FROM meta WHERE key=?", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: str) -> None:
        with self._tx() as cur:
            cur.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    def meta_setdefault(self, key: str, value: str) -> str:
        """The stored value of key, storing value first if there is none (atomic)."""
        with self._tx() as cur:
            cur.execute("INSERT OR IGNORE INTO meta(key, value) VALUES (?, ?)", (key, value))
            row = cur.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return str(row[0])


_THRESHOLD_STATES = {1: "active", 0: "previous", -1: "rolled_back"}


def _threshold_row(row: tuple[Any, ...]) -> dict[str, Any]:
    i, ts, active, source, data = row
    return {
        "id": i,
        "ts_s": ts,
        "active": active == 1,
        "state": _THRESHOLD_STATES.get(int(active), "previous"),
        "source": source,
        "data": json.loads(data),
    }
