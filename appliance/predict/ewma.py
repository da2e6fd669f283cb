"""EWMA baseline (pure): Holt's linear method, an EWMA of the level plus an EWMA of the trend,
forecasting pending requests horizon_s ahead."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from appliance.predict.forecaster import horizon_steps
from appliance.predict.signals import DEFAULT_STEP_S, LoadSignals, segments

# beta 0 keeps the trend at zero: plain EWMA, which fit() may prefer on a noisy box.
ALPHAS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
BETAS: tuple[float, ...] = (0.0, 0.05, 0.1, 0.2, 0.4)


@dataclass(frozen=True, slots=True)
class HoltState:
    """Smoothed level and per-step trend after some observations."""

    level: float
    trend: float


def holt_step(state: HoltState | None, y: float, alpha: float, beta: float) -> HoltState:
    """One observation: level <- a*y + (1-a)*(level+trend); trend <- b*dlevel + (1-b)*trend."""
    if state is None:
        return HoltState(level=y, trend=0.0)
    level = alpha * y + (1.0 - alpha) * (state.level + state.trend)
    trend = beta * (level - state.level) + (1.0 - beta) * state.trend
    return HoltState(level=level, trend=trend)


def holt_run(values: Iterable[float], alpha: float, beta: float) -> HoltState | None:
    """The state after all values (None for no values), starting at the first value, trend 0."""
    state: HoltState | None = None
    for y in values:
        state = holt_step(state, y, alpha, beta)
    return state


def holt_forecast(state: HoltState, steps: int) -> float:
    """level + steps * trend, floored at 0 (a queue is never negative)."""
    return max(0.0, state.level + steps * state.trend)


class EwmaForecaster:
    """Holt's linear method on pending requests; fit() picks alpha and beta on the history."""

    name = "ewma"

    def __init__(
        self,
        horizon_s: float = 30.0,
        step_s: float = DEFAULT_STEP_S,
        window_steps: int = 60,
        alpha: float = 0.5,
        beta: float = 0.1,
    ) -> None:
        self.horizon_s = horizon_s
        self.step_s = step_s
        self.window_steps = window_steps
        self.alpha = alpha
        self.beta = beta

    def fit(self, series: Sequence[LoadSignals]) -> None:
        """Grid-search (alpha, beta) for the lowest MAE of horizon forecasts over the history."""
        h = horizon_steps(self.horizon_s, self.step_s)
        runs = [[s.pending for s in seg] for seg in segments(series, self.step_s)]
        best: tuple[float, float, float] | None = None
        for alpha in ALPHAS:
            for beta in BETAS:
                # One pass per pair: the running state stands in for a fresh window_steps run,
                # whose start-up has decayed by then for every alpha in the grid.
                err, n = 0.0, 0
                for ys in runs:
                    state: HoltState | None = None
                    for i, y in enumerate(ys[:-h] if len(ys) > h else []):
                        state = holt_step(state, y, alpha, beta)
                        err += abs(holt_forecast(state, h) - ys[i + h])
                        n += 1
                if n and (best is None or err / n < best[0]):
                    best = (err / n, alpha, beta)
        if best is not None:
            _, self.alpha, self.beta = best

    def predict(self, window: Sequence[LoadSignals]) -> float:
        """Holt forecast from the last window_steps points of the window."""
        state = holt_run((s.pending for s in window[-self.window_steps :]), self.alpha, self.beta)
        if state is None:
            return 0.0
        return holt_forecast(state, horizon_steps(self.horizon_s, self.step_s))
