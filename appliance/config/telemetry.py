"""Config sections `telemetry:` and `thermal:` (frozen pydantic models, unknown keys rejected)."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, model_validator

from appliance.config.section import Section, SectionProblems, policy_problems
from appliance.domain.limits import InvariantError
from appliance.domain.thermal import ThermalPolicyConfig

FaultName = Literal["hot_room", "failed_fan", "lost_gpu", "hbm_hot", "ecc_storm", "xid"]
FAULT_NAMES: tuple[str, ...] = get_args(FaultName)


class SimFaultConfig(Section):
    """One scripted fault of the simulated GPU(s)."""

    # hot_room: ambient + delta_c; failed_fan: thermal resistance x factor;
    # hbm_hot: HBM + delta_c over the core; lost_gpu: the GPU stops answering;
    # ecc_storm: corrected ECC errors at factor/s, an uncorrected one (Xid 48) each minute;
    # xid: an Xid 31 event each minute.
    name: FaultName
    gpu: int | None = Field(None, ge=0, le=63)  # None: every simulated GPU
    start_s: float = Field(0.0, ge=0, le=30 * 86400)  # after the simulator starts
    duration_s: float | None = Field(None, gt=0, le=30 * 86400)  # None: until cleared
    delta_c: float = Field(10.0, ge=0, le=100)
    factor: float = Field(2.0, ge=1, le=20)


class SimConfig(Section):
    """First-order thermal model: dT/dt = (ambient + R * P - T) / tau."""

    gpu_count: int = Field(1, ge=1, le=64)
    name: str = Field("Simulated GPU", min_length=1, max_length=96)
    ambient_c: float = Field(25.0, ge=-20, le=70)
    # At full load 25 + 0.08 * 700 = 81 °C: busy but under the derate line; a hot room
    # (+10 °C) or a failed fan pushes it over, which is what the faults demonstrate.
    thermal_resistance_c_per_w: float = Field(0.08, gt=0, le=2)
    time_constant_s: float = Field(60.0, gt=0, le=3600)
    idle_power_w: float = Field(70.0, ge=0, le=5000)
    max_power_w: float = Field(700.0, gt=0, le=5000)
    mem_temp_offset_c: float = Field(6.0, ge=-30, le=60)
    slowdown_temp_c: float = Field(90.0, gt=0, le=200)
    shutdown_temp_c: float = Field(95.0, gt=0, le=200)
    mem_max_temp_c: float = Field(95.0, gt=0, le=200)
    mem_total_gib: float = Field(80.0, gt=0, le=4096)
    # Gaussian noise on reported temperatures (not on the model state); 0 = exact.
    noise_c: float = Field(0.0, ge=0, le=10)
    seed: int = 0
    faults: tuple[SimFaultConfig, ...] = ()

    @model_validator(mode="after")
    def _order(self) -> SimConfig:
        if self.max_power_w < self.idle_power_w:
            raise ValueError(f"max_power_w must be >= idle_power_w ({self.idle_power_w})")
        if self.shutdown_temp_c < self.slowdown_temp_c:
            raise ValueError(f"shutdown_temp_c must be >= slowdown_temp_c ({self.slowdown_temp_c})")
        for f in self.faults:
            if f.gpu is not None and f.gpu >= self.gpu_count:
                raise ValueError(f"faults: gpu {f.gpu} does not exist (gpu_count {self.gpu_count})")
        return self


class ReplayConfig(Section):
    """A recorded `nvidia-smi --query-gpu=... --format=csv` trace."""

    path: str | None = None
    # timestamps: follow the recorded times x speed; step: one recorded poll per sample().
    mode: Literal["timestamps", "step"] = "timestamps"
    speed: float = Field(1.0, gt=0, le=10_000)
    loop: bool = True


class TelemetryConfig(Section):
    """Where GPU samples come from and how often."""

    # auto: NVML when it initialises and sees a GPU, else the simulator.
    source: Literal["auto", "nvml", "sim", "replay"] = "auto"
    interval_s: float = Field(1.0, gt=0, le=3600)
    # nvmlDeviceGetPcieThroughput blocks ~20 ms per counter, so it is read this rarely
    # (0 = never); other fields are read every sample.
    pcie_throughput_interval_s: float = Field(10.0, ge=0, le=86400)
    sim: SimConfig = SimConfig()
    replay: ReplayConfig = ReplayConfig()

    @model_validator(mode="after")
    def _replay_path(self) -> TelemetryConfig:
        if self.source == "replay" and not self.replay.path:
            raise ValueError("replay.path is required when source is 'replay'")
        return self


_D = ThermalPolicyConfig()


class ThermalConfig(Section):
    """Thermal derating thresholds; `to_policy()` gives the pure policy's config."""

    # What the policy needs of these numbers (factors in (0, 1], positive hysteresis and
    # intervals...) is the policy's own (ThermalPolicyConfig), checked by _valid_policy; the
    # bounds here are what a config file may say on top (a sane temperature, at most a day).
    derate_core_c: float = Field(_D.derate_core_c, ge=30, le=130)
    protect_mem_c: float = Field(_D.protect_mem_c, ge=30, le=150)
    protect_slowdown_margin_c: float = Field(_D.protect_slowdown_margin_c, le=50)
    hysteresis_c: float = Field(_D.hysteresis_c, le=30)
    dwell_s: float = Field(_D.dwell_s, le=86400)
    step_factor: float = _D.step_factor
    floor_factor: float = _D.floor_factor
    step_interval_s: float = Field(_D.step_interval_s, le=86400)
    # Additive recovery per dwell_s (cuts are multiplicative): see appliance.domain.thermal.
    recover_step: float = _D.recover_step

    @model_validator(mode="after")
    def _valid_policy(self) -> ThermalConfig:
        try:
            self.to_policy()
        except InvariantError as exc:
            # The policy's fields are this section's keys, one for one.
            raise SectionProblems(policy_problems(exc, {})) from None
        return self

    def to_policy(self) -> ThermalPolicyConfig:
        """The same numbers as the pure policy's frozen dataclass."""
        return ThermalPolicyConfig(**self.model_dump())
