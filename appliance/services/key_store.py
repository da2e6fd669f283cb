"""API keys at rest and in the daemon: the store (SQLite, hashed) and the live registry.

The secret is shown once, when the key is made; the file keeps its SHA-256 and a short prefix
to recognise it by. A plain hash is enough here (no slow KDF): the secret is 256 random bits,
so there is no dictionary to guess from, and every request pays for the check.

`appliance keys` writes the file directly, daemon running or not; the daemon's KeyRegistry
polls a change counter and reloads its snapshot, so a revoked key is refused within a second.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import sqlite3
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from appliance.domain.api_keys import ANONYMOUS, KeySpec
from appliance.domain.lanes import Lane
from appliance.errors import ApplianceError, Unauthorized
from appliance.services.sqlite_db import SqliteDb

log = logging.getLogger("appliance.keys")

SECRET_PREFIX = "sk-app-"
DISPLAY_PREFIX_CHARS = 12

_SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL, sha256 TEXT NOT NULL UNIQUE,
    prefix TEXT NOT NULL, max_lane TEXT NOT NULL, downgrade INTEGER NOT NULL,
    requests_per_min INTEGER, tokens_per_min INTEGER, concurrency_share REAL,
    weight INTEGER NOT NULL, created_s REAL NOT NULL, revoked_s REAL);
CREATE UNIQUE INDEX IF NOT EXISTS api_keys_active_name ON api_keys(name)
    WHERE revoked_s IS NULL;
CREATE TABLE IF NOT EXISTS api_keys_version (
    id INTEGER PRIMARY KEY CHECK (id = 0), version INTEGER NOT NULL);
INSERT OR IGNORE INTO api_keys_version(id, version) VALUES (0, 0);
"""

_SPEC_COLUMNS = (
    "name, max_lane, downgrade, requests_per_min, tokens_per_min, concurrency_share, weight"
)


class KeyExists(ApplianceError):
    """An active key already has this name."""

    status = 409
    type = "invalid_request_error"
    code = "key_exists"


@dataclass(frozen=True)
class KeyInfo:
    """A key as it may be shown: never the secret nor its hash."""

    spec: KeySpec
    prefix: str
    created_s: float
    revoked_s: float | None


def hash_secret(secret: str) -> str:
    """The SHA-256 hex of a secret, as stored and compared."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def _spec_of(row: tuple) -> KeySpec:
    name, lane, downgrade, rpm, tpm, share, weight = row
    return KeySpec(
        name=name,
        max_lane=Lane.parse(lane),
        downgrade=bool(downgrade),
        requests_per_min=rpm,
        tokens_per_min=tpm,
        concurrency_share=share,
        weight=weight,
    )


class KeyStore:
    """The api_keys table of a SQLite file (WAL); its own connection, thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # busy_timeout (SqliteDb's): another writer, the daemon's StateStore or the CLI,
        # may hold the file briefly.
        self._sql = SqliteDb(path, _SCHEMA)

    def close(self) -> None:
        """Close the connection."""
        self._sql.close()

    def _tx(self) -> AbstractContextManager[sqlite3.Cursor]:
        # BEGIN IMMEDIATE: the write lock is taken up front, so the version bump and the
        # change commit together or not at all.
        return self._sql.tx()

    def add(self, spec: KeySpec) -> str:
        """Store a new key; returns its secret, which is not kept and cannot be shown again."""
        secret = SECRET_PREFIX + secrets.token_urlsafe(32)
        try:
            with self._tx() as cur:
                cur.execute(
                    f"INSERT INTO api_keys(sha256, prefix, created_s, {_SPEC_COLUMNS}) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        hash_secret(secret),
                        secret[:DISPLAY_PREFIX_CHARS],
                        time.time(),
                        spec.name,
                        spec.max_lane.label,
                        int(spec.downgrade),
                        spec.requests_per_min,
                        spec.tokens_per_min,
                        spec.concurrency_share,
                        spec.weight,
                    ),
                )
                cur.execute("UPDATE api_keys_version SET version = version + 1")
        except sqlite3.IntegrityError:
            raise KeyExists(
                f"name: an active key is already named {spec.name!r}; revoke it first",
                param="name",
            ) from None
        return secret

    def revoke(self, name: str) -> bool:
        """Revoke the active key `name`; False when there is none."""
        with self._tx() as cur:
            cur.execute(
                "UPDATE api_keys SET revoked_s = ? WHERE name = ? AND revoked_s IS NULL",
                (time.time(), name),
            )
            if cur.rowcount == 0:
                return False
            cur.execute("UPDATE api_keys_version SET version = version + 1")
        return True

    def purge_revoked(self) -> int:
        """Forget the revoked keys; how many. With no key left at all the registry is open
        again, as before the first key (that is the operator's way back to open mode)."""
        with self._tx() as cur:
            cur.execute("DELETE FROM api_keys WHERE revoked_s IS NOT NULL")
            forgotten = cur.rowcount
            if forgotten:
                cur.execute("UPDATE api_keys_version SET version = version + 1")
        return forgotten

    def list(self, include_revoked: bool = False) -> list[KeyInfo]:
        """The keys, oldest first; active ones only unless include_revoked."""
        where = "" if include_revoked else "WHERE revoked_s IS NULL"
        rows = self._sql.query(
            f"SELECT {_SPEC_COLUMNS}, prefix, created_s, revoked_s FROM api_keys {where} "
            "ORDER BY id"
        )
        return [KeyInfo(_spec_of(r[:7]), r[7], r[8], r[9]) for r in rows]

    def credentials(self) -> list[tuple[str, KeySpec]]:
        """(sha256 hex, spec) of every active key: for the registry only, never for output."""
        rows = self._sql.query(
            f"SELECT sha256, {_SPEC_COLUMNS} FROM api_keys WHERE revoked_s IS NULL ORDER BY id"
        )
        return [(r[0], _spec_of(r[1:])) for r in rows]

    def ever_had_keys(self) -> bool:
        """True once any key was added, revoked ones included."""
        return bool(self._sql.query("SELECT EXISTS (SELECT 1 FROM api_keys)")[0][0])

    def version(self) -> int:
        """A counter that every add and revoke (from any connection) moves on."""
        # A counter row rather than PRAGMA data_version: the file is shared with the state
        # store, whose frequent writes would move data_version without any key changing.
        # query() fetches all: a statement left unfinished would keep its read transaction
        # open, and with it the old snapshot of the file.
        rows = self._sql.query("SELECT version FROM api_keys_version WHERE id = 0")
        return int(rows[0][0])


