"""The torch LSTM forecaster and the controller's entry points (small, seeded, CPU)."""

from __future__ import annotations

import os
import random
import statistics
from pathlib import Path

import pytest

pytest.importorskip("torch")

from appliance.predict.evaluate import BurstSpec, evaluate
from appliance.predict.lstm import LstmConfig, LstmForecaster
from appliance.predict.runtime import (
    LoadPredictor,
    load_forecast,
    train_load_model,
)
from appliance.predict.signals import LoadSignals
from appliance.predict.synth import SPECS, TraceSpec, synth_rows
from tests.import_probe import loaded_after_import

SMALL = LstmConfig(window_steps=48, hidden=16, max_epochs=30, patience=5, seed=0)
PERIOD, BURST = 40, 8  # steps: a burst of 8 x 5 s every 200 s


def periodic_series(n: int, seed: int = 0) -> list[LoadSignals]:
    """Pending 2 with a burst to 25 every PERIOD steps; the other signals follow it."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        pending = (25.0 if i % PERIOD < BURST else 2.0) + rng.gauss(0, 0.5)
        running = min(pending, 16.0)
        out.append(
            LoadSignals(
                ts_s=5.0 * i,
                gpu_util_pct=min(100.0, 6.0 * running),
                mem_used_ratio=0.5 + 0.03 * running,
                core_temp_c=40.0 + 2.0 * running,
                pending=pending,
                tokens_per_s=20.0 * running,
            )
        )
    return out


def mae(pred: list[float], actual: list[float]) -> float:
    return sum(abs(p - a) for p, a in zip(pred, actual, strict=True)) / len(actual)


@pytest.fixture(scope="module")
def trained() -> tuple[LstmForecaster, list[LoadSignals]]:
    series = periodic_series(1400)
    model = LstmForecaster(SMALL)
    model.fit(series[:1000])
    return model, series


def test_lstm_learns_a_periodic_burst_better_than_constant_and_persistence(
    trained: tuple[LstmForecaster, list[LoadSignals]],
) -> None:
    model, series = trained
    assert model.report is not None and model.report.train_s < 20.0
    h = 6  # 30 s at 5 s
    train_mean = statistics.fmean(s.pending for s in series[:1000])
    idx = range(1000, len(series) - h)
    actual = [series[i + h].pending for i in idx]
    lstm = [model.predict(series[i - 47 : i + 1]) for i in idx]
    constant = mae([train_mean] * len(actual), actual)
    persistence = mae([series[i].pending for i in idx], actual)
    got = mae(lstm, actual)
    assert got < 0.5 * constant, (got, constant)
    # Only a model that times the next burst from the last one beats persistence at the edges.
    assert got < 0.5 * persistence, (got, persistence)


def test_fit_is_deterministic_for_a_seed() -> None:
    series = periodic_series(300)
    cfg = LstmConfig(window_steps=12, hidden=8, max_epochs=3, seed=5)
    a, b = LstmForecaster(cfg), LstmForecaster(cfg)
    a.fit(series)
    b.fit(series)
    assert a.predict(series[-12:]) == b.predict(series[-12:])


def test_save_load_round_trip_predicts_the_same(
    trained: tuple[LstmForecaster, list[LoadSignals]], tmp_path: Path
) -> None:
    model, series = trained
    path = tmp_path / "m.pt"
    model.save(path, meta={"enabled": True, "reason": "test"})
    loaded, meta = LstmForecaster.load(path)
    assert meta == {"enabled": True, "reason": "test"}
    assert loaded.config == model.config
    windows = [series[i - 48 : i] for i in range(1100, 1400, 7)]
    assert [loaded.predict(w) for w in windows] == [model.predict(w) for w in windows]


def test_predict_is_one_inference_pass_over_the_last_window(
    trained: tuple[LstmForecaster, list[LoadSignals]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What keeps a controller tick cheap whatever the box (bench/load_predictor.py times it):
    # a loaded model answers with one LSTM pass over its last window, one thread, no autograd
    # and no training, however long the history it is handed.
    import torch

    model, series = trained
    path = tmp_path / "m.pt"
    model.save(path)
    loaded, _ = LstmForecaster.load(path)
    expected = model.predict(series[-48:])

    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("predict must not train")

    passes: list[tuple[tuple[int, ...], bool, bool, int]] = []
    lstm_forward = torch.nn.LSTM.forward

    def counted_forward(self: torch.nn.LSTM, x: torch.Tensor, *args: object) -> object:
        passes.append(
            (
                tuple(x.shape),
                torch.is_inference_mode_enabled(),
                torch.is_grad_enabled(),
                torch.get_num_threads(),
            )
        )
        return lstm_forward(self, x, *args)

    monkeypatch.setattr(LstmForecaster, "fit", no_training)
    monkeypatch.setattr(torch.nn.LSTM, "forward", counted_forward)
    history = series[-400:]  # far more than a window
    got = [loaded.predict(history) for _ in range(3)]
    features = len(series[0].vector())
    assert passes == [((1, 48, features), True, False, loaded.config.threads)] * 3
    assert got == [expected] * 3


def test_fit_needs_a_full_window_and_predict_needs_a_model() -> None:
    with pytest.raises(ValueError, match="too short"):
        LstmForecaster(SMALL).fit(periodic_series(50))
    with pytest.raises(RuntimeError):
        LstmForecaster(SMALL).predict(periodic_series(5))


def test_evaluate_runs_the_lstm_walk_forward(
    trained: tuple[LstmForecaster, list[LoadSignals]],
) -> None:
    model, series = trained
    spec = BurstSpec(threshold=15.0, hysteresis=5.0, max_lead_s=120.0, late_s=30.0)
    r = evaluate(model, series, series[1000].ts_s, spec)
    assert r.bursts == 10 and r.detected == 10
    assert r.median_lead_s is not None and r.median_lead_s > 0  # warned before the burst


# --- the controller's entry points -----------------------------------------------------------

TINY = LstmConfig(window_steps=12, hidden=8, max_epochs=3, patience=2)


def _history(duration_s: float = 3600.0) -> list[dict]:
    spec = TraceSpec(name="t", duration_s=duration_s, periodic_every_s=300.0, periodic_hold_s=40)
    return synth_rows(spec, seed=2)


def test_train_load_model_saves_the_decision(tmp_path: Path) -> None:
    rows = _history()
    path = tmp_path / "load.pt"
    report = train_load_model(rows, path, config=TINY, burst_threshold=16.0)
    assert path.exists()
    assert report.holdout_points > 0 and report.train_points > report.holdout_points
    assert report.ewma.name == "ewma" and report.lstm.name == "lstm"
    _, meta = LstmForecaster.load(path)
    assert meta["enabled"] is report.enabled and meta["reason"] == report.reason


def _save(path: Path, enabled: bool, cfg: LstmConfig = TINY) -> LstmForecaster:
    model = LstmForecaster(cfg)
    model.fit(periodic_series(200))
    model.save(path, meta={"enabled": enabled, "reason": "because", "ewma_alpha": 0.9})
    return model


def test_load_forecast_uses_the_lstm_only_when_enabled(tmp_path: Path) -> None:
    recent = synth_rows(SPECS["periodic"], seed=1)[200:260]  # 5 min of raw rows
    path = tmp_path / "on.pt"
    _save(path, enabled=True)
    fc = load_forecast(recent, path)
    assert fc is not None and fc.source == "lstm" and fc.horizon_s == 30.0
    assert fc.pending_now == recent[-1]["queued"] + recent[-1]["in_flight"]
    assert fc.ts_s == recent[-1]["ts_s"]

    off = tmp_path / "off.pt"
    _save(off, enabled=False)
    fc = load_forecast(recent, off)
    assert fc is not None and fc.source == "ewma" and "disabled: because" in fc.reason

    assert load_forecast(recent[-5:], path).source == "ewma"  # too little recent history
    missing = load_forecast(recent, tmp_path / "none.pt")
    assert missing.source == "ewma" and "no model" in missing.reason
    assert load_forecast(recent, None).source == "ewma"
    assert load_forecast([], path) is None


def test_predictor_reloads_a_changed_model_and_survives_a_bad_one(tmp_path: Path) -> None:
    recent = synth_rows(SPECS["periodic"], seed=1)[200:260]
    path = tmp_path / "m.pt"
    _save(path, enabled=False)
    predictor = LoadPredictor(path)
    assert predictor.forecast(recent).source == "ewma"
    _save(path, enabled=True)
    os.utime(path, ns=(1, 2))  # a new mtime even on a coarse-clock filesystem
    assert predictor.forecast(recent).source == "lstm"
    path.write_bytes(b"not a model")
    os.utime(path, ns=(3, 4))
    fc = predictor.forecast(recent)
    assert fc.source == "ewma" and "unusable" in fc.reason
    other = tmp_path / "h60.pt"
    _save(
        other, enabled=True, cfg=LstmConfig(window_steps=12, hidden=8, max_epochs=1, horizon_s=60)
    )
    fc = LoadPredictor(other).forecast(recent)
    assert fc.source == "ewma" and "horizon" in fc.reason


# --- the torch adapter under the forecaster (appliance/adapters/torch_lstm.py) ----------------


def test_importing_the_forecaster_leaves_torch_unloaded() -> None:
    # The daemon imports the predictor at start; torch (seconds to import) waits for a model.
    forecaster = ("appliance.predict.lstm", "appliance.predict.runtime")
    assert loaded_after_import(forecaster, ("torch", "transformers")) == []


def test_torch_thread_count_is_put_back_after_fit_and_predict() -> None:
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model = LstmForecaster(LstmConfig(window_steps=12, hidden=8, max_epochs=1, threads=1))
        model.fit(periodic_series(200))
        assert torch.get_num_threads() == 2
        model.predict(periodic_series(12))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(saved)


def test_a_file_that_is_not_a_checkpoint_is_refused(tmp_path: Path) -> None:
    import torch

    path = tmp_path / "list.pt"
    torch.save([1, 2, 3], path)
    with pytest.raises(ValueError, match="not a checkpoint"):
        LstmForecaster.load(path)
