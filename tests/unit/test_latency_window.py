"""Sliding-window percentiles: the window edges, since_s, min_samples, and numpy agreement."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.domain.latency_window import LatencyWindow, percentile


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([5.0], 99, 5.0),
        ([1.0, 2.0], 50, 1.5),
        ([1.0, 2.0, 3.0, 4.0], 0, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 100, 4.0),
        (list(range(1, 101)), 99, 99.01),
        ([3.0, 1.0, 2.0], 50, 2.0),  # unsorted input
    ],
)
def test_percentile_table(values: list[float], q: float, expected: float):
    assert percentile(values, q) == pytest.approx(expected)


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=200),
    q=st.floats(0, 100),
)
def test_percentile_agrees_with_numpy(values: list[float], q: float):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), abs=1e-9)


def test_percentile_rejects_bad_input():
    with pytest.raises(ValueError, match=r"q: must be in \[0, 100\]"):
        percentile([1.0], 101)
    with pytest.raises(ValueError, match="values: need at least one value"):
        percentile([], 50)


def test_window_forgets_old_samples():
    w = LatencyWindow(window_s=10)
    for t in range(20):
        w.add(float(t), ttft_s=float(t), tpot_s=0.01 * t)
    assert w.count(now_s=19.0) == 11  # 9..19 inclusive
    assert w.percentile(0, now_s=19.0) == 9.0
    assert w.percentile(100, now_s=19.0) == 19.0
    assert w.percentile(50, now_s=19.0, metric="tpot") == pytest.approx(0.14)
    assert len(w) == 11  # pruned, not only filtered
    assert w.percentile(99, now_s=100.0) is None and w.count(now_s=100.0) == 0


def test_since_limits_to_samples_after_a_change():
    w = LatencyWindow(window_s=60)
    for t in range(10):
        w.add(float(t), ttft_s=5.0)  # under the old limit: slow
    for t in range(10, 14):
        w.add(float(t), ttft_s=1.0)  # after the change at t=10
    assert w.percentile(99, now_s=14.0) == pytest.approx(5.0)
    assert w.percentile(99, now_s=14.0, since_s=10.0) == pytest.approx(1.0)
    assert w.count(now_s=14.0, since_s=10.0) == 4


def test_stats_need_min_samples_and_skip_missing_tpot():
    w = LatencyWindow(window_s=30)
    for t in range(5):
        w.add(float(t), ttft_s=0.1 * (t + 1), tpot_s=None if t % 2 else 0.02)
    s = w.stats(now_s=5.0, min_samples=4)
    assert s.count == 5
    assert s.ttft_p50_s == pytest.approx(0.3) and s.ttft_p99_s == pytest.approx(0.496)
    assert s.tpot_p50_s is None and s.tpot_p99_s is None  # only 3 TPOT values
    s = w.stats(now_s=5.0, min_samples=3)
    assert s.tpot_p99_s == pytest.approx(0.02)
    s = w.stats(now_s=5.0, min_samples=6)
    assert s.ttft_p99_s is None and s.count == 5


def test_future_samples_are_not_counted_yet():
    w = LatencyWindow(window_s=10)
    w.add(5.0, ttft_s=1.0)
    w.add(12.0, ttft_s=9.0)  # a clock the caller has not reached yet
    assert w.percentile(100, now_s=10.0) == 1.0


def test_max_samples_bounds_memory():
    w = LatencyWindow(window_s=1e9, max_samples=100)
    for t in range(1000):
        w.add(float(t), ttft_s=float(t))
    assert len(w) == 100 and w.percentile(0, now_s=1000.0) == 900.0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: LatencyWindow(0), "window_s: must be > 0"),
        (lambda: LatencyWindow(10, max_samples=0), "max_samples: must be >= 1"),
        (lambda: LatencyWindow(10).add(0.0, ttft_s=-1.0), "ttft_s: must be a finite number"),
        (lambda: LatencyWindow(10).add(0.0, 1.0, float("nan")), "tpot_s: must be a finite"),
        (lambda: LatencyWindow(10).percentile(50, 0.0, metric="e2e"), "metric: must be"),  # type: ignore[arg-type]
        (lambda: LatencyWindow(10).stats(0.0, min_samples=0), "min_samples: must be >= 1"),
    ],
)
def test_bad_input_names_the_field(call, message: str):
    with pytest.raises(ValueError, match=message):
        call()


def test_admitted_since_keeps_only_requests_that_ran_wholly_after_a_change():
    w = LatencyWindow(window_s=30)
    # Finished after the change at t=10, but admitted before it: not fresh.
    w.add(12.0, 0.5, 0.9, admitted_s=5.0)
    w.add(13.0, 0.5, 0.1, admitted_s=10.5)
    w.add(14.0, 0.5, 0.2, admitted_s=11.0)
    w.add(15.0, 0.5, 0.3)  # admission time not known: never fresh
    fresh = w.stats(20.0, min_samples=1, admitted_since_s=10.0)
    assert fresh.count == 2 and fresh.tpot_p99_s == pytest.approx(0.2, abs=0.01)
    assert w.stats(20.0, min_samples=1, since_s=10.0).count == 4
