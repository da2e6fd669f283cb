"""Joules per token over a window and over the daemon's life."""

from __future__ import annotations

import pytest

from appliance.domain.energy import EnergyPerToken


def test_window_and_lifetime():
    e = EnergyPerToken(window_s=10)
    assert e.recent_j() is None and e.lifetime_j() is None
    e.add(0, 0.0, 0)
    e.add(5, 500.0, 100)  # 5 J/token
    assert e.recent_j() == pytest.approx(5.0) and e.lifetime_j() == pytest.approx(5.0)
    e.add(20, 700.0, 200)  # the last 15 s: 2 J/token
    e.add(25, 800.0, 250)
    # The window keeps the newest reading at or before its left edge (t=15 -> t=5).
    assert e.recent_j() == pytest.approx((800 - 500) / (250 - 100))
    assert e.lifetime_j() == pytest.approx(800 / 250)


def test_idle_window_has_no_figure():
    e = EnergyPerToken(window_s=10)
    e.add(0, 0.0, 50)
    e.add(30, 3000.0, 50)  # power spent, nothing generated: no J/token to quote
    assert e.recent_j() is None
    assert e.lifetime_j() == pytest.approx(60.0)


def test_counter_going_backwards_is_not_a_figure():
    e = EnergyPerToken(window_s=100)
    e.add(0, 100.0, 0)
    e.add(1, 50.0, 10)
    assert e.recent_j() is None


def test_bad_window():
    with pytest.raises(ValueError, match="window_s"):
        EnergyPerToken(window_s=0)
