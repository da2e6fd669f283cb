"""The availability SLO's policy: what counts as good, bad, up and down, and the figures."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.domain.availability import (
    RequestClass,
    SloTotals,
    TimeClass,
    availability_of,
    burn_rate,
    classify_request,
    classify_time,
    error_budget,
)
from appliance.domain.history import is_amount_field, rollup

UP, DOWN, EXCL = TimeClass.UP, TimeClass.DOWN, TimeClass.EXCLUDED


@pytest.mark.parametrize(
    ("reason", "unplanned", "expected"),
    [
        ("ready", False, UP),
        ("ready", True, UP),
        ("paused", False, EXCL),  # an operator's choice
        ("paused", True, EXCL),
        ("draining", False, EXCL),  # SIGTERM
        ("stopped", False, EXCL),
        ("restarting", False, EXCL),  # graceful restart: operator or maintenance
        ("restarting", True, DOWN),  # ... whose new engine failed to start
        ("starting", False, EXCL),  # a planned boot
        ("starting", True, DOWN),  # a boot after the previous run crashed
        ("engine_dead", False, DOWN),
        ("protect", False, DOWN),  # thermal: nobody planned the hot room
        ("something_new", False, DOWN),
    ],
)
def test_time_classes(reason: str, unplanned: bool, expected: TimeClass) -> None:
    assert classify_time(reason, unplanned) is expected


@pytest.mark.parametrize(
    ("status", "readiness", "expected"),
    [
        ("ok", UP, RequestClass.GOOD),
        ("deadline", UP, RequestClass.GOOD),  # the partial answer a deadline asks for
        ("error", UP, RequestClass.BAD),
        ("error", EXCL, RequestClass.BAD),  # a restart that cut a request off burns
        ("not_ready", DOWN, RequestClass.BAD),  # engine dead, protect, start after a crash
        ("not_ready", UP, RequestClass.BAD),  # a refusal nothing explains
        ("not_ready", EXCL, RequestClass.EXCLUDED),  # paused, draining
        ("rejected", UP, RequestClass.EXCLUDED),  # 429: overload protection by design
        ("rate_limited", UP, RequestClass.EXCLUDED),
        ("deadline_queued", UP, RequestClass.EXCLUDED),  # 408: the client's deadline
        ("cancelled", DOWN, RequestClass.EXCLUDED),  # the client went away
        ("forbidden", UP, RequestClass.EXCLUDED),
        ("bad_request", UP, RequestClass.EXCLUDED),
    ],
)
def test_request_classes(status: str, readiness: TimeClass, expected: RequestClass) -> None:
    assert classify_request(status, readiness) is expected


@pytest.mark.parametrize(
    ("totals", "request_ratio", "time_ratio", "ratio"),
    [
        (SloTotals(), None, None, None),
        (SloTotals(good=999, bad=1), 0.999, None, 0.999),  # no time data: requests alone
        (SloTotals(up_s=999, down_s=1), None, 0.999, 0.999),  # quiet hours: time alone
        (SloTotals(good=100, up_s=3600), 1.0, 1.0, 1.0),
        (SloTotals(good=99, bad=1, up_s=99, down_s=1), 0.99, 0.99, 0.9801),  # both burn
        (SloTotals(bad=5, down_s=10), 0.0, 0.0, 0.0),
    ],
)
def test_availability_is_the_product_of_both_halves(
    totals: SloTotals, request_ratio: float | None, time_ratio: float | None, ratio: float | None
) -> None:
    a = availability_of(totals)
    assert a.request_ratio == request_ratio and a.time_ratio == time_ratio
    assert a.ratio == (None if ratio is None else pytest.approx(ratio))


@pytest.mark.parametrize(
    ("availability", "consumed", "remaining"),
    [
        (None, 0.0, 1.0),  # nothing measured, nothing spent
        (1.0, 0.0, 1.0),
        (0.9995, 0.5, 0.5),
        (0.999, 1.0, 0.0),
        (0.99, 10.0, -9.0),  # overspent: shown, not clamped
    ],
)
def test_error_budget_of_three_nines(
    availability: float | None, consumed: float, remaining: float
) -> None:
    b = error_budget(availability)
    assert b.objective == 0.999 and b.allowed_error_ratio == pytest.approx(0.001)
    assert b.consumed_ratio == pytest.approx(consumed)
    assert b.remaining_ratio == pytest.approx(remaining)


def test_error_budget_refuses_a_meaningless_objective() -> None:
    with pytest.raises(ValueError, match="objective"):
        error_budget(0.5, objective=1.0)


def test_burn_rates_of_the_workbook() -> None:
    # 14.4x for an hour spends 2 % of a 30-day budget; 1x spends it exactly in 30 days.
    assert burn_rate(0.0144) == pytest.approx(14.4)
    assert burn_rate(0.001) == pytest.approx(1.0)
    spent_in_1h = 14.4 * 3600 / (30 * 86400)
    assert spent_in_1h == pytest.approx(0.02)


_counts = st.floats(min_value=0, max_value=1e9, allow_nan=False)


@given(good=_counts, bad=_counts, up=_counts, down=_counts, more_bad=_counts, more_down=_counts)
def test_availability_properties(
    good: float, bad: float, up: float, down: float, more_bad: float, more_down: float
) -> None:
    a = availability_of(SloTotals(good, bad, up, down))
    if a.ratio is None:
        assert good + bad == 0 and up + down == 0
        return
    assert 0.0 <= a.ratio <= 1.0
    halves = [h for h in (a.request_ratio, a.time_ratio) if h is not None]
    assert a.ratio <= min(halves) + 1e-12  # the product never hides the worse half
    # More failure never raises availability, nor the budget left.
    worse = availability_of(SloTotals(good, bad + more_bad, up, down + more_down))
    assert worse.ratio is not None and worse.ratio <= a.ratio + 1e-12
    assert error_budget(worse.ratio).remaining_ratio <= error_budget(a.ratio).remaining_ratio
    assert error_budget(a.ratio).remaining_ratio <= 1.0


def test_a_rollup_sums_the_slo_amounts() -> None:
    raw = [(float(t), {"slo_good": 2.0, "slo_down_s": 0.5, "queued": t}) for t in range(0, 120, 5)]
    minutes = rollup(raw, 60)
    assert [m["slo_good"] for _, m in minutes] == [24.0, 24.0]
    assert [m["slo_down_s"] for _, m in minutes] == [6.0, 6.0]
    assert minutes[0][1]["queued"] == pytest.approx(27.5)  # the others still average
    ((_, hour),) = rollup(minutes, 3600)
    assert hour["slo_good"] == 48.0 and math.isclose(hour["slo_down_s"], 12.0)
    assert is_amount_field("slo_bad") and not is_amount_field("requests_per_s")
