"""Knee, Pareto front, weighted score and the tuning plan on recorded and synthetic curves."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.domain.sweep_analysis import (
    ScoreWeights,
    Slo,
    SweepPoint,
    find_knee,
    next_extension,
    next_tuning_level,
    pareto_front,
    throughput_knee,
    tuning_result,
    weighted_score,
)


def pt(
    c: int,
    tok_s: float,
    ttft: float | None = None,
    tpot: float = 0.05,
    util: float | None = None,
    energy: float | None = None,
) -> SweepPoint:
    ttft_p99 = ttft if ttft is not None else 0.05 * c
    return SweepPoint(
        concurrency=c,
        output_tok_s=tok_s,
        request_per_s=tok_s / 32,
        ttft_p50_s=ttft_p99 / 2,
        ttft_p99_s=ttft_p99,
        tpot_p50_s=tpot * 0.8,
        tpot_p99_s=tpot,
        e2e_p99_s=ttft_p99 + 31 * tpot,
        utilisation=util,
        energy_j_per_token=energy,
    )


def curve(pairs: list[tuple[int, float]], **kw: object) -> list[SweepPoint]:
    return [pt(c, t, **kw) for c, t in pairs]  # type: ignore[arg-type]


# Measured on the CPU engine (2-core box): offline LLM.generate, 32 output tokens each.
RECORDED_CPU = curve([(1, 31.0), (8, 192.0), (64, 317.0)])
FLAT = curve([(1, 100.0), (2, 101.0), (4, 99.0), (8, 100.5), (16, 100.0)])
NOISY = curve(
    [(1, 31), (2, 60), (4, 118), (8, 190), (16, 262), (24, 270), (32, 258), (48, 275), (64, 268)]
)
COLLAPSE = curve([(1, 30), (2, 58), (4, 110), (8, 180), (16, 150), (32, 120)])
DIP_THEN_RECOVERY = curve([(1, 30), (2, 58), (4, 50), (8, 190), (16, 200)])
STILL_RISING = curve([(1, 30), (2, 60), (4, 120)])


@pytest.mark.parametrize(
    ("points", "knee", "rising"),
    [
        (RECORDED_CPU, 8, False),  # 8 -> 64 buys 2.1 tok/s per added sequence, < 10 % of 31
        (FLAT, 1, False),
        (NOISY, 16, False),
        (COLLAPSE, 8, False),
        (DIP_THEN_RECOVERY, 8, False),  # the dip at 4 must not end the search
        (STILL_RISING, 4, True),
        (curve([(4, 120)]), 4, False),
    ],
    ids=["recorded-cpu", "flat", "noisy", "collapse", "dip", "rising", "single"],
)
def test_knee_on_recorded_curves(points: list[SweepPoint], knee: int, rising: bool):
    k = find_knee(points)
    assert (k.concurrency, k.throughput_knee, k.still_rising, k.slo_limited) == (
        knee,
        knee,
        rising,
        False,
    )
    assert k.reason


def test_knee_reasons_say_why():
    assert "sweep higher" in find_knee(STILL_RISING).reason
    assert "flat curve" in find_knee(FLAT).reason
    assert find_knee(RECORDED_CPU).reason == (
        "192 tok/s at 8; no higher level adds 10% of one sequence's 31 tok/s per added sequence"
    )


def test_knee_is_order_independent():
    assert find_knee(list(reversed(NOISY))).concurrency == 16


def test_threshold_moves_the_knee():
    # A stricter "worth it" bar stops earlier; a looser one goes further.
    assert throughput_knee(RECORDED_CPU, min_gain_ratio=0.05)[0] == 64
    assert throughput_knee(NOISY, min_gain_ratio=0.5)[0] == 8


def test_noise_ratio_ignores_jitter_between_close_levels():
    pts = curve([(1, 30), (8, 190), (9, 195), (10, 192), (11, 197)])
    assert throughput_knee(pts, noise_ratio=0.03)[0] == 8
    assert throughput_knee(pts, noise_ratio=0.0)[0] == 9  # jitter reads as gain


def test_knee_matches_the_analytic_one_on_a_saturating_curve():
    """T(c) = T_max c / (c + K): the derivative falls to 10 % of T(1) at c* (solved below)."""
    t_max, k = 330.0, 8.0
    pts = [pt(c, t_max * c / (c + k)) for c in range(1, 65)]
    t1 = t_max / (1 + k)
    c_star = math.sqrt(t_max * k / (0.1 * t1)) - k  # T'(c) = T_max K / (c + K)^2
    knee, _ = throughput_knee(pts, noise_ratio=0.0)
    assert abs(knee - c_star) <= 1.0, (knee, c_star)


def test_slo_caps_the_knee():
    pts = [
        pt(1, 31, ttft=0.1),
        pt(4, 115, ttft=0.4),
        pt(8, 192, ttft=0.9),
        pt(16, 262, ttft=1.8),
        pt(32, 300, ttft=3.5),
        pt(64, 317, ttft=7.0),
    ]
    k = find_knee(pts, Slo(ttft_p99_s=1.5))
    assert (k.concurrency, k.slo_limited, k.slo_limit, k.throughput_knee) == (8, True, 8, 16)
    assert (
        k.reason
        == "the SLO breaks at 16 (p99 TTFT 1.8 s > 1.5 s); throughput would still pay up to 16"
    )
    # A loose SLO leaves the throughput knee in charge, and records the last level it held.
    k = find_knee(pts, Slo(ttft_p99_s=5.0))
    assert (k.concurrency, k.slo_limited, k.slo_limit) == (16, False, 32)


def test_slo_broken_at_the_lowest_level():
    k = find_knee(RECORDED_CPU, Slo(tpot_p99_s=0.01))
    assert (k.concurrency, k.slo_limited, k.slo_limit) == (1, True, None)
    assert "even at the lowest level 1" in k.reason and "p99 TPOT 50 ms > 10 ms" in k.reason


def test_non_monotone_latency_uses_the_first_breach():
    pts = [pt(1, 30, ttft=0.2), pt(2, 58, ttft=2.0), pt(4, 110, ttft=0.5), pt(8, 180, ttft=0.6)]
    k = find_knee(pts, Slo(ttft_p99_s=1.0))
    assert k.concurrency == 1 and k.slo_limited


def test_bad_sweeps_are_rejected():
    with pytest.raises(ValueError, match="points: need at least one sweep point"):
        find_knee([])
    with pytest.raises(ValueError, match="points: concurrency 8 appears more than once"):
        find_knee([pt(8, 10), pt(8, 12)])
    with pytest.raises(ValueError, match="concurrency: must be >= 1"):
        pt(0, 10)
    with pytest.raises(ValueError, match="output_tok_s: must be a finite number >= 0"):
        pt(1, -5)
    with pytest.raises(ValueError, match=r"utilisation: must be in \[0, 1\]"):
        pt(1, 5, util=1.5)
    with pytest.raises(ValueError, match=r"slo\.ttft_p99_s: must be in \[0\.001, 3600\] s"):
        Slo(ttft_p99_s=0)
    with pytest.raises(ValueError, match=r"slo\.e2e_p99_s: must be in \[0\.001, 3600\] s"):
        Slo(e2e_p99_s=7200)
    with pytest.raises(ValueError, match=r"min_gain_ratio: must be in \(0, 1\)"):
        throughput_knee(RECORDED_CPU, min_gain_ratio=0)


@settings(max_examples=200, deadline=None)
@given(
    tok=st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=12),
    ttft=st.lists(st.floats(0.01, 20), min_size=12, max_size=12),
    slo=st.one_of(st.none(), st.floats(0.05, 10)),
)
def test_knee_properties(tok: list[float], ttft: list[float], slo: float | None):
    levels = [2**i for i in range(len(tok))]
    pts = [pt(c, t, ttft=ttft[i]) for i, (c, t) in enumerate(zip(levels, tok, strict=True))]
    k = find_knee(pts, Slo(ttft_p99_s=slo) if slo else None)
    assert k.concurrency in levels
    assert k.concurrency <= k.throughput_knee
    if slo is not None and k.slo_limit is not None:
        # Every level up to the knee keeps the SLO.
        assert all(p.ttft_p99_s <= slo for p in pts if p.concurrency <= k.concurrency)
    if slo is not None and pts[0].ttft_p99_s > slo:
        assert k.concurrency == 1 and k.slo_limited
    # The throughput knee never sits past the (first) level of peak throughput.
    peak = max(pts, key=lambda p: (p.output_tok_s, -p.concurrency))
    assert k.throughput_knee <= peak.concurrency
    if k.still_rising:
        assert k.throughput_knee == levels[-1]


# -- Pareto -------------------------------------------------------------------------------------


def test_pareto_recorded_curve_is_all_efficient():
    front = pareto_front(RECORDED_CPU)
    assert [p.concurrency for p in front] == [1, 8, 64]  # more throughput costs latency


def test_pareto_drops_levels_past_a_collapse():
    assert [p.concurrency for p in pareto_front(COLLAPSE)] == [1, 2, 4, 8]


def test_pareto_noisy_curve_drops_dominated_levels():
    # 32 (258 tok/s, 1.6 s) is beaten by 24 (270 tok/s, 1.2 s); 64 by 48.
    assert [p.concurrency for p in pareto_front(NOISY)] == [1, 2, 4, 8, 16, 24, 48]


def test_pareto_uses_energy_only_when_every_level_has_it():
    pts = [
        pt(1, 30, ttft=0.5, energy=2.0),
        pt(2, 30, ttft=0.5, energy=1.0),
        pt(4, 60, ttft=1.0, energy=3.0),
    ]
    assert [p.concurrency for p in pareto_front(pts)] == [2, 4]  # 1 loses on energy alone
    pts[1] = pt(2, 30, ttft=0.5, energy=None)
    # Without energy, 1 and 2 tie on throughput and latency: neither dominates the other.
    assert [p.concurrency for p in pareto_front(pts)] == [1, 2, 4]


def test_pareto_other_latency_field():
    pts = [pt(1, 30, ttft=0.1, tpot=0.3), pt(2, 30, ttft=0.2, tpot=0.1)]
    assert [p.concurrency for p in pareto_front(pts)] == [1]
    assert [p.concurrency for p in pareto_front(pts, latency_field="tpot_p99_s")] == [2]
    with pytest.raises(ValueError, match="latency_field: must be one of"):
        pareto_front(pts, latency_field="ttft_p50_s")


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.floats(0, 1000), st.floats(0.01, 10), st.floats(0.1, 5)),
        min_size=1,
        max_size=10,
    )
)
def test_pareto_properties(rows: list[tuple[float, float, float]]):
    pts = [pt(i + 1, t, ttft=lat, energy=e) for i, (t, lat, e) in enumerate(rows)]
    front = pareto_front(pts)
    assert front  # never empty
    best_tok = max(p.output_tok_s for p in pts)
    assert any(p.output_tok_s == best_tok for p in front)
    best_lat = min(p.ttft_p99_s for p in pts)
    assert any(p.ttft_p99_s == best_lat for p in front)
    for p in pts:
        if p not in front:  # everything left out is dominated by something on the front
            assert any(
                q.output_tok_s >= p.output_tok_s
                and q.ttft_p99_s <= p.ttft_p99_s
                and (q.energy_j_per_token or 0) <= (p.energy_j_per_token or 0)
                for q in front
            )


# -- weighted score -------------------------------------------------------------------------


def test_score_without_telemetry_renormalises_latency_and_throughput():
    res = weighted_score(RECORDED_CPU)
    assert res.dropped == ("utilisation", "energy")
    assert res.weights_used == pytest.approx({"latency": 0.4 / 0.7, "throughput": 0.3 / 0.7})
    by_c = {s.concurrency: s for s in res.scores}
    # latency 0.05 / 0.4 / 3.2 s; throughput 31 / 192 / 317 tok/s
    assert by_c[1].score == pytest.approx(0.4 / 0.7 * 1.0 + 0.3 / 0.7 * 0.0)
    assert by_c[8].latency == pytest.approx((3.2 - 0.4) / (3.2 - 0.05))
    assert by_c[8].throughput == pytest.approx((192 - 31) / (317 - 31))
    assert by_c[64].score == pytest.approx(0.3 / 0.7)
    assert by_c[8].utilisation is None and by_c[8].energy is None
    assert res.best_concurrency == 8


def test_score_with_every_metric():
    pts = [
        pt(1, 100, ttft=1.0, util=0.2, energy=3.0),
        pt(2, 200, ttft=2.0, util=0.6, energy=2.0),
        pt(4, 300, ttft=3.0, util=1.0, energy=1.0),
    ]
    res = weighted_score(pts)
    assert res.dropped == ()
    scores = [s.score for s in res.scores]
    # Latency falls as the rest rise, linearly: 0.4 x (1 - x) + 0.6 x x.
    assert scores == pytest.approx([0.4, 0.5, 0.6])
    assert res.best_concurrency == 4
    res = weighted_score(pts, ScoreWeights(latency=1, throughput=0, utilisation=0, energy=0))
    assert res.best_concurrency == 1


def test_score_flat_metric_and_ties_prefer_fewer_sequences():
    res = weighted_score([*FLAT[:1], pt(2, 100.0, ttft=0.05)])
    assert [s.score for s in res.scores] == [1.0, 1.0] and res.best_concurrency == 1


def test_score_weights_are_validated():
    with pytest.raises(ValueError, match=r"weights\.latency: must be a finite number >= 0"):
        ScoreWeights(latency=-1)
    with pytest.raises(ValueError, match="weights: at least one weight must be > 0"):
        ScoreWeights(0, 0, 0, 0)
    with pytest.raises(ValueError, match="every metric with a weight > 0 is missing"):
        weighted_score(RECORDED_CPU, ScoreWeights(latency=0, throughput=0, utilisation=1, energy=0))


# -- three-phase tuning ------------------------------------------------------------------------


def saturating(c: int) -> SweepPoint:
    """A box like this one: T = 330 c / (c + 8); TTFT grows with the queue in the engine."""
    return pt(c, 330 * c / (c + 8), ttft=0.08 * c)


def run_tuning(measure, slo: Slo | None, max_c: int = 256) -> tuple[list[int], list[SweepPoint]]:
    points: list[SweepPoint] = []
    order = []
    while (c := next_tuning_level(points, slo, max_concurrency=max_c)) is not None:
        assert c not in order, "a level was measured twice"
        order.append(c)
        points.append(measure(c))
    return order, points


def test_tuning_goes_up_from_the_baseline_to_the_knee():
    # Yardstick: the baseline's 165 tok/s / 8 = 20.6 per sequence, so 10 % is 2.06 tok/s;
    # T'(c) = 2640 / (c + 8)^2 falls below that at c = 27.8: 16 -> 32 still pays, 32 -> 64
    # does not, and 64 is the level that shows it.
    order, points = run_tuning(saturating, None)
    assert order == [8, 16, 32, 64]
    res = tuning_result(points)
    assert res.baseline is not None and res.baseline.concurrency == 8
    assert res.recommended_limit == res.knee.concurrency == 32
    assert res.reason.startswith("knee at 32: ")


def test_tuning_stops_where_the_slo_breaks():
    order, points = run_tuning(saturating, Slo(ttft_p99_s=1.5))
    assert order == [8, 16, 32]  # 32 breaks at 2.56 s
    res = tuning_result(points, Slo(ttft_p99_s=1.5))
    assert res.recommended_limit == 16 and res.knee.slo_limited
    order, points = run_tuning(saturating, Slo(ttft_p99_s=1.0))
    assert order == [8, 16]  # 16 breaks at 1.28 s
    res = tuning_result(points, Slo(ttft_p99_s=1.0))
    assert res.recommended_limit == 8 and res.knee.slo_limited


def test_tuning_goes_down_when_the_baseline_breaks_the_slo():
    order, points = run_tuning(saturating, Slo(ttft_p99_s=0.2))
    assert order == [8, 4, 2]  # 2 keeps 0.16 s
    assert tuning_result(points, Slo(ttft_p99_s=0.2)).recommended_limit == 2
    order, points = run_tuning(saturating, Slo(ttft_p99_s=0.01))
    assert order == [8, 4, 2, 1]
    res = tuning_result(points, Slo(ttft_p99_s=0.01))
    assert res.recommended_limit == 1 and "even at the lowest level" in res.reason


def test_tuning_still_rising_at_max_concurrency_recommends_no_ceiling():
    linear = lambda c: pt(c, 30.0 * c)  # noqa: E731 - never saturates
    order, points = run_tuning(linear, None, max_c=48)
    assert order == [8, 16, 32, 48]
    res = tuning_result(points, max_limit=40)
    # A ceiling at 40 (or 48) would cap a box that still scales: there is none.
    assert res.knee.still_rising and res.recommended_limit is None
    assert res.reason.startswith("no ceiling: throughput still rising at the largest level 48")
    assert run_tuning(linear, None, max_c=4)[0] == [4]  # baseline capped by the maximum


def test_tuning_clamps_a_knee_into_the_limits():
    _, points = run_tuning(saturating, None)
    res = tuning_result(points, max_limit=20)
    assert res.recommended_limit == 20 and "clamped to [1, 20] = 20" in res.reason


def run_extended(measure, levels: list[int], extend_to: int | None, slo: Slo | None = None):
    """The levels a sweep of `levels` measures once next_extension has its say."""
    points = [measure(c) for c in levels]
    while (c := next_extension(points, extend_to, slo)) is not None:
        assert c not in [p.concurrency for p in points]
        points.append(measure(c))
    return [p.concurrency for p in points], points


def test_a_sweep_still_rising_at_16_doubles_up_to_max_num_seqs():
    # An H200-like box: throughput keeps paying up to ~128 sequences.
    big = lambda c: pt(c, 4000 * c / (c + 40), ttft=0.02)  # noqa: E731
    order, points = run_extended(big, [1, 2, 4, 8, 16], extend_to=256)
    assert order == [1, 2, 4, 8, 16, 32, 64, 128]  # 128 shows the bend
    knee = find_knee(points)
    assert not knee.still_rising and knee.concurrency >= 64
    # Without the extension the same box looked "still rising" at 16: the old ceiling.
    assert find_knee(points[:5]).still_rising


def test_a_sweep_still_rising_at_max_num_seqs_stops_there():
    linear = lambda c: pt(c, 30.0 * c, ttft=0.02)  # noqa: E731
    order, points = run_extended(linear, [1, 2, 4], extend_to=24)
    assert order == [1, 2, 4, 8, 16, 24]
    assert find_knee(points).still_rising


def test_a_bent_or_slo_broken_sweep_is_not_extended():
    order, _ = run_extended(saturating, [8, 16, 32, 64], extend_to=256)
    assert order == [8, 16, 32, 64]  # bent at 32: 64 shows it
    linear = lambda c: pt(c, 30.0 * c, ttft=0.1 * c)  # noqa: E731
    order, _ = run_extended(linear, [1, 2, 4], extend_to=256, slo=Slo(ttft_p99_s=0.5))
    assert order == [1, 2, 4, 8]  # 8 breaks the SLO at 0.8 s: higher would break it more
    assert run_extended(linear, [1, 2], extend_to=None)[0] == [1, 2]
    assert run_extended(linear, [4], extend_to=64)[0] == [4]  # one level shows no slope


def test_tuning_result_is_json_ready():
    import json

    _, points = run_tuning(saturating, None)
    doc = json.loads(json.dumps(tuning_result(points).to_dict()))
    assert doc["recommended_limit"] == 32 and len(doc["points"]) == 4
