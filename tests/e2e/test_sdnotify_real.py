"""The daemon speaks sd_notify on a real socket: STATUS while starting, READY=1, watchdog."""

from __future__ import annotations

import time

import pytest

from tests.conftest import Daemon

pytestmark = pytest.mark.engine


def test_ready_follows_starting_status_and_watchdog_pings(daemon: Daemon):
    assert daemon.notify is not None
    lines = daemon.notify.lines()
    ready = [i for i, m in enumerate(lines) if "READY=1" in m.split("\n")]
    starting = [i for i, m in enumerate(lines) if "STATUS=engine starting" in m]
    assert starting and ready and starting[0] < ready[0], lines[:10]
    before = sum("WATCHDOG=1" in m for _, m in daemon.notify.messages)
    time.sleep(3.2)
    pings = [t for t, m in daemon.notify.messages if "WATCHDOG=1" in m]
    assert len(pings) - before >= 2  # WatchdogSec 2 s -> a ping about every second
    gaps = [b - a for a, b in zip(pings[-4:], pings[-3:], strict=False)]
    assert all(0.5 < g < 1.6 for g in gaps), gaps
