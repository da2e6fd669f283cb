"""Who used how much: per-key counters in /metrics and daily totals in the state store.

The request path only adds to counters in memory; the totals reach SQLite in one
transaction every few seconds (and at stop), so metering costs no disk write per request.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from appliance.services.store import StateStore, UsageRow

log = logging.getLogger("appliance.usage")

# Statuses that reached the engine and got an answer (whole, or cut at its deadline).
ANSWERED = frozenset({"ok", "deadline"})


def utc_day(ts_s: float) -> str:
    """The UTC date of a unix time, as YYYY-MM-DD."""
    return dt.datetime.fromtimestamp(ts_s, dt.UTC).date().isoformat()


class UsageMeter:
    """Counts every finished request against its key; flush() moves the totals to SQLite."""

    def __init__(
        self, store: StateStore, registry: CollectorRegistry, clock: Callable[[], float]
    ) -> None:
        self._store = store
        self._clock = clock
        # The key's name as the label, never its secret or prefix.
        self.requests_total = Counter(
            "appliance_key_requests",
            "Finished requests per API key and outcome",
            ["key", "status"],
            registry=registry,
        )
        self.tokens_total = Counter(
            "appliance_key_tokens",
            "Tokens per API key (kind: prompt or completion)",
            ["key", "kind"],
            registry=registry,
        )
        self._lock = threading.Lock()  # flush runs in a worker thread
        self._pending: dict[tuple[str, str, str], list[int]] = {}

    def known_key(self, key: str) -> None:
        """Start a key's series at zero, so a rule sees the key before its first request."""
        for kind in ("prompt", "completion"):
            self.tokens_total.labels(key, kind)

    def record(self, key: str, status: str, prompt_tokens: int, completion_tokens: int) -> None:
        """One finished request of key."""
        self.requests_total.labels(key, status).inc()
        self.tokens_total.labels(key, "prompt").inc(prompt_tokens)
        self.tokens_total.labels(key, "completion").inc(completion_tokens)
        day = utc_day(self._clock())
        with self._lock:
            row = self._pending.setdefault((day, key, status), [0, 0, 0])
            row[0] += 1
            row[1] += prompt_tokens
            row[2] += completion_tokens

    def flush(self) -> int:
        """Write the totals gathered since the last flush; how many rows. On a failure the
        totals stay pending and the next flush tries again."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return 0
        rows = [UsageRow(d, k, s, *counts) for (d, k, s), counts in pending.items()]
        try:
            self._store.add_usage(rows)
        except Exception:
            with self._lock:
                for (d, k, s), counts in pending.items():
                    row = self._pending.setdefault((d, k, s), [0, 0, 0])
                    for i, n in enumerate(counts):
                        row[i] += n
            raise
        return len(rows)

    def report(self, from_day: str, to_day: str) -> dict[str, Any]:
        """Totals per key over the days, with each day's rows: what /admin/usage answers."""
        self.flush()
        rows = self._store.usage(from_day, to_day)
        keys: dict[str, dict[str, Any]] = {}
        for r in rows:
            k = keys.setdefault(r.key, _empty_total(r.key))
            k["requests"] += r.requests
            k["answered"] += r.requests if r.status in ANSWERED else 0
            k["prompt_tokens"] += r.prompt_tokens
            k["completion_tokens"] += r.completion_tokens
            k["by_status"][r.status] = k["by_status"].get(r.status, 0) + r.requests
        return {
            "from": from_day,
            "to": to_day,
            "keys": sorted(keys.values(), key=lambda k: k["key"]),
            "days": [dataclasses.asdict(r) for r in rows],
        }


def _empty_total(key: str) -> dict[str, Any]:
    return {
        "key": key,
        "requests": 0,
        "answered": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "by_status": {},
    }
