"""Per-second rates from running totals (pure): each call reports since the one before."""

from __future__ import annotations

from collections.abc import Mapping


class CounterRates:
    """Turn monotonic counters into rates between successive samples.

    A counter that went down (a restart reset it) restarts from its new value, and the
    first sample has no rate yet: both report None rather than a made-up number.
    """

    def __init__(self) -> None:
        self._last: tuple[float, dict[str, float]] | None = None

    def sample(self, now_s: float, totals: Mapping[str, float]) -> dict[str, float | None]:
        """name -> per-second rate since the previous sample (None when unknown)."""
        last, self._last = self._last, (now_s, dict(totals))
        if last is None or now_s <= last[0]:
            return dict.fromkeys(totals)
        dt = now_s - last[0]
        out: dict[str, float | None] = {}
        for name, value in totals.items():
            before = last[1].get(name)
            out[name] = None if before is None or value < before else (value - before) / dt
        return out
