"""Thermal policy: tables for each transition, hypothesis properties for the invariants."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.domain.gpu_sample import GpuSample, lost_sample
from appliance.domain.thermal import (
    ThermalDecision,
    ThermalLevel,
    ThermalPolicyConfig,
    ThermalState,
    energy_delta_j,
    energy_per_token_j,
    initial_state,
    step,
)

CFG = ThermalPolicyConfig()  # 85 / 95 °C, hysteresis 5, dwell 60 s, x0.75 per 30 s, floor 0.25


def gpu(
    core: float | None,
    mem: float | None = None,
    *,
    slow: float | None = None,
    index: int = 0,
    invalid: tuple[str, ...] = (),
    energy: float | None = None,
) -> GpuSample:
    return GpuSample(
        index=index,
        uuid=f"GPU-{index}",
        name="test",
        simulated=True,
        timestamp_s=0.0,
        core_temp_c=core,
        mem_temp_c=mem,
        slowdown_temp_c=slow,
        invalid=invalid,
        energy_j=energy,
    )


def run(
    trace: Iterable[tuple[float, list[GpuSample]]],
    state: ThermalState | None = None,
    cfg: ThermalPolicyConfig = CFG,
) -> list[ThermalDecision]:
    """Feed (now_s, samples) pairs through the policy; return every decision."""
    st_ = state if state is not None else initial_state(0.0)
    out = []
    for now, samples in trace:
        d = step(st_, samples, now, cfg)
        out.append(d)
        st_ = d.state
    return out


# -- tables ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("core", "mem", "slow", "level", "factor"),
    [
        (60.0, None, None, ThermalLevel.NORMAL, 1.0),
        (84.9, 94.9, 95.0, ThermalLevel.NORMAL, 1.0),  # 84.9 < 95 - 3 = 92: no slowdown protect
        (85.0, None, None, ThermalLevel.DERATE, 0.75),
        (90.0, 60.0, None, ThermalLevel.DERATE, 0.75),
        (70.0, 95.0, None, ThermalLevel.PROTECT, 0.75),
        (87.0, None, 90.0, ThermalLevel.PROTECT, 0.75),  # within 3 °C of slowdown 90
        (86.9, None, 90.0, ThermalLevel.DERATE, 0.75),
    ],
)
def test_first_step_from_normal(
    core: float, mem: float | None, slow: float | None, level: ThermalLevel, factor: float
) -> None:
    d = step(initial_state(0.0), [gpu(core, mem, slow=slow)], 1.0, CFG)
    assert d.level is level
    assert d.factor == pytest.approx(factor)
    assert d.changed is (level is not ThermalLevel.NORMAL)


def test_derate_reason_names_gpu_and_temperature() -> None:
    d = step(initial_state(0.0), [gpu(70.0, index=0), gpu(86.5, index=1)], 1.0, CFG)
    assert d.level is ThermalLevel.DERATE
    assert d.gpu_index == 1 and d.temp_c == 86.5
    assert "gpu1" in d.reason and "86.5" in d.reason and "1.00 -> 0.75" in d.reason


def test_stepwise_cut_while_hot_never_below_floor() -> None:
    decisions = run((t, [gpu(88.0)]) for t in range(0, 400, 5))
    factors = [d.factor for d in decisions]
    # A cut at 0 s, then one per 30 s: 0.75, 0.5625, 0.421875, 0.31640625, then the floor.
    by_time = dict(zip(range(0, 400, 5), factors, strict=True))
    assert by_time[0] == 0.75
    assert by_time[25] == 0.75
    assert by_time[30] == pytest.approx(0.5625)
    assert by_time[60] == pytest.approx(0.421875)
    assert by_time[90] == pytest.approx(0.31640625)
    assert by_time[120] == 0.25
    assert min(factors) == 0.25
    assert "floor" in decisions[-1].reason


def test_hysteresis_band_holds_then_dwell_recovers_stepwise() -> None:
    hot = [(0.0, [gpu(86.0)]), (30.0, [gpu(86.0)])]  # 0.75 then 0.5625
    band = [(30.0 + t, [gpu(82.0)]) for t in range(5, 300, 5)]  # 80 <= T < 85: hold
    cool = [(330.0 + t, [gpu(75.0)]) for t in range(0, 400, 5)]
    decisions = run(hot + band + cool)
    assert decisions[1].factor == pytest.approx(0.5625)
    assert all(d.factor == pytest.approx(0.5625) for d in decisions[2 : 2 + len(band)])
    assert all(d.level is ThermalLevel.DERATE for d in decisions[2 : 2 + len(band)])
    rest = decisions[2 + len(band) :]
    at = {round(t): d for (t, _), d in zip(cool, rest, strict=True)}
    assert at[385].factor == pytest.approx(0.5625)  # cool for 55 s: not yet
    assert at[390].factor == pytest.approx(0.6625) and at[390].changed  # 60 s: +0.1
    assert at[445].factor == pytest.approx(0.6625)
    assert at[450].factor == pytest.approx(0.7625)
    assert "cool for 60 s" in at[450].reason
    assert at[570].factor == pytest.approx(0.9625)
    assert at[630].factor == 1.0 and at[630].level is ThermalLevel.NORMAL
    assert [round(d.factor, 4) for d in rest] == sorted(round(d.factor, 4) for d in rest)


def test_dwell_restarts_when_the_temperature_returns_to_the_band() -> None:
    trace = [(0.0, [gpu(86.0)])]
    trace += [(float(t), [gpu(70.0)]) for t in range(10, 60, 10)]  # cool 10..50 s
    trace += [(60.0, [gpu(81.0)])]  # back in the band: the dwell restarts
    trace += [(float(t), [gpu(70.0)]) for t in range(70, 140, 10)]
    decisions = run(trace)
    times = [t for t, _ in trace]
    at = dict(zip(times, decisions, strict=True))
    assert at[120.0].factor == 0.75  # only 50 s cool since 70 s
    assert at[130.0].factor == pytest.approx(0.85)


def test_protect_on_hbm_holds_in_band_and_leaves_after_dwell() -> None:
    trace = [(0.0, [gpu(70.0, 95.5)])]
    trace += [(float(t), [gpu(70.0, 92.0)]) for t in range(10, 200, 10)]  # 90 <= HBM < 95
    trace += [(float(t), [gpu(70.0, 85.0)]) for t in range(200, 400, 10)]
    at = dict(zip([t for t, _ in trace], run(trace), strict=True))
    assert at[0.0].level is ThermalLevel.PROTECT and "HBM 95.5" in at[0.0].reason
    assert at[0.0].factor == 0.75
    assert all(at[float(t)].level is ThermalLevel.PROTECT for t in range(10, 200, 10))
    assert at[250.0].level is ThermalLevel.PROTECT  # below the band for 50 s
    assert at[260.0].level is ThermalLevel.DERATE and at[260.0].changed
    assert "leave PROTECT" in at[260.0].reason and "HBM 85.0" in at[260.0].reason
    # The factor is not restored on the tick that leaves PROTECT, only on the next one (its
    # own dwell ran while HBM cooled).
    assert at[260.0].factor == 0.75
    assert at[270.0].factor == pytest.approx(0.85) and at[270.0].level is ThermalLevel.DERATE


def test_protect_near_the_gpus_own_slowdown_threshold() -> None:
    d = step(initial_state(0.0), [gpu(87.5, slow=90.0)], 1.0, CFG)
    assert d.level is ThermalLevel.PROTECT
    assert "slowdown threshold 90.0" in d.reason
    # With a GPU whose slowdown is far off, the same core only derates.
    d2 = step(initial_state(0.0), [gpu(87.5, slow=100.0)], 1.0, CFG)
    assert d2.level is ThermalLevel.DERATE


def test_lost_gpu_protects_with_reason_until_it_is_back() -> None:
    lost = lost_sample(1, "GPU-abc", "H100", 0.0)
    trace = [(float(t), [gpu(60.0), lost]) for t in range(0, 300, 10)]
    decisions = run(trace)
    assert all(d.level is ThermalLevel.PROTECT for d in decisions)
    assert "gpu1 (GPU-abc) lost" in decisions[0].reason
    back = run(
        [(300.0 + t, [gpu(60.0), gpu(60.0, index=1)]) for t in range(0, 70, 10)],
        state=decisions[-1].state,
    )
    assert back[-1].level is not ThermalLevel.PROTECT


def test_no_samples_holds_state() -> None:
    state = step(initial_state(0.0), [gpu(90.0)], 0.0, CFG).state
    d = step(state, [], 500.0, CFG)
    assert d.state == state and not d.changed and "no GPU samples" in d.reason


def test_failed_reading_neither_triggers_nor_releases() -> None:
    state = step(initial_state(0.0), [gpu(90.0)], 0.0, CFG).state
    blind = gpu(None, invalid=("core_temp_c",))
    decisions = run([(float(t), [blind]) for t in range(10, 400, 10)], state=state)
    assert all(d.factor == 0.75 for d in decisions)
    assert all(d.level is ThermalLevel.DERATE for d in decisions)


def test_gpu_without_hbm_sensor_recovers() -> None:
    state = step(initial_state(0.0), [gpu(90.0)], 0.0, CFG).state
    decisions = run([(float(t), [gpu(60.0, None)]) for t in range(10, 400, 10)], state=state)
    assert decisions[6].factor == pytest.approx(0.85)  # at 70 s, 60 s after cooling began
    assert decisions[-1].level is ThermalLevel.NORMAL


def test_hottest_gpu_governs_recovery_too() -> None:
    state = step(initial_state(0.0), [gpu(90.0), gpu(90.0, index=1)], 0.0, CFG).state
    trace = [(float(t), [gpu(60.0), gpu(82.0, index=1)]) for t in range(10, 300, 10)]
    assert all(d.factor == 0.75 for d in run(trace, state=state))


def test_level_severity_for_the_gauge() -> None:
    assert [lv.severity for lv in ThermalLevel] == [0, 1, 2]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"step_factor": 1.0},
        {"step_factor": 0.0},
        {"floor_factor": 0.0},
        {"hysteresis_c": 0.0},
        {"dwell_s": -1.0},
        {"step_interval_s": 0.0},
        {"recover_step": 0.0},
        {"recover_step": 1.5},
    ],
)
def test_policy_config_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        ThermalPolicyConfig(**kwargs)


@pytest.mark.parametrize(
    ("energy", "tokens", "expected"),
    [(100.0, 50, 2.0), (0.0, 10, 0.0), (None, 10, None), (10.0, 0, None), (-5.0, 10, None)],
)
def test_energy_per_token(energy: float | None, tokens: int, expected: float | None) -> None:
    assert energy_per_token_j(energy, tokens) == expected


def test_energy_delta_matches_by_uuid_and_ignores_resets() -> None:
    before = [gpu(50.0, energy=1000.0), gpu(50.0, index=1, energy=500.0)]
    after = [gpu(50.0, energy=1250.0), gpu(50.0, index=1, energy=10.0)]  # gpu1 reset
    assert energy_delta_j(before, after) == 250.0
    assert energy_delta_j([], after) is None
    assert energy_delta_j([gpu(50.0)], [gpu(50.0)]) is None


# -- properties --------------------------------------------------------------------------

temps = st.floats(min_value=20.0, max_value=110.0, allow_nan=False)
gaps = st.floats(min_value=0.1, max_value=45.0, allow_nan=False)


def _build(parts: list[tuple[float, float | None, float | None, bool]]) -> list[GpuSample]:
    return [
        lost_sample(i, f"GPU-{i}", "x", 0.0) if lost else gpu(core, mem, slow=slow, index=i)
        for i, (core, mem, slow, lost) in enumerate(parts)
    ]


# One to three GPUs; now and then one of them is lost.
sample_sets = st.lists(
    st.tuples(
        temps,
        st.one_of(st.none(), temps),
        st.one_of(st.none(), st.floats(80.0, 100.0)),
        st.integers(0, 30).map(lambda n: n == 0),
    ),
    min_size=1,
    max_size=3,
).map(_build)


def traces(max_len: int = 30) -> st.SearchStrategy[list[tuple[float, list[GpuSample]]]]:
    """Random multi-GPU traces with increasing times."""

    def timed(steps: list[tuple[float, list[GpuSample]]]) -> list[tuple[float, list[GpuSample]]]:
        now, out = 0.0, []
        for gap, samples in steps:
            now += gap
            out.append((now, samples))
        return out

    return st.lists(st.tuples(gaps, sample_sets), max_size=max_len).map(timed)


def _reach(trace: list[tuple[float, list[GpuSample]]]) -> tuple[ThermalState, float]:
    if not trace:
        return initial_state(0.0), 0.0
    return run(trace)[-1].state, trace[-1][0]


# A state the policy can actually reach, and the time it was reached.
reachable = traces(max_len=12).map(_reach)


configs = st.builds(
    ThermalPolicyConfig,
    hysteresis_c=st.floats(0.5, 10.0),
    dwell_s=st.floats(0.0, 120.0),
    step_factor=st.floats(0.3, 0.95),
    floor_factor=st.floats(0.05, 1.0),
    step_interval_s=st.floats(1.0, 60.0),
    recover_step=st.floats(0.01, 1.0),
)


@settings(max_examples=150, deadline=None)
@given(cfg=configs, trace=traces(max_len=40))
def test_factor_stays_within_floor_and_one(
    cfg: ThermalPolicyConfig, trace: list[tuple[float, list[GpuSample]]]
) -> None:
    for d in run(trace, cfg=cfg):
        assert cfg.floor_factor - 1e-12 <= d.factor <= 1.0
        # The level tells the truth about the factor.
        if d.level is ThermalLevel.NORMAL:
            assert d.factor == 1.0
        if d.level is ThermalLevel.DERATE:
            assert d.factor < 1.0


@settings(max_examples=120, deadline=None)
@given(
    start=reachable,
    band_pos=st.floats(0.0, 0.999),
    steps=st.lists(gaps, min_size=1, max_size=40),
)
def test_steady_temperature_in_the_band_changes_nothing(
    start: tuple[ThermalState, float], band_pos: float, steps: list[float]
) -> None:
    state, now = start
    hyst = CFG.hysteresis_c
    if state.level is ThermalLevel.PROTECT:
        # Hold HBM steady inside the protect band; the core idles well below any threshold.
        samples = [gpu(50.0, CFG.protect_mem_c - hyst + band_pos * hyst)]
    elif state.level is ThermalLevel.DERATE:
        samples = [gpu(CFG.derate_core_c - hyst + band_pos * hyst)]
    else:
        samples = [gpu(20.0 + band_pos * (CFG.derate_core_c - 20.0))]
    for gap in steps:
        now += gap
        d = step(state, samples, now, CFG)
        assert d.level is state.level
        assert d.factor == state.factor
        assert not d.changed
        state = d.state


@settings(max_examples=120, deadline=None)
@given(
    start=reachable,
    rises=st.lists(st.tuples(gaps, st.floats(0.0, 3.0)), min_size=1, max_size=50),
    t0=st.floats(CFG.derate_core_c - CFG.hysteresis_c, 100.0),
)
def test_rising_temperature_never_raises_the_limit(
    start: tuple[ThermalState, float], rises: list[tuple[float, float]], t0: float
) -> None:
    """From any reachable state, a temperature at or above the release band that only rises
    never gets the factor back up (below the band, a cool GPU recovering is the point)."""
    state, now = start
    temp = t0
    last = state.factor
    for gap, rise in rises:
        now += gap
        temp += rise
        d = step(state, [gpu(temp, temp + 5.0)], now, CFG)
        assert d.factor <= last
        last, state = d.factor, d.state


@settings(max_examples=120, deadline=None)
@given(
    core=st.lists(st.tuples(gaps, st.floats(0.0, 4.0)), min_size=1, max_size=60),
    t0=temps,
)
def test_heating_from_normal_only_lowers_the_limit(
    core: list[tuple[float, float]], t0: float
) -> None:
    state, now, temp, last = initial_state(0.0), 0.0, t0, 1.0
    for gap, rise in core:
        now += gap
        temp += rise
        d = step(state, [gpu(temp, temp + 6.0, slow=92.0)], now, CFG)
        assert d.factor <= last
        last, state = d.factor, d.state


@settings(max_examples=120, deadline=None)
@given(
    trace=st.lists(st.tuples(gaps, temps, st.floats(0.0, 15.0)), min_size=1, max_size=60),
)
def test_a_hotter_trace_never_gets_a_higher_limit(
    trace: list[tuple[float, float, float]],
) -> None:
    """Pointwise hotter input -> pointwise lower-or-equal factor (monotone in temperature)."""
    cool_state = hot_state = initial_state(0.0)
    now = 0.0
    for gap, temp, extra in trace:
        now += gap
        cool_d = step(cool_state, [gpu(temp)], now, CFG)
        hot_d = step(hot_state, [gpu(temp + extra)], now, CFG)
        assert hot_d.factor <= cool_d.factor + 1e-12
        assert hot_d.level.severity >= cool_d.level.severity
        cool_state, hot_state = cool_d.state, hot_d.state


def _direction_changes(values: list[float]) -> int:
    signs = [math.copysign(1, b - a) for a, b in itertools.pairwise(values) if b != a]
    return sum(1 for a, b in itertools.pairwise(signs) if a != b)


unit_noise = st.one_of(st.sampled_from([-1.0, 1.0]), st.floats(-1.0, 1.0))


@settings(max_examples=150, deadline=None)
@given(
    start=reachable,
    core_offset=st.floats(-4.0, 4.0),
    mem_offset=st.one_of(st.none(), st.floats(-4.0, 4.0)),
    amplitude_frac=st.one_of(st.just(0.999), st.floats(0.0, 0.999)),
    noise=st.lists(st.tuples(gaps, unit_noise, unit_noise), max_size=50),
)
def test_no_oscillation_on_a_noisy_plateau(
    start: tuple[ThermalState, float],
    core_offset: float,
    mem_offset: float | None,
    amplitude_frac: float,
    noise: list[tuple[float, float, float]],
) -> None:
    """Noise narrower than the hysteresis band, centred near a threshold, moves the factor
    and the level one way only."""
    state, now = start
    amp = amplitude_frac * CFG.hysteresis_c / 2
    center = CFG.derate_core_c - CFG.hysteresis_c / 2 + core_offset
    factors = [state.factor]
    severities = [state.level.severity]
    for gap, n_core, n_mem in noise:
        now += gap
        mem = None
        if mem_offset is not None:
            mem = CFG.protect_mem_c - CFG.hysteresis_c / 2 + mem_offset + amp * n_mem
        d = step(state, [gpu(center + amp * n_core, mem, slow=95.0)], now, CFG)
        factors.append(d.factor)
        severities.append(d.level.severity)
        state = d.state
    assert _direction_changes(factors) == 0
    assert _direction_changes([float(s) for s in severities]) == 0


def test_thermal_config_mirrors_the_policy() -> None:
    from pydantic import ValidationError

    from appliance.config.telemetry import ThermalConfig

    assert ThermalConfig().to_policy() == ThermalPolicyConfig()
    custom = ThermalConfig(derate_core_c=80, hysteresis_c=3, recover_step=0.2).to_policy()
    assert (custom.derate_core_c, custom.hysteresis_c, custom.recover_step) == (80, 3, 0.2)
    assert set(ThermalConfig.model_fields) == set(ThermalPolicyConfig.__dataclass_fields__)
    with pytest.raises(ValidationError, match="step_factor"):
        ThermalConfig(step_factor=1.0)
    with pytest.raises(ValidationError, match="extra_forbidden"):
        ThermalConfig.model_validate({"derate_c": 80})
