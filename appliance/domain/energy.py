"""Joules per generated token (pure): the energy counter against the token counter."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from appliance.domain.thermal import energy_per_token_j


@dataclass(frozen=True)
class EnergyReading:
    """Both running totals at one moment."""

    ts_s: float
    energy_total_j: float
    tokens_total: int


class EnergyPerToken:
    """J/token over a sliding window of readings, and over the daemon's whole life.

    The window answers "what does a token cost now" (it moves with batch size and
    derating); the lifetime figure is what a monthly bill divides by.
    """

    def __init__(self, window_s: float = 60.0) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s: must be > 0, got {window_s}")
        self.window_s = window_s
        self._readings: deque[EnergyReading] = deque()

    def add(self, ts_s: float, energy_total_j: float, tokens_total: int) -> None:
        """Record both totals; readings older than the window (but the newest one before
        it, the window's left edge) are dropped."""
        self._readings.append(EnergyReading(ts_s, energy_total_j, tokens_total))
        while len(self._readings) > 2 and self._readings[1].ts_s <= ts_s - self.window_s:
            self._readings.popleft()

    def recent_j(self) -> float | None:
        """J/token between the oldest and newest reading in the window; None without tokens."""
        if len(self._readings) < 2:
            return None
        first, last = self._readings[0], self._readings[-1]
        return energy_per_token_j(
            last.energy_total_j - first.energy_total_j, last.tokens_total - first.tokens_total
        )

    def lifetime_j(self) -> float | None:
        """J/token over everything recorded since start."""
        if not self._readings:
            return None
        last = self._readings[-1]
        return energy_per_token_j(last.energy_total_j, last.tokens_total)
