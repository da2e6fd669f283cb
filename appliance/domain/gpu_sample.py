"""One GPU reading (frozen, units in names) and the Telemetry port that produces them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

# Names used in GpuSample.throttle_reasons, one per NVML clocks-event reason bit.
THROTTLE_REASON_NAMES: tuple[str, ...] = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
    "board_limit",
    "reliability",
)


@dataclass(frozen=True)
class GpuSample:
    """A reading of one GPU; a measurement is None where the device did not report it.

    `unsupported` names fields the device does not support (they stay None for good);
    `invalid` names fields whose reading failed or was implausible in this sample.
    """

    index: int
    uuid: str
    name: str
    simulated: bool
    # When the reading was taken, in seconds on the source's clock (Unix time for NVML
    # and replay, the injected clock for the simulator). The policy uses its own now_s.
    timestamp_s: float
    core_temp_c: float | None = None
    mem_temp_c: float | None = None
    slowdown_temp_c: float | None = None
    shutdown_temp_c: float | None = None
    mem_max_temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    # Cumulative energy counter (NVML: since the driver loaded; sim/replay: since start).
    energy_j: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    gpu_util_pct: float | None = None
    mem_bw_util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    pcie_tx_kb_s: float | None = None
    pcie_rx_kb_s: float | None = None
    nvlink_active: int | None = None
    # NVLink data over every link (KiB/s) across the last sampling interval, and the busier
    # direction as a share of what the active links carry; None until two readings exist.
    nvlink_tx_kb_s: float | None = None
    nvlink_rx_kb_s: float | None = None
    nvlink_util_pct: float | None = None
    throttle_reasons: tuple[str, ...] = ()
    # ECC error counts: volatile since the last driver load, aggregate over the board's life.
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_aggregate: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    # Critical Xid events seen since the adapter opened.
    xid_errors: int | None = None
    lost: bool = False
    unsupported: tuple[str, ...] = ()
    invalid: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """Short name for logs and reasons, e.g. `gpu0`."""
        return f"gpu{self.index}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field (tuples become lists)."""
        out = dataclasses.asdict(self)
        for key in ("throttle_reasons", "unsupported", "invalid"):
            out[key] = list(out[key])
        return out


def lost_sample(
    index: int, uuid: str, name: str, timestamp_s: float, *, simulated: bool = False
) -> GpuSample:
    """The sample of a GPU that has fallen off the bus: identity only, lost=True."""
    return GpuSample(
        index=index, uuid=uuid, name=name, simulated=simulated, timestamp_s=timestamp_s, lost=True
    )


MEASUREMENT_FIELDS: tuple[str, ...] = tuple(
    f.name
    for f in dataclasses.fields(GpuSample)
    if f.name
    not in {"index", "uuid", "name", "simulated", "timestamp_s", "lost", "unsupported", "invalid"}
)


@runtime_checkable
class Telemetry(Protocol):
    """Port: a source of GPU samples (NVML, simulator, replay, test double)."""

    name: str
    simulated: bool

    def sample(self) -> list[GpuSample]:
        """Read every GPU once; blocking, so callers run it off the event loop."""
        ...
