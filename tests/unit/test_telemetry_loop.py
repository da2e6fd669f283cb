"""Telemetry loop on the event loop: the simulated GPU heats, derates, cools and recovers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from appliance.adapters.nvml import NvmlTelemetry
from appliance.adapters.replay import ReplayTelemetry
from appliance.adapters.simgpu import SimGpu
from appliance.config.telemetry import ReplayConfig, SimConfig, TelemetryConfig
from appliance.domain.gpu_sample import GpuSample, Telemetry
from appliance.domain.thermal import ThermalDecision, ThermalLevel, ThermalPolicyConfig
from appliance.services.telemetry_loop import TelemetryLoop, build_telemetry, hottest

TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "h100_heat_soak.csv"


def fast_clock(rate: float) -> Callable[[], float]:
    """Monotonic seconds running `rate` times faster than real time."""
    t0 = time.monotonic()
    return lambda: t0 + (time.monotonic() - t0) * rate


async def wait_for(pred: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


async def test_sim_heats_derates_cools_and_recovers() -> None:
    clock = fast_clock(200.0)  # 1 s real = 200 s simulated
    cfg = ThermalPolicyConfig(dwell_s=30.0, step_interval_s=15.0)
    load = [1.0]
    sim = SimGpu(SimConfig(), load_fn=lambda: load[0], clock=clock)
    sim.set_fault("hot_room", delta_c=15.0)
    seen: list[list[GpuSample]] = []
    decisions: list[ThermalDecision] = []
    loop = TelemetryLoop(sim, cfg, 0.02, seen.append, decisions.append, clock=clock)
    async with loop:
        assert loop.running and len(seen) == 1  # the first sample is taken at start
        await wait_for(lambda: loop.thermal_state.level is not ThermalLevel.NORMAL, 10.0)
        assert loop.thermal_state.factor < 1.0
        hot = loop.latest_samples[0]
        assert hot.simulated and hot.core_temp_c is not None and hot.core_temp_c >= 85.0
        sim.clear_faults()
        load[0] = 0.2
        await wait_for(lambda: loop.thermal_state.level is ThermalLevel.NORMAL, 15.0)
    assert not loop.running
    assert loop.thermal_state.factor == 1.0
    changed = [d for d in decisions if d.changed]
    assert changed[0].level is ThermalLevel.DERATE and "gpu0 core" in changed[0].reason
    assert changed[-1].level is ThermalLevel.NORMAL
    assert len(decisions) == len(seen) == loop.samples_taken
    assert loop.energy_total_j > 0 and loop.errors == 0
    count = loop.samples_taken
    await asyncio.sleep(0.1)
    assert loop.samples_taken == count  # stopped means stopped


class Flaky:
    """Telemetry that fails every other call."""

    name = "flaky"
    simulated = True

    def __init__(self) -> None:
        self.calls = 0

    def sample(self) -> list[GpuSample]:
        self.calls += 1
        if self.calls % 2 == 0:
            raise RuntimeError("bus error")
        return [GpuSample(0, "GPU-f", "flaky", True, time.time(), core_temp_c=60.0)]


async def test_survives_failing_samples_and_callbacks() -> None:
    flaky = Flaky()
    assert isinstance(flaky, Telemetry)

    def bad_callback(_: object) -> None:
        raise ValueError("consumer bug")

    loop = TelemetryLoop(flaky, ThermalPolicyConfig(), 0.01, bad_callback, bad_callback)
    await loop.start()
    await wait_for(lambda: flaky.calls >= 8, 5.0)
    await loop.stop()
    assert loop.errors >= 3 and "bus error" in (loop.last_error or "")
    assert loop.samples_taken >= 4
    assert loop.latest_decision is not None and loop.latest_samples[0].core_temp_c == 60.0
    await loop.stop()  # twice is fine


async def test_policy_failure_holds_state_and_carries_on() -> None:
    sim = SimGpu(SimConfig())
    loop = TelemetryLoop(sim, ThermalPolicyConfig(), 0.01)
    before = loop.thermal_state
    loop.policy_cfg = None  # type: ignore[assignment]  # a broken policy config
    assert await loop.tick() is None
    assert loop.thermal_state == before and loop.errors == 1
    loop.policy_cfg = ThermalPolicyConfig()
    assert await loop.tick() is not None


async def test_lost_simulated_gpu_protects() -> None:
    sim = SimGpu(SimConfig(gpu_count=2))
    loop = TelemetryLoop(sim, ThermalPolicyConfig(), 0.01)
    sim.set_fault("lost_gpu", gpu=1)
    d = await loop.tick()
    assert d is not None and d.level is ThermalLevel.PROTECT and "gpu1" in d.reason
    assert loop.any_lost
    assert hottest(loop.latest_samples) is loop.latest_samples[0]


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        TelemetryLoop(SimGpu(), ThermalPolicyConfig(), 0.0)


def test_build_telemetry_picks_the_adapter() -> None:
    assert isinstance(build_telemetry(TelemetryConfig(source="sim")), SimGpu)
    replay = build_telemetry(
        TelemetryConfig(source="replay", replay=ReplayConfig(path=str(TRACE), mode="step"))
    )
    assert isinstance(replay, ReplayTelemetry) and replay.mode == "step"
    explicit = build_telemetry(TelemetryConfig(source="nvml"))
    assert isinstance(explicit, NvmlTelemetry)
    explicit.close()


def test_auto_falls_back_to_the_simulator_without_nvml() -> None:
    """Real path on this GPU-less machine: NVML does not initialise, the sim takes over."""
    probe = NvmlTelemetry()
    available = probe.available and probe.gpu_count > 0
    probe.close()
    if available:
        pytest.skip("this machine has a working NVIDIA GPU")
    load = [0.7]
    t = build_telemetry(TelemetryConfig(source="auto"), load_fn=lambda: load[0])
    assert isinstance(t, SimGpu) and t.simulated
    assert t.sample()[0].gpu_util_pct == 70.0


def test_config_validation_names_the_bad_key() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="interval_s"):
        TelemetryConfig(interval_s=0)
    with pytest.raises(ValidationError, match=r"replay\.path is required"):
        TelemetryConfig(source="replay")
    with pytest.raises(ValidationError, match="extra_forbidden"):
        TelemetryConfig.model_validate({"sim": {"ambient": 30}})
    with pytest.raises(ValidationError, match="max_power_w"):
        SimConfig(idle_power_w=800, max_power_w=700)
    with pytest.raises(ValidationError, match="gpu 2 does not exist"):
        SimConfig.model_validate({"gpu_count": 2, "faults": [{"name": "lost_gpu", "gpu": 2}]})
    with pytest.raises(ValidationError, match="name"):
        SimConfig.model_validate({"faults": [{"name": "meteor"}]})
    cfg = TelemetryConfig.model_validate(
        {"source": "sim", "sim": {"faults": [{"name": "hot_room", "delta_c": 12}]}}
    )
    sim = build_telemetry(cfg)
    assert isinstance(sim, SimGpu) and sim.active_faults()[0]["delta_c"] == 12
