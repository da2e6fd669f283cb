"""LSTM load forecaster: a small LSTM over windows of the five normalised signals, predicting
pending requests horizon_s ahead. This module holds the policy (features, normalisation, windows,
the chronological split, the file's contents); the net itself is torch, in
appliance/adapters/torch_lstm.py, which imports torch lazily, so the pure modules and a daemon
that never trains stay free of it."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.adapters.torch_lstm import (
    NetShape,
    TorchLstm,
    TrainBudget,
    load_checkpoint,
    save_checkpoint,
)
from appliance.predict.forecaster import horizon_steps
from appliance.predict.signals import FEATURES, PENDING_INDEX, LoadSignals, segments

FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class LstmConfig:
    """Model size and training budget; the defaults train in seconds on two CPU cores."""

    horizon_s: float = 30.0
    step_s: float = 5.0
    window_steps: int = 48  # 4 min at 5 s: long enough to see the tail of the last burst
    hidden: int = 24
    layers: int = 1
    lr: float = 0.01
    batch: int = 64
    max_epochs: int = 40
    patience: int = 5  # epochs without a better validation loss before stopping
    val_fraction: float = 0.2  # the latest part of the history, never shuffled into training
    seed: int = 0
    max_train_s: float = 60.0  # wall-clock cap, whatever the epochs say
    threads: int = 1  # torch intra-op threads while fitting and predicting
    # Model log(1 + pending): a burst's growth is multiplicative, so one learnt shape fits
    # bursts of any size, including ones larger than the history held.
    log_pending: bool = True


@dataclass(frozen=True, slots=True)
class FitReport:
    """How a fit went."""

    samples: int
    epochs: int
    best_epoch: int
    val_loss: float
    train_s: float


def _shape(cfg: LstmConfig) -> NetShape:
    return NetShape(
        inputs=len(FEATURES), hidden=cfg.hidden, layers=cfg.layers, residual_index=PENDING_INDEX
    )


def _budget(cfg: LstmConfig) -> TrainBudget:
    return TrainBudget(
        lr=cfg.lr,
        batch=cfg.batch,
        max_epochs=cfg.max_epochs,
        patience=cfg.patience,
        seed=cfg.seed,
        max_train_s=cfg.max_train_s,
        threads=cfg.threads,
    )


class LstmForecaster:
    """Forecaster over windows of all five signals; fit() with early stopping, fixed seed."""

    name = "lstm"

    def __init__(self, config: LstmConfig | None = None) -> None:
        self.config = config or LstmConfig()
        self.horizon_s = self.config.horizon_s
        self.step_s = self.config.step_s
        self.window_steps = self.config.window_steps
        self._net: TorchLstm | None = None
        self._mean: list[float] = [0.0] * len(FEATURES)
        self._std: list[float] = [1.0] * len(FEATURES)
        self.report: FitReport | None = None

    @property
    def fitted(self) -> bool:
        """Whether there is a model to predict with."""
        return self._net is not None

    def _features(self, s: LoadSignals) -> list[float]:
        v = list(s.vector())
        if self.config.log_pending:
            v[PENDING_INDEX] = math.log1p(max(0.0, v[PENDING_INDEX]))
        return v

    def _normalised(self, window: Sequence[LoadSignals]) -> list[list[float]]:
        return [
            [(v - m) / s for v, m, s in zip(self._features(w), self._mean, self._std, strict=True)]
            for w in window
        ]

    def fit(self, series: Sequence[LoadSignals]) -> FitReport:
        """Train on every full window of the history; stop when validation stops improving."""
        cfg = self.config
        started = time.perf_counter()
        h = horizon_steps(cfg.horizon_s, cfg.step_s)
        runs = [seg for seg in segments(series, cfg.step_s) if len(seg) >= cfg.window_steps + h]
        if not runs:
            raise ValueError(
                f"history too short: need {cfg.window_steps + h} contiguous {cfg.step_s} s points"
            )
        self._fit_normalisation([p for seg in runs for p in seg])
        xs: list[list[list[float]]] = []
        ys: list[float] = []
        for seg in runs:
            norm = self._normalised(seg)
            for end in range(cfg.window_steps, len(seg) - h + 1):
                xs.append(norm[end - cfg.window_steps : end])
                ys.append(norm[end - 1 + h][PENDING_INDEX])
        # The latest windows validate (chronological, never shuffled into training).
        n_val = max(1, int(len(xs) * cfg.val_fraction))
        self._net, result = TorchLstm.train(
            _shape(cfg), _budget(cfg), xs, ys, n_val, started=started
        )
        self.report = FitReport(
            samples=len(xs),
            epochs=result.epochs,
            best_epoch=result.best_epoch,
            val_loss=result.val_loss,
            train_s=time.perf_counter() - started,
        )
        return self.report

    def _fit_normalisation(self, points: Sequence[LoadSignals]) -> None:
        for i in range(len(FEATURES)):
            col = [self._features(p)[i] for p in points]
            mean = sum(col) / len(col)
            std = math.sqrt(sum((v - mean) ** 2 for v in col) / len(col))
            # A constant signal (no GPU on this box) must not divide by zero or dominate.
            self._mean[i], self._std[i] = mean, std if std > 1e-6 else 1.0

    def predict(self, window: Sequence[LoadSignals]) -> float:
        """Pending requests expected horizon_s after window[-1], from its last window_steps."""
        if self._net is None:
            raise RuntimeError("LstmForecaster.predict before fit or load")
        if not window:
            return 0.0
        y = self._net.predict(self._normalised(window[-self.window_steps :]))
        p = PENDING_INDEX
        y = y * self._std[p] + self._mean[p]
        return max(0.0, math.expm1(y) if self.config.log_pending else y)

    def save(self, path: str | Path, meta: dict[str, Any] | None = None) -> None:
        """Write config, normalisation, weights and meta (plain values) as one checkpoint."""
        if self._net is None:
            raise RuntimeError("LstmForecaster.save before fit")
        save_checkpoint(
            Path(path),
            {
                "format": FORMAT_VERSION,
                "config": dataclasses.asdict(self.config),
                "mean": list(self._mean),
                "std": list(self._std),
                "state": self._net.state_dict(),
                "report": dataclasses.asdict(self.report) if self.report else None,
                "meta": meta or {},
            },
        )

    @classmethod
    def load(cls, path: str | Path) -> tuple[LstmForecaster, dict[str, Any]]:
        """A saved model and the meta stored with it."""
        blob = load_checkpoint(Path(path))
        if blob.get("format") != FORMAT_VERSION:
            raise ValueError(f"{path}: model format {blob.get('format')}, want {FORMAT_VERSION}")
        model = cls(LstmConfig(**blob["config"]))
        model._mean, model._std = list(blob["mean"]), list(blob["std"])
        model._net = TorchLstm.from_state(_shape(model.config), model.config.threads, blob["state"])
        if blob.get("report"):
            model.report = FitReport(**blob["report"])
        return model, dict(blob.get("meta") or {})
