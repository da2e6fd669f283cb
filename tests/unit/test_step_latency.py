"""The engine's per-step latency log: live TPOT and TTFT since a moment."""

from __future__ import annotations

import pytest

from appliance.domain.step_latency import StepLatency, StepLatencyLog


def test_steps_since_a_moment_give_the_mean_gap_and_first_token_p99():
    log = StepLatencyLog()
    log.add(1.0, (0.5, 0.5), ())  # before the moment: not counted
    log.add(2.0, (0.1, 0.1, 0.1), (0.3,))
    log.add(3.0, (0.2,), (0.7,))
    log.add(3.5, (), (0.5,))  # a prefill-only step: a first token, no decode gap
    got = log.since(2.0)
    assert (got.steps, got.itl_count, got.ttft_count) == (2, 4, 3)
    assert got.itl_mean_s == pytest.approx(0.125)
    assert got.ttft_p99_s == pytest.approx(0.696)  # interpolated between 0.5 and 0.7


def test_nothing_since_the_moment_is_an_empty_span():
    log = StepLatencyLog()
    log.add(1.0, (0.1,), (0.2,))
    assert log.since(5.0) == StepLatency()


def test_old_steps_age_out_and_bad_values_are_dropped():
    log = StepLatencyLog(max_age_s=10.0)
    log.add(0.0, (0.1,), ())
    log.add(20.0, (0.3, float("nan"), -1.0), (float("inf"),))
    got = log.since(0.0)
    assert (got.steps, got.itl_count, got.itl_mean_s, got.ttft_count) == (1, 1, 0.3, 0)
    log.add(21.0, (), ())  # an empty step is no step
    assert log.since(0.0).steps == 1


def test_bad_log_settings_name_the_field():
    with pytest.raises(ValueError, match="max_age_s"):
        StepLatencyLog(max_age_s=0)
    with pytest.raises(ValueError, match="max_steps"):
        StepLatencyLog(max_steps=0)
