"""Rates from running totals."""

from __future__ import annotations

import pytest

from appliance.domain.rates import CounterRates


def test_rates_between_samples():
    r = CounterRates()
    assert r.sample(0.0, {"tokens": 0, "requests": 0}) == {"tokens": None, "requests": None}
    assert r.sample(5.0, {"tokens": 500, "requests": 10}) == {"tokens": 100.0, "requests": 2.0}
    rates = r.sample(15.0, {"tokens": 600, "requests": 10})
    assert rates["tokens"] == pytest.approx(10.0) and rates["requests"] == 0.0


def test_reset_and_new_counters_have_no_rate():
    r = CounterRates()
    r.sample(0.0, {"tokens": 100})
    assert r.sample(1.0, {"tokens": 50, "new": 3}) == {"tokens": None, "new": None}
    assert r.sample(2.0, {"tokens": 60, "new": 5}) == {"tokens": 10.0, "new": 2.0}
    assert r.sample(2.0, {"tokens": 70}) == {"tokens": None}  # no time passed
