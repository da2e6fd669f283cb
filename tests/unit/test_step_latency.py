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
    # 7 requests produced a token over 3 steps: the batch these were measured at.
    assert got.batch_mean == pytest.approx(7 / 3)


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


def test_too_few_steps_since_the_moment_reach_back_to_min_steps_but_not_past_the_floor():
    log = StepLatencyLog()
    for i in range(10):
        log.add(float(i), (0.5,), ())  # one decode step a second, 0..9
    log.add(9.5, (), (0.2,))  # a prefill-only step: not a decode step to count
    assert log.since(7.0).steps == 3
    got = log.since(7.0, min_steps=5)
    assert got.steps == 5 and got.ttft_count == 1  # steps 5..9, and the prefill at 9.5
    assert log.since(7.0, min_steps=5, floor_s=6.0).steps == 4  # never before the floor
    assert log.since(7.0, min_steps=2).steps == 3  # enough since the moment: as before
    assert log.since(0.0, min_steps=50).steps == 10  # all there are
