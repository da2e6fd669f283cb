"""One SQLite file on one connection, shared by threads under a lock: how every store of
the daemon (state, keys, audit) opens its file and writes a transaction."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class SqliteDb:
    """WAL with synchronous=NORMAL (a power cut may lose the last transactions, never
    corrupt the file); writers wait up to busy_timeout_ms for another process's write."""

    def __init__(self, path: Path, schema: str = "", *, busy_timeout_ms: int = 5000) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.lock = threading.Lock()
        self.conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        try:
            self.conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            if schema:
                # executescript manages its own transaction (it commits first): not in tx().
                self.conn.executescript(schema)
        except BaseException:
            self.conn.close()
            raise

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Cursor]:
        """One write transaction (BEGIN IMMEDIATE: the write lock up front), committed when
        the body returns, rolled back when it raises."""
        with self.lock:
            cur = self.conn.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
                cur.execute("COMMIT")  # in WAL mode the pages are written here: it may fail
            except BaseException:
                # SQLite may have rolled back already (a full disk does): then nothing to undo.
                if self.conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        cur.execute("ROLLBACK")
                raise

    def query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """All rows of a read (fetched whole: a statement left open would hold its snapshot)."""
        with self.lock:
            return self.conn.execute(sql, args).fetchall()

    def close(self) -> None:
        with self.lock:
            self.conn.close()
