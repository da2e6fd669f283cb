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
    # The median of the decode steps' own mean gaps (0.1 and 0.2 s; the prefill-only step
    # has none).
    assert got.gap_median_s == pytest.approx(0.15)


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


def _chat_log(gap_s: float = 0.2) -> StepLatencyLog:
    """62 decode steps a second apart, 4 requests decoding in each, a first token every
    8th: 248 gaps over 8 requests, so a request decodes 31 gaps."""
    log = StepLatencyLog(max_age_s=1000.0)
    for i in range(62):
        log.add(float(i), (gap_s,) * 4, (0.5,) if i % 8 == 0 else ())
    return log


def test_a_request_length_comes_from_the_log_and_the_request_span_reaches_back_to_it():
    log = _chat_log()
    got = log.since(58.0, min_steps=8)
    assert got.decode_gaps == pytest.approx(31.0)
    assert got.request_steps == 31  # as many steps as a request decodes
    assert got.request_tpot_s == pytest.approx(0.2)
    assert got.steps == 8  # the probes' span is as before: min_steps
    assert log.since(58.0).steps == 4  # no reach asked: the span alone


def test_one_wave_step_among_few_is_not_a_requests_tpot():
    log = _chat_log()
    log.add(62.0, (3.0,) * 4, ())  # a step that prefilled a wave of new prompts
    for i in range(63, 70):
        log.add(float(i), (0.2,) * 4, ())
    got = log.since(66.0, min_steps=8, floor_s=62.0)  # 8 steps since the last change
    assert got.steps == got.request_steps == 8  # the floor stops the reach back
    assert got.itl_mean_s == pytest.approx(0.55)  # the 8 steps' mean: over a 0.5 s SLO
    # A request decodes 31 gaps: 8 as measured, the other 23 at the median step (0.2 s).
    gaps = got.decode_gaps
    assert gaps is not None
    assert got.request_tpot_s == pytest.approx((0.55 * 8 + (gaps - 8) * 0.2) / gaps)
    assert got.request_tpot_s < 0.3
    # The span's median step gap: the wave moves the mean (0.55 s), not the median.
    assert got.gap_median_s == pytest.approx(0.2)


def test_a_requests_tpot_may_reach_back_past_the_floor_of_the_steps_that_judge_the_moment():
    log = _chat_log()
    for i in range(62, 66):
        log.add(float(i), (1.0,) * 4, ())  # a spike of 4 slow steps (a CPU neighbour)
    # The moment's steps reach back 8 steps, not before 58; a request's (33 gaps now) to
    # 20 (say the last change): its last 33 steps, 29 of them at 0.2 s and the spike.
    got = log.since(64.0, min_steps=8, floor_s=58.0, request_floor_s=20.0)
    assert got.steps == 8 and got.itl_mean_s == pytest.approx(0.6)
    assert got.decode_gaps == pytest.approx(33.0) and got.request_steps == 33
    assert got.request_tpot_s == pytest.approx((29 * 0.2 + 4 * 1.0) / 33)
    # Without it, the request's floor is the moment's: 8 steps, the other 25 at their
    # median (0.6 s): the spike reads as a whole request's.
    got = log.since(64.0, min_steps=8, floor_s=58.0)
    assert got.request_steps == 8
    assert got.request_tpot_s == pytest.approx(0.6)


def test_a_slowdown_moves_the_median_with_it():
    log = _chat_log()
    for i in range(62, 70):
        log.add(float(i), (0.6,) * 4, ())  # the box slowed: every step
    got = log.since(66.0, min_steps=8, floor_s=62.0)
    assert got.request_tpot_s == pytest.approx(0.6)


def test_without_a_request_length_the_spans_mean_stands():
    log = StepLatencyLog()
    log.add(1.0, (0.2,) * 4, (0.5,))  # one first token: too few to say a request's length
    log.add(2.0, (3.0,) * 4, ())
    got = log.since(0.0, min_steps=8)
    assert got.decode_gaps is None
    assert got.request_tpot_s == got.itl_mean_s == pytest.approx(1.6)