_BAD_HEADER = "Authorization: a valid 'Bearer <api key>' is required"
_BAD_KEY = "Authorization: the API key is not valid (unknown or revoked)"


class KeyRegistry:
    """The daemon's view of the keys: an in-memory snapshot, reloaded when the store changes.

    `legacy_keys` are the plain keys of the old config list (server.api_keys): each becomes
    a principal "config-1", "config-2"... with every lane and no limits, hashed in memory.
    """

    def __init__(self, store: KeyStore, legacy_keys: tuple[str, ...] = ()) -> None:
        self._store = store
        self._legacy = tuple(
            (hash_secret(key), KeySpec(name=f"config-{i}", max_lane=Lane.REALTIME))
            for i, key in enumerate(legacy_keys, start=1)
        )
        # (open, keys), swapped whole: authenticate (event loop) and refresh (a worker
        # thread) never see half a reload.
        self._snapshot: tuple[bool, tuple[tuple[str, KeySpec], ...]] = (False, self._legacy)
        self._version: int | None = None
        self.refresh()

    @property
    def open(self) -> bool:
        """No key was ever made: every request is served as ANONYMOUS (today's loopback mode).

        Revoking the last key does not open the box again: a revoked key must get a 401,
        not be served as anonymous."""
        return self._snapshot[0]

    @property
    def keys(self) -> tuple[KeySpec, ...]:
        """The active principals."""
        return tuple(spec for _, spec in self._snapshot[1])

    def authenticate(self, authorization_header: str | None) -> KeySpec:
        """The key's spec for an Authorization header; Unauthorized when missing or bad."""
        is_open, keys = self._snapshot
        if is_open:
            return ANONYMOUS
        scheme, _, secret = (authorization_header or "").partition(" ")
        secret = secret.strip()
        if scheme.lower() != "bearer" or not secret:
            raise Unauthorized(_BAD_HEADER)
        digest = hash_secret(secret)
        found: KeySpec | None = None
        # Every key is compared, in constant time, without stopping at a match: the time
        # taken says nothing about which key (or how much of one) matched.
        for stored, spec in keys:
            if hmac.compare_digest(digest, stored):
                found = spec
        if found is None:
            raise Unauthorized(_BAD_KEY)
        return found

    def refresh(self) -> bool:
        """Reload the snapshot when the store changed; True when it did."""
        version = self._store.version()
        if version == self._version:
            return False
        # The version is read before the keys: a change committed in between is loaded
        # now and reloaded (harmlessly) on the next call, never missed.
        keys = self._legacy + tuple(self._store.credentials())
        self._snapshot = (not keys and not self._store.ever_had_keys(), keys)
        self._version = version
        return True

    async def watch(self, interval_s: float = 0.25) -> None:
        """Refresh every interval_s until cancelled, so a revoke is seen within a second."""
        while True:
            try:
                if await asyncio.to_thread(self.refresh):
                    log.info("api keys reloaded", extra={"keys": len(self.keys)})
            except sqlite3.Error as exc:
                # A locked or briefly unreadable file: keep the last snapshot, try again.
                log.warning("api keys not reloaded: %s", exc)
            await asyncio.sleep(interval_s)
