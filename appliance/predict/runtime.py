"""The controller's entry points: train the load model on stored metric history, and every tick
forecast pending requests horizon_s ahead from the latest rows.

The LSTM is used only where its own held-out evaluation on this box's history enabled it
(`evaluate.decide`); otherwise, and whenever it cannot be used (no model file, unreadable,
too little recent history, torch missing), the forecast comes from the EWMA baseline, and
LoadForecast.reason says why.
"""

from __future__ import annotations

import functools
import logging
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.predict.evaluate import BurstSpec, EvalResult, decide, evaluate
from appliance.predict.ewma import EwmaForecaster
from appliance.predict.lstm import FitReport, LstmConfig, LstmForecaster
from appliance.predict.signals import DEFAULT_STEP_S, LoadSignals, segments, signals_from_history

log = logging.getLogger("appliance.predict")

DEFAULT_HORIZON_S = 30.0
# Hourly rollups say nothing about the next 30 s; minute rollups still carry bursts' shape.
DEFAULT_MAX_RESOLUTION_S = 60.0


@dataclass(frozen=True, slots=True)
class LoadForecast:
    """Pending requests (queued + running) expected horizon_s after ts_s, and from what."""

    ts_s: float  # the latest grid point the forecast used
    horizon_s: float
    pending_now: float
    pending_expected: float
    source: str  # "lstm" or "ewma"
    reason: str


@dataclass(frozen=True, slots=True)
class TrainReport:
    """What train_load_model did: the held-out comparison and the decision stored with the model."""

    enabled: bool
    reason: str
    burst_threshold: float
    train_points: int
    holdout_points: int
    ewma: EvalResult
    lstm: EvalResult
    fit: FitReport
    model_path: str


def _usable_rows(
    rows: Sequence[Mapping[str, Any]], max_resolution_s: float
) -> list[Mapping[str, Any]]:
    return [r for r in rows if float(r.get("resolution_s") or 0) <= max_resolution_s]


def train_load_model(
    rows: Sequence[Mapping[str, Any]],
    model_path: str | Path,
    *,
    config: LstmConfig | None = None,
    holdout_fraction: float = 0.3,
    burst_threshold: float | None = None,
    max_resolution_s: float = DEFAULT_MAX_RESOLUTION_S,
) -> TrainReport:
    """Fit EWMA and LSTM on the older part of the history, compare them on the rest, and save
    the LSTM with the decision. Blocking (seconds of CPU): run it off the event loop.

    burst_threshold: the pending count that makes a burst (e.g. the controller's ceiling);
    default the 90th percentile of pending in the training part.
    """
    cfg = config or LstmConfig()
    series = signals_from_history(_usable_rows(rows, max_resolution_s), cfg.step_s)
    if not 0 < holdout_fraction < 1:
        raise ValueError(f"holdout_fraction must be in (0, 1), got {holdout_fraction}")
    if len(series) < 2:
        raise ValueError("no usable history rows")
    split_ts = series[int(len(series) * (1 - holdout_fraction))].ts_s
    train = [s for s in series if s.ts_s < split_ts]
    if len(train) < 2:
        raise ValueError(f"history too short: {len(series)} points of {cfg.step_s} s")
    if burst_threshold is None:
        burst_threshold = max(1.0, statistics.quantiles([s.pending for s in train], n=10)[-1])
    spec = BurstSpec(
        threshold=burst_threshold,
        hysteresis=0.3 * burst_threshold,
        max_lead_s=4 * cfg.horizon_s,
        late_s=cfg.horizon_s,
    )
    ewma = EwmaForecaster(horizon_s=cfg.horizon_s, step_s=cfg.step_s)
    ewma.fit(train)
    lstm = LstmForecaster(cfg)
    fit = lstm.fit(train)
    results = [
        evaluate(f, series, split_ts, spec, warmup_steps=cfg.window_steps) for f in (ewma, lstm)
    ]
    enabled, reason = decide(results)
    lstm.save(
        model_path,
        meta={
            "enabled": enabled,
            "reason": reason,
            "burst_threshold": burst_threshold,
            "ewma_alpha": ewma.alpha,
            "ewma_beta": ewma.beta,
            "trained_until_ts_s": series[-1].ts_s,
        },
    )
    log.info(
        "load model trained",
        extra={"event": "load_model_trained", "ev_enabled": enabled, "ev_reason": reason},
    )
    return TrainReport(
        enabled=enabled,
        reason=reason,
        burst_threshold=burst_threshold,
        train_points=len(train),
        holdout_points=len(series) - len(train),
        ewma=results[0],
        lstm=results[1],
        fit=fit,
        model_path=str(model_path),
    )


