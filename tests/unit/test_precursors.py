"""Early-warning policy: the memory slope and its ETA, the raise/clear hysteresis, open spikes."""

from __future__ import annotations

import math
import random

import pytest

from appliance.domain.incidents import AnalysisConfig
from appliance.domain.precursors import (
    TrendConfig,
    as_records,
    fit_line,
    forecast_memory,
    memory_forecasts,
    open_spikes,
    still_precursor,
)

CFG = TrendConfig()
HOUR_S = 3600.0


def line(start: float, end: float, span_s: float = HOUR_S, step_s: float = 60.0):
    """Points from start to end (shares of the limit), one every step_s."""
    n = int(span_s / step_s)
    return [(i * step_s, start + (end - start) * i / n) for i in range(n + 1)]


def noisy(points, amplitude: float, seed: int = 7):
    rng = random.Random(seed)
    return [(t, v + rng.uniform(-amplitude, amplitude)) for t, v in points]


def step(at_s: float, low: float, high: float):
    return [(t, low if t < at_s else high) for t, _ in line(0, 0)]


def then_flat(points, flat_s: float, step_s: float = 60.0):
    t_end, v_end = points[-1]
    return points + [(t_end + i * step_s, v_end) for i in range(1, int(flat_s / step_s) + 1)]


# (name, points, precursor, eta_s or None for "not finite", part of the reason)
CASES = [
    # 0.5 -> 0.8 in an hour: 0.2 left at 0.3/h is 40 min.
    ("reaches the limit in 40 min", line(0.5, 0.8), True, 2400.0, "~40 min"),
    ("the same, noisy", noisy(line(0.5, 0.8), 0.01), True, 2400.0, "the limit in ~"),
    ("flat", line(0.6, 0.6), False, None, "not growing"),
    ("noisy but flat", noisy(line(0.6, 0.6), 0.05), False, None, ""),
    ("shrinking", line(0.8, 0.5), False, None, "not growing"),
    ("grows, but the limit is 3 h away", line(0.4, 0.6), False, 7200.0, "past 60 min"),
    ("a step (engine start) is no trend", step(600, 0.0, 0.9), False, None, "R²"),
    ("tiny rise near the limit", line(0.97, 0.985), False, None, "under 2%"),
    (
        "growth stopped 20 min ago",
        then_flat(line(0.5, 0.8, span_s=2400), 1200),
        False,
        None,
        "stalled",
    ),
    ("five minutes of points", line(0.5, 0.8, span_s=300), False, None, "too few"),
    ("no points", [], False, None, "too few"),
]


@pytest.mark.parametrize(
    ("points", "precursor", "eta_s", "why"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_forecast_memory(points, precursor, eta_s, why) -> None:
    f = forecast_memory("rss", points, CFG)
    assert f.precursor is precursor, f.reason
    if eta_s is not None:
        assert f.eta_s == pytest.approx(eta_s, rel=0.05)
    assert why in f.reason


def test_eta_is_inf_when_not_growing_and_nan_without_a_slope() -> None:
    assert forecast_memory("rss", line(0.8, 0.5), CFG).eta_s == math.inf
    assert math.isnan(forecast_memory("rss", [], CFG).eta_s)


def test_fit_line_recovers_slope_and_level() -> None:
    fit = fit_line(line(0.2, 0.5))
    assert fit is not None
    assert fit.slope_per_s == pytest.approx(0.3 / HOUR_S)
    assert fit.level == pytest.approx(0.5)
    assert fit.r2 == pytest.approx(1.0)
    assert fit_line([(5.0, 0.1), (5.0, 0.2)]) is None


def test_a_step_fits_worse_than_the_r2_threshold() -> None:
    # Why min_r2 = 0.8: a step fits a line at R² = 3 f (1 - f) <= 0.75 wherever it is.
    worst = max(fit_line(step(at, 0.0, 0.9)).r2 for at in range(60, 3600, 60))
    assert worst <= 0.76 < CFG.min_r2


@pytest.mark.parametrize(
    ("points", "stays"),
    [
        (line(0.5, 0.8), True),  # still a precursor
        (line(0.35, 0.65), True),  # ETA 70 min: past the horizon, within the clear horizon
        (line(0.3, 0.5), False),  # ETA 150 min: past both
        (then_flat(line(0.5, 0.8, span_s=2400), 1200), False),  # growth stopped
        (line(0.8, 0.5), False),
        ([], False),
    ],
)
def test_still_precursor_has_a_wider_clear_band(points, stays) -> None:
    assert still_precursor(forecast_memory("rss", points, CFG), CFG) is stays


GiB = 1024**3


def rows(n: int, step_s: float = 5.0, **fields_at):
    """n history rows; each keyword maps a field to a function of the row index."""
    return [
        {"ts_s": 1000.0 + i * step_s, **{k: fn(i) for k, fn in fields_at.items()}}
        for i in range(n)
    ]


def test_memory_forecasts_read_history_rows() -> None:
    # RSS 50 % -> 80 % of a 64 GiB limit over an hour of 5 s rows; GPU memory flat at 90 %.
    history = rows(
        721,
        rss_bytes=lambda i: int((0.5 + 0.3 * i / 720) * 64 * GiB),
        memory_limit_bytes=lambda i: 64 * GiB,
        gpu_memory_used_bytes=lambda i: 72 * GiB,
        gpu_memory_total_bytes=lambda i: 80 * GiB,
    )
    out = memory_forecasts(as_records(history), CFG)
    assert set(out) == {"rss", "gpu_memory"}
    assert out["rss"].precursor and out["rss"].eta_s == pytest.approx(2400, rel=0.01)
    assert not out["gpu_memory"].precursor


def test_open_spikes_only_while_the_spike_lasts() -> None:
    cfg = AnalysisConfig()
    ttft = [0.2] * 30 + [2.0] * 6  # 3 s a row: the last 18 s are 10x the baseline
    during = as_records(rows(36, step_s=3, ttft_p99_s=lambda i: ttft[i]))
    spikes = open_spikes(during, cfg)
    assert spikes["tpot"] is None
    spike = spikes["ttft"]
    assert spike is not None and spike.baseline_s == pytest.approx(0.2) and spike.peak_s == 2.0
    # Back to normal for longer than spike_gap_s: over.
    after = ttft + [0.2] * 25
    assert open_spikes(as_records(rows(61, step_s=3, ttft_p99_s=lambda i: after[i])), cfg) == {
        "ttft": None,
        "tpot": None,
    }
    # Rows without latency (no requests) do not hold a spike open either.
    quiet = [*during, *as_records([{"ts_s": 1000.0 + 36 * 3 + 120}])]
    assert open_spikes(quiet, cfg)["ttft"] is None
