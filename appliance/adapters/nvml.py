"""NVML adapter (nvidia-ml-py, module `pynvml`, imported lazily): one GpuSample per GPU.

Nothing here raises out of `sample()`. NVML missing leaves the adapter unavailable with a
reason; a query the GPU does not support is recorded in `unsupported` and never asked again;
a lost GPU yields lost=True samples; an unknown error or an implausible value leaves that
field None (named in `invalid`) for this sample. Each such event is logged once per
(GPU, field, kind).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from appliance.domain.gpu_sample import THROTTLE_REASON_NAMES, GpuSample, lost_sample

log = logging.getLogger(__name__)

# NVML return codes (nvml.h); read from the module when it has them.
_CODES = {
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "INVALID_ARGUMENT": 2,
    "DRIVER_NOT_LOADED": 9,
    "TIMEOUT": 10,
    "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "GPU_NOT_FOUND": 28,
}
_XID_EVENT_BIT = 0x8  # nvmlEventTypeXidCriticalError
_XID_DRAIN_MAX = 256  # events read per sample at most, so a storm cannot stall sampling
# FieldValue.valueType -> the c_nvmlValue_t member holding the value.
_VALUE_MEMBERS = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}


class _GpuLost(Exception):
    """Raised inside one GPU's sampling when NVML reports the GPU gone."""


def _temp_ok(v: float) -> bool:
    # 0 is what some boards report for an absent sensor; 150 °C is past any shutdown point.
    return 0.0 < v < 150.0


def _threshold_ok(v: float) -> bool:
    return 0.0 < v < 200.0


def _power_ok(v: float) -> bool:
    return 0.0 <= v < 5000.0


def _limit_ok(v: float) -> bool:
    return 0.0 < v < 5000.0


def _clock_ok(v: float) -> bool:
    return 0 <= v < 10_000


def _pct_ok(v: float) -> bool:
    return 0.0 <= v <= 100.0


def _nonneg(v: float) -> bool:
    return v >= 0


def _count_ok(v: float) -> bool:
    # uint64/uint32 all-ones are NVML's "not available" sentinels.
    return 0 <= v < 2**32 - 1


def _gen_ok(v: float) -> bool:
    return 1 <= v <= 10


def _width_ok(v: float) -> bool:
    return 1 <= v <= 64


def _kb_s_ok(v: float) -> bool:
    return 0 <= v < 1e9


def _bytes_ok(v: float) -> bool:
    return 0 < v < 2**50


def _mask_ok(v: float) -> bool:
    return 0 <= v < 2**64


@dataclass
class _Gpu:
    index: int
    handle: Any
    uuid: str = ""
    name: str = ""
    unsupported: set[str] = field(default_factory=set)
    static: dict[str, Any] = field(default_factory=dict)
    nvlinks: list[int] = field(default_factory=list)
    lost: bool = False
    old_reasons_api: bool = False
    pcie_at_s: float | None = None
    pcie_kb_s: tuple[float | None, float | None] = (None, None)
    pcie_invalid: frozenset[str] = frozenset()
    xid_registered: bool = False
    xid_count: int = 0


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _err(e: BaseException) -> str:
    """Name an NVML error without str(), which may call into the library that failed."""
    name = type(e).__name__.removeprefix("NVMLError_")
    code = getattr(e, "value", None)
    return f"{name} (NVML error {code})" if code is not None else repr(e)