class LoadPredictor:
    """Holds the loaded model (reloaded when the file changes) and forecasts from rows."""

    def __init__(
        self,
        model_path: str | Path | None = None,
        horizon_s: float = DEFAULT_HORIZON_S,
        step_s: float = DEFAULT_STEP_S,
    ) -> None:
        self.model_path = Path(model_path) if model_path is not None else None
        self.horizon_s = horizon_s
        self.step_s = step_s
        self._mtime_ns: int | None = None
        self._lstm: LstmForecaster | None = None
        self._meta: dict[str, Any] = {}
        self._why_not = "no model path"

    def _refresh(self) -> None:
        if self.model_path is None:
            return
        try:
            mtime = self.model_path.stat().st_mtime_ns
        except OSError:
            self._lstm, self._meta, self._mtime_ns = None, {}, None
            self._why_not = f"no model at {self.model_path}"
            return
        if mtime == self._mtime_ns:
            return
        self._mtime_ns = mtime
        try:
            self._lstm, self._meta = LstmForecaster.load(self.model_path)
        except Exception as exc:  # a bad or foreign file, or no torch: EWMA carries on
            self._lstm, self._meta = None, {}
            self._why_not = f"model {self.model_path} unusable: {exc}"
            log.warning("load model unusable", extra={"event": "load_model_unusable"})
            return
        if self._lstm.horizon_s != self.horizon_s or self._lstm.step_s != self.step_s:
            self._why_not = (
                f"model horizon/step {self._lstm.horizon_s}/{self._lstm.step_s} s "
                f"!= {self.horizon_s}/{self.step_s} s"
            )
            self._lstm = None
        elif not self._meta.get("enabled", False):
            self._why_not = f"LSTM disabled: {self._meta.get('reason', 'no decision stored')}"
            self._lstm = None

    def forecast(self, rows: Sequence[Mapping[str, Any]]) -> LoadForecast | None:
        """Forecast from the latest rows (a few minutes of raw history); None without rows."""
        self._refresh()
        series = signals_from_history(_usable_rows(rows, self.step_s), self.step_s)
        if not series:
            return None
        window: list[LoadSignals] = segments(series, self.step_s)[-1]
        now = window[-1]
        if self._lstm is not None and len(window) >= self._lstm.window_steps:
            return LoadForecast(
                ts_s=now.ts_s,
                horizon_s=self.horizon_s,
                pending_now=now.pending,
                pending_expected=self._lstm.predict(window),
                source="lstm",
                reason=str(self._meta.get("reason", "")),
            )
        reason = self._why_not
        if self._lstm is not None:
            reason = f"only {len(window)} of {self._lstm.window_steps} recent points"
        ewma = EwmaForecaster(
            horizon_s=self.horizon_s,
            step_s=self.step_s,
            alpha=float(self._meta.get("ewma_alpha", 0.5)),
            beta=float(self._meta.get("ewma_beta", 0.2)),
        )
        return LoadForecast(
            ts_s=now.ts_s,
            horizon_s=self.horizon_s,
            pending_now=now.pending,
            pending_expected=ewma.predict(window),
            source="ewma",
            reason=reason,
        )


@functools.lru_cache(maxsize=8)
def _predictor(model_path: str | None, horizon_s: float, step_s: float) -> LoadPredictor:
    return LoadPredictor(model_path, horizon_s, step_s)


def load_forecast(
    rows: Sequence[Mapping[str, Any]],
    model_path: str | Path | None = None,
    *,
    horizon_s: float = DEFAULT_HORIZON_S,
    step_s: float = DEFAULT_STEP_S,
) -> LoadForecast | None:
    """Pending requests expected horizon_s ahead from recent history rows (one predictor per
    model path is kept, so the model is loaded once and reloaded when the file changes)."""
    path = str(model_path) if model_path is not None else None
    return _predictor(path, horizon_s, step_s).forecast(rows)
