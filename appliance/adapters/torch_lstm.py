"""The torch side of the LSTM load forecaster: the net, its seeded training loop, inference on
one window, and the checkpoint file. torch is imported on first use, never at module import, so
the daemon and the pure predictor modules stay free of it until a model is trained or loaded.

Inputs and outputs are plain lists of already-normalised floats; what the features mean, how
they are scaled and how windows are cut is the predictor's business (appliance/predict/lstm.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class NetShape:
    """The net's size and the input column its output is a change from."""

    inputs: int  # features per time step
    hidden: int
    layers: int
    residual_index: int


@dataclass(frozen=True, slots=True)
class TrainBudget:
    """How to train: optimiser step, batch, epochs, early stop, seed, time and thread caps."""

    lr: float
    batch: int
    max_epochs: int
    patience: int  # epochs without a better validation loss before stopping
    seed: int
    max_train_s: float  # wall-clock cap, counted from the `started` given to train()
    threads: int  # torch intra-op threads while fitting and predicting


@dataclass(frozen=True, slots=True)
class TrainResult:
    """Where training stopped and the best validation loss it kept."""

    epochs: int
    best_epoch: int
    val_loss: float


def _torch() -> Any:
    import torch

    return torch


def _make_net(shape: NetShape) -> torch.nn.Module:
    torch = _torch()

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(shape.inputs, shape.hidden, shape.layers, batch_first=True)
            self.head = torch.nn.Linear(shape.hidden, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out, _ = self.lstm(x)
            # The net learns the change from the last pending value: persistence is its
            # starting point, so an untrained or unsure model is never wildly off.
            return x[:, -1, shape.residual_index] + self.head(out[:, -1, :]).squeeze(-1)

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


def _train_epoch(
    net: torch.nn.Module,
    opt: torch.optim.Optimizer,
    loss_fn: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch: int,
    gen: torch.Generator,
) -> None:
    torch = _torch()
    net.train()
    order = torch.randperm(len(x), generator=gen)
    for i in range(0, len(order), batch):
        idx = order[i : i + batch]
        opt.zero_grad()
        loss = loss_fn(net(x[idx]), y[idx])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()


def _val_loss(
    net: torch.nn.Module, loss_fn: torch.nn.Module, x: torch.Tensor, y: torch.Tensor
) -> float:
    net.eval()
    with _torch().inference_mode():
        return float(loss_fn(net(x), y))


class TorchLstm:
    """A trained or loaded net and the thread budget it predicts under."""

    def __init__(self, net: torch.nn.Module, threads: int) -> None:
        self._net = net
        self._threads = threads

    @classmethod
    def train(
        cls,
        shape: NetShape,
        budget: TrainBudget,
        xs: Sequence[Sequence[Sequence[float]]],
        ys: Sequence[float],
        n_val: int,
        *,
        started: float,
    ) -> tuple[TorchLstm, TrainResult]:
        """Fit on all but the last n_val windows, keep the epoch that validated best."""
        torch = _torch()
        x_all = torch.tensor(xs, dtype=torch.float32)
        y_all = torch.tensor(ys, dtype=torch.float32)
        # Chronological split: validating on the latest windows is what the daemon will face.
        x_tr, y_tr = x_all[:-n_val], y_all[:-n_val]
        x_val, y_val = x_all[-n_val:], y_all[-n_val:]
        with _ThreadLimit(budget.threads):
            torch.manual_seed(budget.seed)  # the net's initial weights
            gen = torch.Generator().manual_seed(budget.seed)  # the batch order
            net = _make_net(shape)
            opt = torch.optim.Adam(net.parameters(), lr=budget.lr)
            # L1: the forecast is scored by MAE, and bursts' outliers must not swamp the rest.
            loss_fn = torch.nn.L1Loss()
            best_loss, best_epoch, best_state = math.inf, 0, None
            epoch = 0
            for epoch in range(1, budget.max_epochs + 1):
                _train_epoch(net, opt, loss_fn, x_tr, y_tr, budget.batch, gen)
                val_loss = _val_loss(net, loss_fn, x_val, y_val)
                if val_loss < best_loss - 1e-5:
                    best_loss, best_epoch = val_loss, epoch
                    best_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
                elapsed = time.perf_counter() - started
                if epoch - best_epoch >= budget.patience or elapsed > budget.max_train_s:
                    break
            if best_state is not None:
                net.load_state_dict(best_state)
            net.eval()
        return cls(net, budget.threads), TrainResult(epoch, best_epoch, best_loss)

    @classmethod
    def from_state(cls, shape: NetShape, threads: int, state: dict[str, Any]) -> TorchLstm:
        """A net of this shape with saved weights (a state_dict() as a checkpoint holds it)."""
        net = _make_net(shape)
        net.load_state_dict(state)
        net.eval()
        return cls(net, threads)

    def state_dict(self) -> dict[str, Any]:
        """The weights, for a checkpoint."""
        return self._net.state_dict()

    def predict(self, window: Sequence[Sequence[float]]) -> float:
        """The net's output for one normalised window (time steps x features)."""
        torch = _torch()
        x = torch.tensor([window], dtype=torch.float32)
        with _ThreadLimit(self._threads), torch.inference_mode():
            return float(self._net(x)[0])


def save_checkpoint(path: Path, blob: dict[str, Any]) -> None:
    """Write plain values and state_dict tensors with torch.save."""
    _torch().save(blob, path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by save_checkpoint; weights_only, so no code runs from it."""
    blob = _torch().load(path, weights_only=True)
    if not isinstance(blob, dict):
        raise ValueError(f"{path}: not a checkpoint (a {type(blob).__name__})")
    return blob
