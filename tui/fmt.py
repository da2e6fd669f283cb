"""Formatting for the screens: every missing value reads 'n/a', never raises."""

from __future__ import annotations

import time
from typing import Any

NA = "n/a"


def num(value: Any, unit: str = "", digits: int = 0) -> str:
    """A number with its unit, or n/a."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return NA
    return f"{value:.{digits}f}{unit}"


def seconds(value: Any) -> str:
    """A latency in ms below 1 s, else in s; n/a when missing."""
    if not isinstance(value, int | float):
        return NA
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def gib(value: Any) -> str:
    """Bytes as GiB."""
    return num(value / 2**30, " GiB", 1) if isinstance(value, int | float) else NA


def clock(ts_s: Any) -> str:
    """Wall-clock time of day (local) for event and job timestamps."""
    if not isinstance(ts_s, int | float):
        return NA
    return time.strftime("%H:%M:%S", time.localtime(ts_s))


def when(ts_s: Any) -> str:
    """Date and time for runs that may be days old."""
    if not isinstance(ts_s, int | float):
        return NA
    return time.strftime("%m-%d %H:%M", time.localtime(ts_s))


def get(obj: Any, *path: str) -> Any:
    """obj[path0][path1]... or None anywhere along the way."""
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def temp_style(value: Any, slowdown: Any, margin_c: float = 5.0) -> str:
    """Green well below the threshold, yellow within margin_c of it, red at or above it."""
    if not isinstance(value, int | float) or not isinstance(slowdown, int | float):
        return ""
    if value >= slowdown:
        return "bold red"
    return "yellow" if value >= slowdown - margin_c else "green"
