"""Simulated GPU(s): a first-order thermal model driven by the engine's real load, with faults.

Per GPU: power P = idle + (max - idle) * load; temperature T follows
dT/dt = (ambient + R * P - T) / tau, integrated exactly over each interval between samples;
energy is the integral of P. HBM reads core + offset. The thermal capacitance C = tau / R is
held fixed, so a failed fan (R x k) also slows the response (tau x k), as on real hardware.

The health counters move only with faults: `ecc_storm` adds corrected ECC errors at `factor`
a second and an uncorrected one (with its Xid 48) at the start and each minute after; `xid`
raises one Xid 31 event at the start and each minute after. Counters never go back when a fault
is cleared, as NVML's do not. NVLink carries tensor-parallel traffic, so it is busy only when
more than one GPU is simulated.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from appliance.config.telemetry import SimConfig, SimFaultConfig
from appliance.domain.gpu_sample import GpuSample, lost_sample

log = logging.getLogger(__name__)

_BOOST_SM_MHZ = 1980
_IDLE_SM_MHZ = 345
_MEM_MHZ = 2619
# Past the slowdown threshold real GPUs cut clocks and with them power; modelling that keeps
# the simulated core from running away past the threshold, as hardware does.
_SLOWDOWN_SCALE = 0.7
# An SXM board of the H100 kind: 18 NVLink 4 links, 25 GB/s each way per link.
_NVLINK_LINKS = 18
_NVLINK_LINK_B_S = 25e9
# Share of the links' capacity tensor-parallel all-reduces use at full load.
_TP_NVLINK_SHARE = 0.45
# Faults that raise events repeat them this often while they last.
_EVENT_EVERY_S = 60.0
_XID_DOUBLE_BIT_ECC = 48
_XID_PAGE_FAULT = 31  # the `xid` fault's code: an MMU fault, the commonest on a serving box


@dataclass
class _Fault:
    name: str
    gpu: int | None
    start_s: float
    end_s: float | None
    delta_c: float
    factor: float
    scripted: bool
    fired: dict[int, int] = field(default_factory=dict)  # events raised so far, per GPU

    def active(self, gpu: int, now_s: float) -> bool:
        return (
            (self.gpu is None or self.gpu == gpu)
            and now_s >= self.start_s
            and (self.end_s is None or now_s < self.end_s)
        )

    def overlap_s(self, gpu: int, from_s: float, to_s: float) -> float:
        """How long, of the interval [from_s, to_s], this fault held on `gpu`."""
        if self.gpu is not None and self.gpu != gpu:
            return 0.0
        end = to_s if self.end_s is None else min(to_s, self.end_s)
        return max(0.0, end - max(from_s, self.start_s))

    def new_events(self, gpu: int, now_s: float) -> int:
        """Events due by now_s (one at the start, then one each _EVENT_EVERY_S) not yet raised."""
        if (self.gpu is not None and self.gpu != gpu) or now_s < self.start_s:
            return 0
        until = now_s if self.end_s is None else min(now_s, self.end_s)
        due = 1 + int((until - self.start_s) // _EVENT_EVERY_S)
        new = due - self.fired.get(gpu, 0)
        self.fired[gpu] = due
        return max(0, new)


@dataclass
class _GpuState:
    temp_c: float
    power_w: float
    energy_j: float
    last_s: float
    ecc_corrected: float = 0.0
    ecc_uncorrected: int = 0
    xid_errors: int = 0


@dataclass(frozen=True)
class _Effective:
    ambient_c: float
    resistance_c_per_w: float
    time_constant_s: float
    mem_offset_c: float
    lost: bool


class SimGpu:
    """Telemetry adapter for machines without a GPU; samples carry simulated=True."""

    name = "sim"
    simulated = True

    def __init__(
        self,
        cfg: SimConfig | None = None,
        load_fn: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cfg = cfg if cfg is not None else SimConfig()
        self._load_fn: Callable[[], float] = load_fn if load_fn is not None else _no_load
        self._clock = clock
        self._lock = threading.Lock()
        self._rng = random.Random(self._cfg.seed)
        self._load_warned = False
        self._last_load = 0.0
        self.started_s = clock()
        c = self._cfg
        idle_eq_c = c.ambient_c + c.thermal_resistance_c_per_w * c.idle_power_w
        self._gpus = [
            _GpuState(temp_c=idle_eq_c, power_w=c.idle_power_w, energy_j=0.0, last_s=self.started_s)
            for _ in range(c.gpu_count)
        ]
        self._faults: list[_Fault] = [
            self._make_fault(f, self.started_s + f.start_s, scripted=True) for f in c.faults
        ]

    @property
    def gpu_count(self) -> int:
        """How many GPUs are simulated."""
        return len(self._gpus)

    def set_load_fn(self, load_fn: Callable[[], float]) -> None:
        """Feed the model from `load_fn` (0..1) from now on, e.g. once the engine exists."""
        self._load_fn = load_fn

    def set_fault(
        self,
        name: str,
        gpu: int | None = None,
        *,
        delta_c: float = 10.0,
        factor: float = 2.0,
        duration_s: float | None = None,
    ) -> None:
        """Start fault `name` now (one of FAULT_NAMES); raises ValueError."""
        spec = SimFaultConfig(
            name=name, gpu=gpu, delta_c=delta_c, factor=factor, duration_s=duration_s
        )
        if gpu is not None and gpu >= self.gpu_count:
            raise ValueError(f"gpu {gpu} does not exist (gpu_count {self.gpu_count})")
        with self._lock:
            now = self._clock()
            # Setting a fault again replaces it rather than stacking a second copy.
            self._faults = [f for f in self._faults if (f.name, f.gpu) != (name, gpu)]
            self._faults.append(self._make_fault(spec, now, scripted=False))
        log.warning("simulated fault set: %s gpu=%s", name, "all" if gpu is None else gpu)

    def clear_faults(self, name: str | None = None, gpu: int | None = None) -> int:
        """Remove faults (all, or those matching name and/or gpu); returns how many."""
        with self._lock:
            keep = [
                f
                for f in self._faults
                if not ((name is None or f.name == name) and (gpu is None or f.gpu == gpu))
            ]
            removed = len(self._faults) - len(keep)
            self._faults = keep
        if removed:
            log.warning("simulated faults cleared: %d", removed)
        return removed

    def active_faults(self) -> list[dict[str, Any]]:
        """Faults in force now, for status views."""
        with self._lock:
            now = self._clock()
            return [
                {
                    "name": f.name,
                    "gpu": f.gpu,
                    "delta_c": f.delta_c,
                    "factor": f.factor,
                    "scripted": f.scripted,
                    "remaining_s": None if f.end_s is None else max(0.0, f.end_s - now),
                }
                for f in self._faults
                if any(f.active(i, now) for i in range(self.gpu_count))
            ]

    def sample(self) -> list[GpuSample]:
        """Advance the model to the clock's now and read every simulated GPU."""
        with self._lock:
            now = self._clock()
            load = self._read_load()
            out = [self._advance(i, g, now, load) for i, g in enumerate(self._gpus)]
            # Dropped only now, so the errors an ended fault raised before its end still count.
            self._faults = [f for f in self._faults if f.end_s is None or f.end_s > now]
            return out

    def close(self) -> None:
        """Nothing to release; present for symmetry with the NVML adapter."""

    # -- internals --------------------------------------------------------------------

    @staticmethod
    def _make_fault(spec: SimFaultConfig, start_s: float, *, scripted: bool) -> _Fault:
        end = None if spec.duration_s is None else start_s + spec.duration_s
        return _Fault(spec.name, spec.gpu, start_s, end, spec.delta_c, spec.factor, scripted)

    def _read_load(self) -> float:
        try:
            load = float(self._load_fn())
        except Exception:
            # The load feed belongs to the engine side; a failure there must not stop telemetry.
            if not self._load_warned:
                log.exception("simulated GPU: load_fn failed; keeping the last load")
                self._load_warned = True
            return self._last_load
        if not math.isfinite(load):
            return self._last_load
        self._last_load = min(1.0, max(0.0, load))
        return self._last_load

    def _effective(self, gpu: int, now_s: float) -> _Effective:
        c = self._cfg
        ambient, r, offset, lost = (
            c.ambient_c,
            c.thermal_resistance_c_per_w,
            c.mem_temp_offset_c,
            False,
        )
        for f in self._faults:
            if not f.active(gpu, now_s):
                continue
            if f.name == "hot_room":
                ambient += f.delta_c
            elif f.name == "failed_fan":
                r *= f.factor
            elif f.name == "hbm_hot":
                offset += f.delta_c
            elif f.name == "lost_gpu":
                lost = True
        tau = c.time_constant_s * r / c.thermal_resistance_c_per_w
        return _Effective(ambient, r, tau, offset, lost)

    def _advance(self, index: int, g: _GpuState, now_s: float, load: float) -> GpuSample:
        c = self._cfg
        eff = self._effective(index, now_s)
        throttled = g.temp_c >= c.slowdown_temp_c
        p_now = c.idle_power_w + (c.max_power_w - c.idle_power_w) * load
        if throttled:
            p_now *= _SLOWDOWN_SCALE
        dt = max(0.0, now_s - g.last_s)
        p_mean = 0.5 * (g.power_w + p_now)  # trapezoid over the interval
        if dt > 0:
            t_eq = eff.ambient_c + eff.resistance_c_per_w * p_mean
            g.temp_c += (t_eq - g.temp_c) * (1.0 - math.exp(-dt / eff.time_constant_s))
            g.energy_j += p_mean * dt
        g.power_w = p_now
        self._accrue_errors(index, g, now_s)
        g.last_s = now_s
        uuid = f"GPU-SIM-{index:08d}-0000-0000-0000-000000000000"
        name = f"{c.name} (SIMULATED)"
        if eff.lost:
            return lost_sample(index, uuid, name, now_s, simulated=True)
        core = g.temp_c + self._noise()
        mem = g.temp_c + eff.mem_offset_c + self._noise()
        reasons: tuple[str, ...] = ()
        if g.temp_c >= c.slowdown_temp_c:
            reasons = ("hw_thermal_slowdown",)
        elif load == 0.0:
            reasons = ("gpu_idle",)
        sm = _BOOST_SM_MHZ if load > 0 else _IDLE_SM_MHZ
        if throttled:
            sm = int(sm * _SLOWDOWN_SCALE)
        total = int(c.mem_total_gib * 2**30)
        return GpuSample(
            index=index,
            uuid=uuid,
            name=name,
            simulated=True,
            timestamp_s=now_s,
            core_temp_c=round(core, 3),
            mem_temp_c=round(mem, 3),
            slowdown_temp_c=c.slowdown_temp_c,
            shutdown_temp_c=c.shutdown_temp_c,
            mem_max_temp_c=c.mem_max_temp_c,
            power_w=round(p_now, 3),
            power_limit_w=c.max_power_w,
            energy_j=g.energy_j,
            sm_clock_mhz=sm,
            mem_clock_mhz=_MEM_MHZ,
            gpu_util_pct=round(100.0 * load, 2),
            mem_bw_util_pct=round(70.0 * load, 2),
            # vLLM reserves its memory up front, so the simulated use does not follow load.
            mem_used_bytes=int(total * 0.9),
            mem_total_bytes=total,
            pcie_gen=5,
            pcie_gen_max=5,
            pcie_width=16,
            pcie_width_max=16,
            pcie_tx_kb_s=round(2000.0 * load, 1),
            pcie_rx_kb_s=round(8000.0 * load, 1),
            throttle_reasons=reasons,
            xid_errors=g.xid_errors,
            **self._nvlink(load),
            **self._ecc(g),
        )

    def _accrue_errors(self, index: int, g: _GpuState, now_s: float) -> None:
        """Move the health counters by what the faults did since the last sample."""
        for f in self._faults:
            if f.name == "ecc_storm":
                g.ecc_corrected += f.factor * f.overlap_s(index, g.last_s, now_s)
                double_bit = f.new_events(index, now_s)
                g.ecc_uncorrected += double_bit
                self._raise_xid(index, g, double_bit, _XID_DOUBLE_BIT_ECC)
            elif f.name == "xid":
                self._raise_xid(index, g, f.new_events(index, now_s), _XID_PAGE_FAULT)

    @staticmethod
    def _raise_xid(index: int, g: _GpuState, count: int, code: int) -> None:
        if count:
            g.xid_errors += count
            log.error("simulated Xid %d on gpu%d (%d event(s))", code, index, count)

    def _nvlink(self, load: float) -> dict[str, Any]:
        """Links up, their traffic and use: tensor parallelism talks over them, one GPU does not."""
        share = _TP_NVLINK_SHARE * load if self.gpu_count > 1 else 0.0
        kb_s = round(share * _NVLINK_LINKS * _NVLINK_LINK_B_S / 1024, 1)
        return {
            "nvlink_active": _NVLINK_LINKS,
            "nvlink_tx_kb_s": kb_s,
            "nvlink_rx_kb_s": kb_s,
            "nvlink_util_pct": round(100.0 * share, 2),
        }

    @staticmethod
    def _ecc(g: _GpuState) -> dict[str, int]:
        """The simulated board starts clean, so its lifetime counts equal those since start."""
        corrected = int(g.ecc_corrected)
        return {
            "ecc_corrected_volatile": corrected,
            "ecc_uncorrected_volatile": g.ecc_uncorrected,
            "ecc_corrected_aggregate": corrected,
            "ecc_uncorrected_aggregate": g.ecc_uncorrected,
        }

    def _noise(self) -> float:
        return self._rng.gauss(0.0, self._cfg.noise_c) if self._cfg.noise_c > 0 else 0.0


def _no_load() -> float:
    return 0.0