class NvmlTelemetry:
    """Telemetry adapter over NVML; `available` and `error` say whether it found the GPUs."""

    name = "nvml"
    simulated = False

    def __init__(
        self,
        *,
        pcie_throughput_interval_s: float = 10.0,
        nvml: ModuleType | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.available = False
        self.error: str | None = None
        self.driver_version: str | None = None
        self.cuda_driver_version: int | None = None
        self._pcie_interval_s = pcie_throughput_interval_s
        self._clock = clock
        self._monotonic = monotonic
        self._gpus: list[_Gpu] = []
        self._logged: set[tuple[int, str, str]] = set()
        self._initialised = False
        self._event_set: Any = None
        self._nv: Any = nvml
        if self._nv is None:
            try:
                self._nv = importlib.import_module("pynvml")
            except ImportError:
                self.error = "pynvml (nvidia-ml-py) is not installed"
                log.warning("NVML unavailable: %s", self.error)
                return
        self._codes = {k: getattr(self._nv, f"NVML_ERROR_{k}", v) for k, v in _CODES.items()}
        self._nvml_error: type[BaseException] = getattr(self._nv, "NVMLError", Exception)
        self._open()

    # -- lifecycle ----------------------------------------------------------------------

    def _open(self) -> None:
        nv = self._nv
        try:
            nv.nvmlInit()
        except self._nvml_error as e:
            self.error = self._describe_init_error(e)
            log.warning("NVML unavailable: %s", self.error)
            return
        except Exception as e:  # a broken binding must not take the daemon down
            self.error = f"NVML init failed: {e!r}"
            log.warning("NVML unavailable: %s", self.error)
            return
        self._initialised = True
        try:
            self.driver_version = _text(nv.nvmlSystemGetDriverVersion())
            self.cuda_driver_version = int(nv.nvmlSystemGetCudaDriverVersion())
        except Exception as e:
            log.info("NVML: driver version not readable: %r", e)
        try:
            count = int(nv.nvmlDeviceGetCount())
        except Exception as e:
            self.error = f"NVML device count failed: {_err(e)}"
            log.warning("NVML unavailable: %s", self.error)
            self.close()
            return
        for i in range(count):
            gpu = self._open_gpu(i)
            if gpu is not None:
                self._gpus.append(gpu)
        self._open_xid_events()
        self.available = True
        log.info(
            "NVML: %d GPU(s), driver %s: %s",
            len(self._gpus),
            self.driver_version,
            ", ".join(f"gpu{g.index} {g.name}" for g in self._gpus),
        )

    def _describe_init_error(self, e: BaseException) -> str:
        code = getattr(e, "value", None)
        if code == self._codes["LIBRARY_NOT_FOUND"]:
            return "NVML library not found (no NVIDIA driver installed)"
        if code == self._codes["DRIVER_NOT_LOADED"]:
            return "NVIDIA driver not loaded"
        if code == self._codes["NO_PERMISSION"]:
            return "no permission to use NVML"
        return f"NVML init failed: {_err(e)}"

    def _open_gpu(self, index: int) -> _Gpu | None:
        nv = self._nv
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except self._nvml_error as e:
            if self._is_lost(e):
                log.error("NVML: gpu%d lost at start", index)
                return _Gpu(index=index, handle=None, uuid=f"gpu{index}", name="?", lost=True)
            log.warning("NVML: gpu%d not accessible, skipped: %s", index, _err(e))
            return None
        gpu = _Gpu(index=index, handle=handle)
        try:
            gpu.uuid = _text(nv.nvmlDeviceGetUUID(handle))
            gpu.name = _text(nv.nvmlDeviceGetName(handle))
        except self._nvml_error as e:
            if self._is_lost(e):
                gpu.lost = True
            log.warning("NVML: gpu%d identity not readable: %s", index, _err(e))
        gpu.uuid = gpu.uuid or f"gpu{index}"
        gpu.name = gpu.name or "NVIDIA GPU"
        if not gpu.lost:
            try:
                self._probe_nvlinks(gpu)
            except _GpuLost:
                gpu.lost = True
        return gpu

    def _probe_nvlinks(self, gpu: _Gpu) -> None:
        nv = self._nv
        get_state = getattr(nv, "nvmlDeviceGetNvLinkState", None)
        max_links = int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))
        for link in range(max_links if get_state is not None else 0):
            try:
                get_state(gpu.handle, link)
            except self._nvml_error as e:
                if self._is_lost(e):
                    raise _GpuLost from e
                # NotSupported: no NVLink; InvalidArgument: past the last link.
                if getattr(e, "value", None) in (
                    self._codes["NOT_SUPPORTED"],
                    self._codes["INVALID_ARGUMENT"],
                ):
                    break
                continue
            gpu.nvlinks.append(link)
        if not gpu.nvlinks:
            gpu.unsupported.add("nvlink_active")

    def _open_xid_events(self) -> None:
        nv = self._nv
        bit = getattr(nv, "nvmlEventTypeXidCriticalError", _XID_EVENT_BIT)
        try:
            event_set = nv.nvmlEventSetCreate()
        except Exception as e:
            log.info("NVML: Xid events unavailable: %r", e)
            event_set = None
        for g in self._gpus:
            if event_set is None or g.lost:
                g.unsupported.add("xid_errors")
                continue
            try:
                if int(nv.nvmlDeviceGetSupportedEventTypes(g.handle)) & bit:
                    nv.nvmlDeviceRegisterEvents(g.handle, bit, event_set)
                    g.xid_registered = True
            except Exception as e:
                log.info("NVML: gpu%d Xid events not registered: %r", g.index, e)
            if not g.xid_registered:
                g.unsupported.add("xid_errors")
        if event_set is not None and any(g.xid_registered for g in self._gpus):
            self._event_set = event_set
        elif event_set is not None:
            with contextlib.suppress(Exception):
                nv.nvmlEventSetFree(event_set)

    def close(self) -> None:
        """Release the event set and shut NVML down; safe to call twice."""
        nv = self._nv
        if self._event_set is not None:
            try:
                nv.nvmlEventSetFree(self._event_set)
            except Exception as e:
                log.info("NVML: event set free failed: %r", e)
            self._event_set = None
        if self._initialised:
            self._initialised = False
            self.available = False
            try:
                nv.nvmlShutdown()
            except Exception as e:
                log.info("NVML: shutdown failed: %r", e)

    # -- reading ------------------------------------------------------------------------

    @property
    def gpu_count(self) -> int:
        """GPUs NVML enumerated (lost ones included)."""
        return len(self._gpus)

    def status(self) -> dict[str, Any]:
        """Adapter state for status views: availability, reason, driver, per-GPU gaps."""
        return {
            "source": self.name,
            "available": self.available,
            "error": self.error,
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "gpus": [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "name": g.name,
                    "lost": g.lost,
                    "unsupported": sorted(g.unsupported),
                }
                for g in self._gpus
            ],
        }

    def sample(self) -> list[GpuSample]:
        """Read every GPU once (blocking, a few ms); [] when NVML is unavailable."""
        if not self.available:
            return []
        now = self._clock()
        self._drain_xid_events()
        out = []
        for g in self._gpus:
            if not g.lost:
                try:
                    out.append(self._sample_gpu(g, now))
                    continue
                except _GpuLost:
                    g.lost = True
                    log.error("NVML: gpu%d (%s) is lost", g.index, g.uuid)
            out.append(lost_sample(g.index, g.uuid, g.name, now))
        return out

    def _is_lost(self, e: BaseException) -> bool:
        return getattr(e, "value", None) in (
            self._codes["GPU_IS_LOST"],
            self._codes["RESET_REQUIRED"],
            self._codes["GPU_NOT_FOUND"],
        )

    def _log_once(self, gpu: int, what: str, kind: str, msg: str, *args: Any) -> None:
        key = (gpu, what, kind)
        if key in self._logged:
            return
        self._logged.add(key)
        log.warning("NVML gpu%d %s: " + msg, gpu, what, *args)

    def _query(
        self,
        g: _Gpu,
        fields: tuple[str, ...],
        fn: Callable[[], Any],
        invalid: set[str],
    ) -> Any:
        """Run one NVML call for `fields`; errors become state (see the module docstring)."""
        if g.unsupported.issuperset(fields):
            return None
        try:
            return fn()
        except self._nvml_error as e:
            code = getattr(e, "value", None)
            if self._is_lost(e):
                raise _GpuLost from e
            if code in (
                self._codes["NOT_SUPPORTED"],
                self._codes["NO_PERMISSION"],
                self._codes["FUNCTION_NOT_FOUND"],
            ):
                g.unsupported.update(fields)
                self._log_once(g.index, fields[0], "unsupported", "not supported (%s)", _err(e))
                return None
            invalid.update(fields)
            self._log_once(g.index, fields[0], "error", "query failed (%s)", _err(e))
            return None
        except AttributeError as e:
            # An older pynvml without this function: as good as unsupported.
            g.unsupported.update(fields)
            self._log_once(g.index, fields[0], "unsupported", "not in this pynvml (%s)", e)
            return None
        except Exception as e:
            invalid.update(fields)
            self._log_once(g.index, fields[0], "error", "query failed (%r)", e)
            return None

    def _checked(
        self,
        g: _Gpu,
        name: str,
        value: Any,
        ok: Callable[[float], bool],
        invalid: set[str],
        scale: float = 1.0,
        as_int: bool = False,
    ) -> Any:
        """Scale a raw reading and reject implausible ones (logged once, named invalid)."""
        if value is None:
            return None
        try:
            v = float(value) / scale
        except (TypeError, ValueError):
            v = math.nan
        if not math.isfinite(v) or not ok(v):
            invalid.add(name)
            self._log_once(g.index, name, "odd", "implausible value %r ignored", value)
            return None
        return int(v) if as_int else v

    def _static(self, g: _Gpu, name: str, fn: Callable[[], Any], invalid: set[str]) -> Any:
        """A value that does not change while the driver runs: read until it succeeds once."""
        if name in g.static:
            return g.static[name]
        v = self._query(g, (name,), fn, invalid)
        if v is not None:
            g.static[name] = v
        return v

    def _sample_gpu(self, g: _Gpu, now: float) -> GpuSample:
        nv, h = self._nv, g.handle
        bad: set[str] = set()

        def read(
            name: str,
            call: Callable[[], Any],
            ok: Callable[[float], bool],
            *,
            scale: float = 1.0,
            as_int: bool = False,
            static: bool = False,
        ) -> Any:
            raw = self._static(g, name, call, bad) if static else self._query(g, (name,), call, bad)
            value = self._checked(g, name, raw, ok, bad, scale=scale, as_int=as_int)
            if static and value is None:
                g.static.pop(name, None)  # an implausible constant is not kept; read it again
            return value

        def threshold(const: str) -> Callable[[], Any]:
            return lambda: nv.nvmlDeviceGetTemperatureThreshold(h, getattr(nv, const))

        core = read(
            "core_temp_c", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU), _temp_ok
        )
        mem = read("mem_temp_c", lambda: self._memory_temp(h), _temp_ok)
        slowdown = read(
            "slowdown_temp_c",
            threshold("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"),
            _threshold_ok,
            static=True,
        )
        shutdown = read(
            "shutdown_temp_c",
            threshold("NVML_TEMPERATURE_THRESHOLD_SHUTDOWN"),
            _threshold_ok,
            static=True,
        )
        mem_max = read(
            "mem_max_temp_c",
            threshold("NVML_TEMPERATURE_THRESHOLD_MEM_MAX"),
            _threshold_ok,
            static=True,
        )
        # NVML reports milliwatts and millijoules.
        power = read("power_w", lambda: nv.nvmlDeviceGetPowerUsage(h), _power_ok, scale=1000.0)
        limit = read(
            "power_limit_w", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h), _limit_ok, scale=1000.0
        )
        energy = read(
            "energy_j", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h), _nonneg, scale=1000.0
        )
        sm = read(
            "sm_clock_mhz",
            lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            _clock_ok,
            as_int=True,
        )
        mclk = read(
            "mem_clock_mhz",
            lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            _clock_ok,
            as_int=True,
        )
        # One call each fills two fields.
        util = self._query(
            g, ("gpu_util_pct", "mem_bw_util_pct"), lambda: nv.nvmlDeviceGetUtilizationRates(h), bad
        )
        gpu_util = self._checked(g, "gpu_util_pct", getattr(util, "gpu", None), _pct_ok, bad)
        bw_util = self._checked(g, "mem_bw_util_pct", getattr(util, "memory", None), _pct_ok, bad)
        meminfo = self._query(
            g, ("mem_used_bytes", "mem_total_bytes"), lambda: nv.nvmlDeviceGetMemoryInfo(h), bad
        )
        total = self._checked(
            g, "mem_total_bytes", getattr(meminfo, "total", None), _bytes_ok, bad, as_int=True
        )
        used = self._checked(
            g,
            "mem_used_bytes",
            getattr(meminfo, "used", None),
            lambda v: 0 <= v <= (total if total is not None else 2**50),
            bad,
            as_int=True,
        )
        gen = read(
            "pcie_gen", lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h), _gen_ok, as_int=True
        )
        gen_max = read(
            "pcie_gen_max",
            lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(h),
            _gen_ok,
            as_int=True,
            static=True,
        )
        width = read(
            "pcie_width", lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(h), _width_ok, as_int=True
        )
        width_max = read(
            "pcie_width_max",
            lambda: nv.nvmlDeviceGetMaxPcieLinkWidth(h),
            _width_ok,
            as_int=True,
            static=True,
        )
        tx, rx = self._pcie_throughput(g, bad)
        nvlink = self._nvlink_active(g, bad)
        reasons_mask = read(
            "throttle_reasons", lambda: self._reasons_mask(g), _mask_ok, as_int=True
        )
        ecc = read(
            "ecc_errors",
            lambda: nv.nvmlDeviceGetTotalEccErrors(
                h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
            ),
            _count_ok,
            as_int=True,
        )
        return GpuSample(
            index=g.index,
            uuid=g.uuid,
            name=g.name,
            simulated=False,
            timestamp_s=now,
            core_temp_c=core,
            mem_temp_c=mem,
            power_w=power,
            power_limit_w=limit,
            energy_j=energy,
            sm_clock_mhz=sm,
            mem_clock_mhz=mclk,
            gpu_util_pct=gpu_util,
            mem_bw_util_pct=bw_util,
            mem_used_bytes=used,
            mem_total_bytes=total,
            pcie_gen=gen,
            pcie_gen_max=gen_max,
            pcie_width=width,
            pcie_width_max=width_max,
            pcie_tx_kb_s=tx,
            pcie_rx_kb_s=rx,
            nvlink_active=nvlink,
            throttle_reasons=_reason_names(reasons_mask),
            ecc_errors=ecc,
            xid_errors=None if "xid_errors" in g.unsupported else g.xid_count,
            unsupported=tuple(sorted(g.unsupported)),
            invalid=tuple(sorted(bad - g.unsupported)),
            slowdown_temp_c=slowdown,
            shutdown_temp_c=shutdown,
            mem_max_temp_c=mem_max,
        )

    def _memory_temp(self, handle: Any) -> float:
        """HBM temperature through the field-values API (NVML_FI_DEV_MEMORY_TEMP)."""
        nv = self._nv
        values = nv.nvmlDeviceGetFieldValues(handle, [nv.NVML_FI_DEV_MEMORY_TEMP])
        fv = values[0]
        ret = int(getattr(fv, "nvmlReturn", 0))
        if ret != 0:
            raise nv.NVMLError(ret)  # maps to the NVMLError_* subclass for that code
        member = _VALUE_MEMBERS.get(int(getattr(fv, "valueType", 1)), "uiVal")
        return getattr(fv.value, member)

    def _reasons_mask(self, g: _Gpu) -> int:
        nv = self._nv
        newer = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if newer is not None and not g.old_reasons_api:
            try:
                return int(newer(g.handle))
            except self._nvml_error as e:
                if getattr(e, "value", None) != self._codes["FUNCTION_NOT_FOUND"]:
                    raise
                g.old_reasons_api = True  # an older driver: use the deprecated name from now on
        return int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(g.handle))

    def _pcie_throughput(self, g: _Gpu, bad: set[str]) -> tuple[float | None, float | None]:
        """PCIe TX/RX KB/s, re-read at most every pcie_throughput_interval_s (20 ms a read)."""
        if self._pcie_interval_s <= 0:
            return None, None
        now = self._monotonic()
        if g.pcie_at_s is not None and now - g.pcie_at_s < self._pcie_interval_s:
            bad.update(g.pcie_invalid)  # a kept reading stays as (in)valid as when read
            return g.pcie_kb_s
        nv = self._nv
        kinds = (
            ("pcie_tx_kb_s", "NVML_PCIE_UTIL_TX_BYTES"),
            ("pcie_rx_kb_s", "NVML_PCIE_UTIL_RX_BYTES"),
        )
        vals = []
        for name, const in kinds:
            raw = self._query(
                g,
                (name,),
                lambda const=const: nv.nvmlDeviceGetPcieThroughput(g.handle, getattr(nv, const)),
                bad,
            )
            vals.append(self._checked(g, name, raw, _kb_s_ok, bad))
        g.pcie_at_s = now
        g.pcie_kb_s = (vals[0], vals[1])
        g.pcie_invalid = frozenset(bad & {"pcie_tx_kb_s", "pcie_rx_kb_s"})
        return g.pcie_kb_s

    def _nvlink_active(self, g: _Gpu, bad: set[str]) -> int | None:
        if "nvlink_active" in g.unsupported:
            return None
        nv = self._nv
        active = 0
        for link in g.nvlinks:
            state = self._query(
                g,
                ("nvlink_active",),
                lambda link=link: nv.nvmlDeviceGetNvLinkState(g.handle, link),
                bad,
            )
            if state is None:
                return None
            active += 1 if int(state) else 0
        return active

    def _drain_xid_events(self) -> None:
        if self._event_set is None:
            return
        nv = self._nv
        by_uuid = {g.uuid: g for g in self._gpus}
        for _ in range(_XID_DRAIN_MAX):
            try:
                data = nv.nvmlEventSetWait_v2(self._event_set, 0)
            except self._nvml_error as e:
                if getattr(e, "value", None) != self._codes["TIMEOUT"]:
                    self._log_once(-1, "xid_errors", "error", "event wait failed (%s)", _err(e))
                return
            except Exception as e:
                self._log_once(-1, "xid_errors", "error", "event wait failed (%r)", e)
                return
            try:
                g = by_uuid.get(_text(nv.nvmlDeviceGetUUID(data.device)))
            except Exception:
                g = None
            code = getattr(data, "eventData", None)
            if g is None:
                log.error("NVML: Xid %s on an unknown GPU", code)
                continue
            g.xid_count += 1
            log.error("NVML: Xid %s on gpu%d (%s)", code, g.index, g.uuid)


def _reason_names(mask: int | None) -> tuple[str, ...]:
    if not mask:
        return ()
    names = [name for bit, name in enumerate(THROTTLE_REASON_NAMES) if mask & (1 << bit)]
    rest = mask & ~((1 << len(THROTTLE_REASON_NAMES)) - 1)
    if rest:
        names.append(f"other_0x{rest:x}")
    return tuple(names)
