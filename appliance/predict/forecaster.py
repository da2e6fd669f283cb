"""The Forecaster port: what the evaluation and the controller need from a load model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from appliance.predict.signals import LoadSignals


@runtime_checkable
class Forecaster(Protocol):
    """Forecasts pending requests horizon_s after the last point of a window of signals."""

    name: str
    horizon_s: float
    step_s: float
    # How many of the latest grid points predict() looks at; it may be handed more or fewer.
    window_steps: int

    def fit(self, series: Sequence[LoadSignals]) -> None:
        """Learn from a history (gaps allowed: split with `signals.segments`)."""
        ...

    def predict(self, window: Sequence[LoadSignals]) -> float:
        """Pending requests expected horizon_s after window[-1] (>= 0)."""
        ...


def horizon_steps(horizon_s: float, step_s: float) -> int:
    """The horizon in whole grid steps (at least one)."""
    return max(1, round(horizon_s / step_s))
