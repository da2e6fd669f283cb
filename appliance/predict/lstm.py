"""LSTM load forecaster: a small torch LSTM over windows of the five normalised signals,
predicting pending requests horizon_s ahead. torch is imported here only, lazily, so the
pure modules and a daemon that never trains stay free of it."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from appliance.predict.forecaster import horizon_steps
from appliance.predict.signals import FEATURES, PENDING_INDEX, LoadSignals, segments

if TYPE_CHECKING:
    import torch

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


def _torch() -> Any:
    import torch

    return torch


def _make_net(cfg: LstmConfig) -> torch.nn.Module:
    torch = _torch()

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(len(FEATURES), cfg.hidden, cfg.layers, batch_first=True)
            self.head = torch.nn.Linear(cfg.hidden, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out, _ = self.lstm(x)
            # The net learns the change from the last pending value: persistence is its
            # starting point, so an untrained or unsure model is never wildly off.
            return x[:, -1, PENDING_INDEX] + self.head(out[:, -1, :]).squeeze(-1)

    return Net()


class _ThreadLimit:
    """torch's thread count is process-wide: set it for one call and put it back."""

    def __init__(self, threads: int) -> None:
        self._threads = threads
        self._saved = 0

    def __enter__(self) -> None:
        torch = _torch()
        self._saved = torch.get_num_threads()
        torch.set_num_threads(self._threads)

    def __exit__(self, *exc: object) -> None:
        _torch().set_num_threads(self._saved)


class LstmForecaster:
    """Forecaster over windows of all five signals; fit() with early stopping, fixed seed."""

    name = "lstm"

    def __init__(self, config: LstmConfig | None = None) -> None:
        self.config = config or LstmConfig()
        self.horizon_s = self.config.horizon_s
        self.step_s = self.config.step_s
        self.window_steps = self.config.window_steps
        self._net: torch.nn.Module | None = None
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
        torch = _torch()
        cfg = self.config
        started = time.perf_counter()
        h = horizon_steps(cfg.horizon_s, cfg.step_s)
        runs = [seg for seg in segments(series, cfg.step_s) if len(seg) >= cfg.window_steps + h]
        if not runs:
            raise ValueError(
                f"history too short: need {cfg.window_steps + h} contiguous {cfg.step_s} s points"
            )
        points = [p for seg in runs for p in seg]
        for i in range(len(FEATURES)):
            col = [self._features(p)[i] for p in points]
            mean = sum(col) / len(col)
            std = math.sqrt(sum((v - mean) ** 2 for v in col) / len(col))
            # A constant signal (no GPU on this box) must not divide by zero or dominate.
            self._mean[i], self._std[i] = mean, std if std > 1e-6 else 1.0

        xs: list[list[list[float]]] = []
        ys: list[float] = []
        for seg in runs:
            norm = self._normalised(seg)
            for end in range(cfg.window_steps, len(seg) - h + 1):
                xs.append(norm[end - cfg.window_steps : end])
                ys.append(norm[end - 1 + h][PENDING_INDEX])
        # Chronological split: validating on the latest windows is what the daemon will face.
        n_val = max(1, int(len(xs) * cfg.val_fraction))
        x_all = torch.tensor(xs, dtype=torch.float32)
        y_all = torch.tensor(ys, dtype=torch.float32)
        x_tr, y_tr = x_all[:-n_val], y_all[:-n_val]
        x_val, y_val = x_all[-n_val:], y_all[-n_val:]

        with _ThreadLimit(cfg.threads):
            torch.manual_seed(cfg.seed)
            gen = torch.Generator().manual_seed(cfg.seed)
            net = _make_net(cfg)
            opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
            # L1: the forecast is scored by MAE, and bursts' outliers must not swamp the rest.
            loss_fn = torch.nn.L1Loss()
            best_loss, best_epoch, best_state = math.inf, 0, None
            epoch = 0
            for epoch in range(1, cfg.max_epochs + 1):
                net.train()
                order = torch.randperm(len(x_tr), generator=gen)
                for i in range(0, len(order), cfg.batch):
                    idx = order[i : i + cfg.batch]
                    opt.zero_grad()
                    loss = loss_fn(net(x_tr[idx]), y_tr[idx])
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
                    opt.step()
                net.eval()
                with torch.inference_mode():
                    val_loss = float(loss_fn(net(x_val), y_val))
                if val_loss < best_loss - 1e-5:
                    best_loss, best_epoch = val_loss, epoch
                    best_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
                elapsed = time.perf_counter() - started
                if epoch - best_epoch >= cfg.patience or elapsed > cfg.max_train_s:
                    break
            if best_state is not None:
                net.load_state_dict(best_state)
            net.eval()
        self._net = net
        self.report = FitReport(
            samples=len(xs),
            epochs=epoch,
            best_epoch=best_epoch,
            val_loss=best_loss,
            train_s=time.perf_counter() - started,
        )
        return self.report

    def predict(self, window: Sequence[LoadSignals]) -> float:
        """Pending requests expected horizon_s after window[-1], from its last window_steps."""
        if self._net is None:
            raise RuntimeError("LstmForecaster.predict before fit or load")
        if not window:
            return 0.0
        torch = _torch()
        x = torch.tensor([self._normalised(window[-self.window_steps :])], dtype=torch.float32)
        with _ThreadLimit(self.config.threads), torch.inference_mode():
            y = float(self._net(x)[0])
        p = PENDING_INDEX
        y = y * self._std[p] + self._mean[p]
        return max(0.0, math.expm1(y) if self.config.log_pending else y)

    def save(self, path: str | Path, meta: dict[str, Any] | None = None) -> None:
        """Write config, normalisation, weights and meta (plain values) with torch.save."""
        if self._net is None:
            raise RuntimeError("LstmForecaster.save before fit")
        torch = _torch()
        torch.save(
            {
                "format": FORMAT_VERSION,
                "config": dataclasses.asdict(self.config),
                "mean": list(self._mean),
                "std": list(self._std),
                "state": self._net.state_dict(),
                "report": dataclasses.asdict(self.report) if self.report else None,
                "meta": meta or {},
            },
            Path(path),
        )

    @classmethod
    def load(cls, path: str | Path) -> tuple[LstmForecaster, dict[str, Any]]:
        """A saved model and the meta stored with it."""
        torch = _torch()
        blob = torch.load(Path(path), weights_only=True)
        if blob.get("format") != FORMAT_VERSION:
            raise ValueError(f"{path}: model format {blob.get('format')}, want {FORMAT_VERSION}")
        model = cls(LstmConfig(**blob["config"]))
        model._mean, model._std = list(blob["mean"]), list(blob["std"])
        net = _make_net(model.config)
        net.load_state_dict(blob["state"])
        net.eval()
        model._net = net
        if blob.get("report"):
            model.report = FitReport(**blob["report"])
        return model, dict(blob.get("meta") or {})
