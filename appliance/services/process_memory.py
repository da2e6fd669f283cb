"""Process memory as an OOM killer weighs it: the daemon's RSS, its engine processes' RSS,
and the limit they live under (the cgroup's memory.max, else host RAM)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from appliance.services.supervisor import EngineSupervisor

_CGROUP_MEMORY_MAX = Path("/sys/fs/cgroup/memory.max")


def engine_rss(supervisor: EngineSupervisor) -> int:
    """The summed RSS of the engine's processes (0 when it has none to see)."""
    total = 0
    try:
        pids = supervisor.engine.child_pids()
    except Exception:
        pids = []
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            continue
    return total


def daemon_rss() -> int:
    """This process's RSS (0 when it cannot be read)."""
    try:
        return int(psutil.Process(os.getpid()).memory_info().rss)
    except psutil.Error:
        return 0


def memory_limit_bytes() -> int:
    """The cgroup's memory.max where one is set (systemd MemoryMax=), else host RAM."""
    try:
        text = _CGROUP_MEMORY_MAX.read_text().strip()
        if text.isdigit():
            return int(text)
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class EngineRssBaseline:
    """The engine processes' RSS right after the current engine started: the figure the
    restart job's growth threshold compares with (fed from the `engine_started` event)."""

    def __init__(self, measure: Callable[[], int]) -> None:
        self._measure = measure
        self.rss_bytes: int | None = None
        self.taken_s: float | None = None

    def take(self) -> None:
        """Measure now; a figure of 0 (no engine processes to see) is no baseline."""
        try:
            rss = int(self._measure())
        except Exception:
            rss = 0
        self.rss_bytes = rss or None
        self.taken_s = time.time() if rss else None

    def on_event(self, event: Any) -> None:
        """An event sink: re-measure after every engine start (first, restart, recovery)."""
        if getattr(event, "kind", None) == "engine_started":
            self.take()
