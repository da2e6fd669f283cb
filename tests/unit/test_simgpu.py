"""Simulated GPU: the thermal model against its closed form, faults, and the policy on top."""

from __future__ import annotations

import math

import pytest

from appliance.adapters.simgpu import SimGpu
from appliance.config.telemetry import SimConfig, SimFaultConfig
from appliance.domain.thermal import ThermalLevel, ThermalPolicyConfig, initial_state, step


class FakeClock:
    """Monotonic seconds that only move when the test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, dt: float) -> None:
        self.now += dt


def make(cfg: SimConfig | None = None, load: float = 1.0) -> tuple[SimGpu, FakeClock, list[float]]:
    clock = FakeClock()
    level = [load]
    sim = SimGpu(cfg or SimConfig(), load_fn=lambda: level[0], clock=clock)
    sim.sample()  # the load takes effect from here
    return sim, clock, level


def run_until(sim: SimGpu, clock: FakeClock, pred, limit_s: float, dt: float = 1.0):  # type: ignore[no-untyped-def]
    """Step simulated time until pred(sample) holds; the elapsed seconds, or None."""
    elapsed = 0.0
    while elapsed < limit_s:
        clock.advance(dt)
        elapsed += dt
        s = sim.sample()[0]
        if pred(s):
            return elapsed
    return None


def test_samples_say_simulated() -> None:
    sim, _, _ = make(SimConfig(gpu_count=2))
    samples = sim.sample()
    assert [s.index for s in samples] == [0, 1]
    assert all(s.simulated and "SIMULATED" in s.name for s in samples)
    assert len({s.uuid for s in samples}) == 2
    assert sim.simulated is True and sim.name == "sim"


def test_starts_at_idle_equilibrium() -> None:
    c = SimConfig()
    sim = SimGpu(c, clock=FakeClock())
    assert sim.sample()[0].core_temp_c == pytest.approx(
        c.ambient_c + c.thermal_resistance_c_per_w * c.idle_power_w
    )


def test_matches_the_first_order_closed_form_under_full_load() -> None:
    c = SimConfig()
    sim, clock, _ = make(c)
    t0 = c.ambient_c + c.thermal_resistance_c_per_w * c.idle_power_w
    t_eq = c.ambient_c + c.thermal_resistance_c_per_w * c.max_power_w
    for k in range(1, 181):
        clock.advance(1.0)
        s = sim.sample()[0]
        expected = t_eq - (t_eq - t0) * math.exp(-k / c.time_constant_s)
        assert s.core_temp_c == pytest.approx(expected, abs=2e-3)
    assert s.power_w == c.max_power_w
    assert s.mem_temp_c == pytest.approx(s.core_temp_c + c.mem_temp_offset_c)


def test_default_full_load_stays_under_85_but_a_hot_room_crosses_it() -> None:
    sim, clock, _ = make()
    assert run_until(sim, clock, lambda s: s.core_temp_c >= 85.0, limit_s=3600) is None
    assert sim.sample()[0].core_temp_c == pytest.approx(81.0, abs=0.1)  # 25 + 0.08 * 700

    hot, hclock, _ = make(SimConfig(faults=(SimFaultConfig(name="hot_room", delta_c=10.0),)))
    crossed = run_until(hot, hclock, lambda s: s.core_temp_c >= 85.0, limit_s=3600)
    # Closed form: 60 s * ln((91 - 30.6) / (91 - 85)) = 138.5 s.
    assert crossed is not None and 130 <= crossed <= 145


def test_cools_back_after_the_fault_is_cleared() -> None:
    sim, clock, level = make()
    sim.set_fault("hot_room", delta_c=12.0)
    assert run_until(sim, clock, lambda s: s.core_temp_c >= 85.0, limit_s=1200) is not None
    sim.clear_faults()
    level[0] = 0.0
    cooled = run_until(sim, clock, lambda s: s.core_temp_c < 40.0, limit_s=1200)
    assert cooled is not None and cooled < 400
    s = sim.sample()[0]
    assert s.power_w == SimConfig().idle_power_w
    assert s.throttle_reasons == ("gpu_idle",)


def test_failed_fan_raises_resistance_and_time_constant() -> None:
    c = SimConfig()
    sim, clock, _ = make(c)
    sim.set_fault("failed_fan", factor=2.0)
    t0 = sim.sample()[0].core_temp_c
    clock.advance(30.0)
    got = sim.sample()[0].core_temp_c
    r, tau = 2 * c.thermal_resistance_c_per_w, 2 * c.time_constant_s
    t_eq = c.ambient_c + r * c.max_power_w
    assert got == pytest.approx(t_eq - (t_eq - t0) * math.exp(-30.0 / tau), abs=2e-3)
    assert run_until(sim, clock, lambda s: s.core_temp_c >= 85.0, limit_s=1200) is not None


def test_throttles_past_slowdown_like_hardware() -> None:
    sim, clock, _ = make()
    sim.set_fault("failed_fan", factor=3.0)
    assert run_until(sim, clock, lambda s: s.core_temp_c >= 90.0, limit_s=3600) is not None
    clock.advance(1.0)
    s = sim.sample()[0]
    assert "hw_thermal_slowdown" in s.throttle_reasons
    assert s.power_w < SimConfig().max_power_w
    assert s.sm_clock_mhz is not None and s.sm_clock_mhz < 1980


def test_hbm_hot_fault_moves_only_the_memory_temperature() -> None:
    sim, clock, _ = make()
    clock.advance(10.0)
    before = sim.sample()[0]
    sim.set_fault("hbm_hot", delta_c=15.0)
    after = sim.sample()[0]
    assert after.core_temp_c == before.core_temp_c
    assert after.mem_temp_c == pytest.approx(before.mem_temp_c + 15.0)


def test_lost_gpu_fault_on_one_gpu_then_cleared() -> None:
    sim, _, _ = make(SimConfig(gpu_count=2))
    sim.set_fault("lost_gpu", gpu=1)
    a, b = sim.sample()
    assert not a.lost and a.core_temp_c is not None
    assert b.lost and b.core_temp_c is None and b.simulated
    assert sim.active_faults()[0]["name"] == "lost_gpu"
    assert sim.clear_faults(name="lost_gpu") == 1
    assert not any(s.lost for s in sim.sample())
    assert sim.active_faults() == []


def test_ecc_storm_counts_corrected_errors_and_an_uncorrected_one_each_minute() -> None:
    sim, clock, _ = make(SimConfig(gpu_count=2))
    s = sim.sample()[0]
    assert (s.ecc_corrected_volatile, s.ecc_uncorrected_volatile, s.xid_errors) == (0, 0, 0)
    sim.set_fault("ecc_storm", gpu=0, factor=3.0, duration_s=150)
    clock.advance(30)
    a, b = sim.sample()
    # 3 corrected a second; one uncorrected at once, with the Xid 48 it raises.
    assert (a.ecc_corrected_volatile, a.ecc_uncorrected_volatile, a.xid_errors) == (90, 1, 1)
    assert (a.ecc_corrected_aggregate, a.ecc_uncorrected_aggregate) == (90, 1)
    assert (b.ecc_corrected_volatile, b.xid_errors) == (0, 0)  # the other GPU is healthy
    clock.advance(130)  # past the fault's end at 150 s: what it did before the end counts
    a = sim.sample()[0]
    assert (a.ecc_corrected_volatile, a.ecc_uncorrected_volatile, a.xid_errors) == (450, 3, 3)
    clock.advance(600)
    a = sim.sample()[0]
    assert (a.ecc_corrected_volatile, a.ecc_uncorrected_volatile, a.xid_errors) == (450, 3, 3)


def test_xid_fault_raises_an_event_each_minute_and_clearing_keeps_the_count() -> None:
    sim, clock, _ = make()
    sim.set_fault("xid")
    assert sim.sample()[0].xid_errors == 1
    clock.advance(59)
    assert sim.sample()[0].xid_errors == 1
    clock.advance(1)
    assert sim.sample()[0].xid_errors == 2
    sim.clear_faults("xid")
    clock.advance(300)
    s = sim.sample()[0]
    assert s.xid_errors == 2 and s.ecc_uncorrected_volatile == 0


@pytest.mark.parametrize(("gpus", "util_pct"), [(1, 0.0), (2, 45.0)])
def test_nvlink_carries_tensor_parallel_traffic_only(gpus: int, util_pct: float) -> None:
    s = make(SimConfig(gpu_count=gpus), load=1.0)[0].sample()[0]
    assert s.nvlink_active == 18 and s.nvlink_util_pct == util_pct
    kb_s = util_pct / 100 * 18 * 25e9 / 1024  # 18 links at 25 GB/s each way
    assert s.nvlink_tx_kb_s == s.nvlink_rx_kb_s == pytest.approx(kb_s, abs=0.1)
    assert s.mem_bw_util_pct == 70.0 and s.pcie_rx_kb_s == 8000.0


def test_scripted_fault_from_config_has_a_window() -> None:
    cfg = SimConfig(faults=(SimFaultConfig(name="hot_room", start_s=100, duration_s=50),))
    clock = FakeClock()
    sim = SimGpu(cfg, load_fn=lambda: 0.0, clock=clock)
    assert sim.active_faults() == []
    clock.advance(120)
    (fault,) = sim.active_faults()
    assert fault["scripted"] and fault["remaining_s"] == pytest.approx(30)
    clock.advance(40)
    sim.sample()
    assert sim.active_faults() == []


def test_setting_a_fault_twice_replaces_it() -> None:
    sim, _, _ = make()
    sim.set_fault("hot_room", delta_c=5.0)
    sim.set_fault("hot_room", delta_c=20.0)
    (fault,) = sim.active_faults()
    assert fault["delta_c"] == 20.0


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [(("no_such_fault",), {}), (("hot_room", 3), {}), (("failed_fan",), {"factor": 0.5})],
)
def test_bad_faults_are_refused(args: tuple, kwargs: dict) -> None:  # type: ignore[type-arg]
    sim, _, _ = make()
    with pytest.raises(ValueError):
        sim.set_fault(*args, **kwargs)


def test_energy_is_integrated_power() -> None:
    sim, clock, level = make()
    e0 = sim.sample()[0].energy_j
    for _ in range(100):
        clock.advance(1.0)
        sim.sample()
    assert sim.sample()[0].energy_j - e0 == pytest.approx(700.0 * 100, rel=1e-9)
    level[0] = 0.0
    clock.advance(10.0)
    e1 = sim.sample()[0].energy_j
    clock.advance(10.0)
    assert sim.sample()[0].energy_j - e1 == pytest.approx(70.0 * 10)


def test_load_fn_is_clamped_and_its_failures_do_not_stop_sampling() -> None:
    clock = FakeClock()
    values = iter([2.0, float("nan")])

    def load() -> float:
        try:
            return next(values)
        except StopIteration:
            raise RuntimeError("engine gone") from None

    sim = SimGpu(SimConfig(), load_fn=load, clock=clock)
    assert sim.sample()[0].gpu_util_pct == 100.0  # 2.0 clamped to 1
    assert sim.sample()[0].gpu_util_pct == 100.0  # NaN: last load kept
    assert sim.sample()[0].gpu_util_pct == 100.0  # raising: last load kept
    sim.set_load_fn(lambda: 0.5)
    assert sim.sample()[0].gpu_util_pct == 50.0


def test_noise_is_seeded() -> None:
    a = SimGpu(SimConfig(noise_c=0.5, seed=7), clock=FakeClock())
    b = SimGpu(SimConfig(noise_c=0.5, seed=7), clock=FakeClock())
    assert [a.sample()[0].core_temp_c for _ in range(5)] == [
        b.sample()[0].core_temp_c for _ in range(5)
    ]


def test_closed_loop_derates_settles_and_recovers() -> None:
    """Policy on the sim with load = derate factor: a hot room is held near 85 °C on a
    steady factor (no limit cycle), and the factor returns to 1 once the room is fixed."""
    cfg = ThermalPolicyConfig()
    clock = FakeClock()
    state = initial_state(clock())
    sim = SimGpu(SimConfig(), load_fn=lambda: state.factor, clock=clock)
    sim.set_fault("hot_room", delta_c=10.0)
    peak, derated_s, changes, last_change_s = 0.0, 0.0, 0, 0.0
    for k in range(1800):
        clock.advance(1.0)
        samples = sim.sample()
        d = step(state, samples, clock(), cfg)
        state = d.state
        peak = max(peak, samples[0].core_temp_c or 0.0)
        derated_s += 1.0 if d.level is not ThermalLevel.NORMAL else 0.0
        if d.changed:
            changes, last_change_s = changes + 1, float(k)
    assert peak - cfg.derate_core_c < 1.0  # overshoot above 85 °C
    assert derated_s > 1200
    assert changes <= 4 and last_change_s < 600  # settles within 10 min, then holds
    assert 0.75 <= state.factor < 1.0
    sim.clear_faults()
    for _ in range(600):
        clock.advance(1.0)
        state = step(state, sim.sample(), clock(), cfg).state
    assert state.level is ThermalLevel.NORMAL and state.factor == 1.0
