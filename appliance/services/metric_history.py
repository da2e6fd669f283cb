"""Metric history: the daemon samples its own state into SQLite and rolls old samples up
(raw -> 1 min -> 1 h) under retention bounds, so a year stays a few MB."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from appliance.config.maintenance import MaintenanceConfig
from appliance.domain.history import rollup
from appliance.services.periodic import Periodic
from appliance.services.store import StateStore

log = logging.getLogger("appliance.metrics")

RAW, MINUTE, HOUR = 0, 60, 3600


class HistorySampler:
    """Every interval: one row from `snapshot()` into the store, and a `metrics_sample` log line."""

    def __init__(
        self,
        store: StateStore,
        snapshot: Callable[[], dict[str, Any]],
        cfg: MaintenanceConfig,
        clock: Callable[[], float] = time.time,
        after_sample: Callable[[], None] | None = None,
    ) -> None:
        self._store = store
        self._snapshot = snapshot
        self._cfg = cfg
        self._clock = clock
        # Runs in the sampler's thread after each row (e.g. recompute availability).
        self._after_sample = after_sample
        # Off the loop: a SQLite write with fsync may take milliseconds.
        self._periodic = Periodic(
            "metric-history",
            lambda: asyncio.to_thread(self.sample_once),
            lambda: cfg.history_interval_s,
            log,
        )
        self._last_compact_s = 0.0
        self.samples_taken = 0

    async def start(self) -> None:
        await self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    def sample_once(self) -> dict[str, Any]:
        """Take, store and log one sample; compact at most once a minute."""
        now = self._clock()
        row = self._snapshot()
        self._store.add_metric_sample(now, RAW, row)
        self.samples_taken += 1
        log.info(
            "metrics sample",
            extra={"event": "metrics_sample", **{f"ev_{k}": v for k, v in row.items()}},
        )
        if now - self._last_compact_s >= 60:
            self.compact(now)
            self._last_compact_s = now
        if self._after_sample is not None:
            self._after_sample()
        return row

    def compact(self, now_s: float) -> None:
        """Roll raw into minutes and minutes into hours past their retention; drop old hours."""
        c = self._cfg
        for fine, coarse, keep_s in (
            (RAW, MINUTE, c.history_raw_keep_s),
            (MINUTE, HOUR, c.history_minute_keep_s),
        ):
            cutoff = now_s - keep_s
            # Whole coarse buckets only, so a bucket is never split between two rollups.
            cutoff = cutoff - cutoff % coarse
            old = self._store.metric_samples(fine, 0.0, cutoff)
            if old:
                self._store.replace_metric_samples(fine, cutoff, rollup(old, coarse), coarse)
        self._store.replace_metric_samples(HOUR, now_s - c.history_hour_keep_s, [], HOUR)

    def history(self, since_s: float) -> list[dict[str, Any]]:
        """Every stored row since since_s, oldest first, each with its `resolution_s` (0: raw)
        and `n`, the raw samples it stands for (1 for a raw row): its weight in statistics."""
        rows: list[tuple[float, int, dict[str, Any]]] = []
        for tier in (HOUR, MINUTE, RAW):
            rows.extend((ts, tier, data) for ts, data in self._store.metric_samples(tier, since_s))
        rows.sort(key=lambda r: r[0])
        return [{"ts_s": ts, "resolution_s": tier, "n": 1, **data} for ts, tier, data in rows]
