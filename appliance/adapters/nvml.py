"""The one NVML adapter (nvidia-ml-py, module `pynvml`, imported lazily).

Two readers share one view of NVML's errors: `NvmlTelemetry` samples every GPU (a GpuSample
each) for the telemetry loop, and `read_inventory` takes the static facts the pre-check and the
daemon's start need. Both call a GPU lost by the same rule (`_NvmlErrors.is_lost`), so a GPU the
pre-check reports lost is one the telemetry loop would mark lost, and the reverse.

Nothing here raises out of `sample()` or `read_inventory()`. NVML missing leaves the adapter
unavailable with a reason; a query the GPU does not support is recorded in `unsupported` and never
asked again; a lost GPU yields lost=True samples; an unknown error or an implausible value leaves
that field None (named in `invalid`) for this sample. Each such event is logged once per
(GPU, field, kind).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal

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
# Codes after which the GPU answers nothing until a reset or a reboot: gone from the bus,
# fallen off it, or wedged until reset. Asking it again only repeats the error.
_LOST_CODES = ("GPU_IS_LOST", "RESET_REQUIRED", "GPU_NOT_FOUND")
# Codes that will not change while the driver runs: stop asking.
_UNSUPPORTED_CODES = ("NOT_SUPPORTED", "NO_PERMISSION", "FUNCTION_NOT_FOUND")
PYNVML_MISSING = "pynvml (nvidia-ml-py) is not installed"

InitFailure = Literal["no_library", "no_driver", "no_permission", "error"]
_XID_EVENT_BIT = 0x8  # nvmlEventTypeXidCriticalError
_XID_DRAIN_MAX = 256  # events read per sample at most, so a storm cannot stall sampling
# (GpuSample field, pynvml error type, pynvml counter type) for each ECC count.
_ECC_COUNTERS = (
    ("ecc_corrected_volatile", "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC"),
    ("ecc_uncorrected_volatile", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"),
    ("ecc_corrected_aggregate", "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_AGGREGATE_ECC"),
    ("ecc_uncorrected_aggregate", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_AGGREGATE_ECC"),
)
_NVLINK_RATE_FIELDS = ("nvlink_tx_kb_s", "nvlink_rx_kb_s", "nvlink_util_pct")
_ALL_LINKS = 0xFFFFFFFF  # a field's scopeId: the sum over every link
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
    """Raised inside one GPU's reads when NVML reports the GPU lost; stop asking it."""


def _import_pynvml() -> ModuleType:
    """The binding, imported on first use: CPU-only machines never load it otherwise."""
    import pynvml

    return pynvml


def _error_name(e: BaseException) -> str:
    """Name an NVML error without str(), which may call into the library that failed."""
    return type(e).__name__.removeprefix("NVMLError_")


def _err(e: BaseException) -> str:
    """An NVML error's name and code, for logs; repr() for anything else."""
    code = getattr(e, "value", None)
    return f"{_error_name(e)} (NVML error {code})" if code is not None else repr(e)


class _NvmlErrors:
    """What the binding's exceptions mean; one reading for sampling and the inventory alike."""

    def __init__(self, nv: Any) -> None:
        self.codes = {k: getattr(nv, f"NVML_ERROR_{k}", v) for k, v in _CODES.items()}
        self.base: type[BaseException] = getattr(nv, "NVMLError", Exception)
        self._lost = frozenset(self.codes[k] for k in _LOST_CODES)
        self._unsupported = frozenset(self.codes[k] for k in _UNSUPPORTED_CODES)

    @staticmethod
    def code(e: BaseException) -> int | None:
        """The NVML return code an exception carries, or None."""
        return getattr(e, "value", None)

    def is_lost(self, e: BaseException) -> bool:
        """The one definition of a lost GPU: NVML says it is lost, needs a reset, or is gone."""
        return isinstance(e, self.base) and self.code(e) in self._lost

    def is_unsupported(self, e: BaseException) -> bool:
        """NVML will answer this query the same way until the driver changes."""
        return self.code(e) in self._unsupported

    def init_failure(self, e: BaseException) -> InitFailure:
        """Why nvmlInit failed, as a kind each reader words for its own users."""
        code = self.code(e)
        if code == self.codes["LIBRARY_NOT_FOUND"]:
            return "no_library"
        if code == self.codes["DRIVER_NOT_LOADED"]:
            return "no_driver"
        if code == self.codes["NO_PERMISSION"]:
            return "no_permission"
        return "error"


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


def _link_speed_ok(v: float) -> bool:
    # MB/s per link and direction: NVLink 1-5 run 20,000-100,000.
    return 1_000 <= v < 1_000_000


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
    nvlink_kib: tuple[float, float] | None = None  # the last TX/RX counters read
    nvlink_at_s: float | None = None  # when (monotonic)


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


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
                self._nv = _import_pynvml()
            except ImportError:
                self.error = PYNVML_MISSING
                log.warning("NVML unavailable: %s", self.error)
                return
        self._errors = _NvmlErrors(self._nv)
        self._open()

    # -- lifecycle ----------------------------------------------------------------------

    def _open(self) -> None:
        nv = self._nv
        try:
            nv.nvmlInit()
        except Exception as e:  # NVMLError, or a broken binding: neither takes the daemon down
            self.error = self._describe_init_error(e)
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
        kind = self._errors.init_failure(e)
        if kind == "no_library":
            return "NVML library not found (no NVIDIA driver installed)"
        if kind == "no_driver":
            return "NVIDIA driver not loaded"
        if kind == "no_permission":
            return "no permission to use NVML"
        return f"NVML init failed: {_err(e)}"

    def _open_gpu(self, index: int) -> _Gpu | None:
        nv = self._nv
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except self._errors.base as e:
            if self._errors.is_lost(e):
                log.error("NVML: gpu%d lost at start", index)
                return _Gpu(index=index, handle=None, uuid=f"gpu{index}", name="?", lost=True)
            log.warning("NVML: gpu%d not accessible, skipped: %s", index, _err(e))
            return None
        gpu = _Gpu(index=index, handle=handle)
        try:
            gpu.uuid = _text(nv.nvmlDeviceGetUUID(handle))
            gpu.name = _text(nv.nvmlDeviceGetName(handle))
        except self._errors.base as e:
            if self._errors.is_lost(e):
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
            except self._errors.base as e:
                if self._errors.is_lost(e):
                    raise _GpuLost from e
                # NotSupported: no NVLink; InvalidArgument: past the last link.
                codes = self._errors.codes
                if self._errors.code(e) in (codes["NOT_SUPPORTED"], codes["INVALID_ARGUMENT"]):
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
        except self._errors.base as e:
            if self._errors.is_lost(e):
                raise _GpuLost from e
            if self._errors.is_unsupported(e):
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
        """One GPU's reading; raises _GpuLost when NVML reports it gone mid-way."""
        bad: set[str] = set()
        fields: dict[str, Any] = {}
        # The order is NVML's call order per sample; a lost GPU stops it where it is lost.
        for group in (
            self._read_temperatures,
            self._read_power,
            self._read_clocks,
            self._read_utilisation,
            self._read_memory,
            self._read_links,
            self._read_health,
        ):
            fields.update(group(g, bad))
        return GpuSample(
            index=g.index,
            uuid=g.uuid,
            name=g.name,
            simulated=False,
            timestamp_s=now,
            xid_errors=None if "xid_errors" in g.unsupported else g.xid_count,
            unsupported=tuple(sorted(g.unsupported)),
            invalid=tuple(sorted(bad - g.unsupported)),
            **fields,
        )

    def _read(
        self,
        g: _Gpu,
        bad: set[str],
        name: str,
        call: Callable[[], Any],
        ok: Callable[[float], bool],
        *,
        scale: float = 1.0,
        as_int: bool = False,
        static: bool = False,
    ) -> Any:
        """One field from one NVML call: queried, scaled and checked for plausibility."""
        raw = self._static(g, name, call, bad) if static else self._query(g, (name,), call, bad)
        value = self._checked(g, name, raw, ok, bad, scale=scale, as_int=as_int)
        if static and value is None:
            g.static.pop(name, None)  # an implausible constant is not kept; read it again
        return value

    def _read_temperatures(self, g: _Gpu, bad: set[str]) -> dict[str, Any]:
        nv, h = self._nv, g.handle

        def threshold(const: str) -> Callable[[], Any]:
            return lambda: nv.nvmlDeviceGetTemperatureThreshold(h, getattr(nv, const))

        out = {
            "core_temp_c": self._read(
                g,
                bad,
                "core_temp_c",
                lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
                _temp_ok,
            ),
            "mem_temp_c": self._read(g, bad, "mem_temp_c", lambda: self._memory_temp(h), _temp_ok),
        }
        for name, const in (
            ("slowdown_temp_c", "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"),
            ("shutdown_temp_c", "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN"),
            ("mem_max_temp_c", "NVML_TEMPERATURE_THRESHOLD_MEM_MAX"),
        ):
            out[name] = self._read(g, bad, name, threshold(const), _threshold_ok, static=True)
        return out

    def _read_power(self, g: _Gpu, bad: set[str]) -> dict[str, Any]:
        nv, h = self._nv, g.handle
        # NVML reports milliwatts and millijoules.
        return {
            "power_w": self._read(
                g, bad, "power_w", lambda: nv.nvmlDeviceGetPowerUsage(h), _power_ok, scale=1000.0
            ),
            "power_limit_w": self._read(
                g,
                bad,
                "power_limit_w",
                lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h),
                _limit_ok,
                scale=1000.0,
            ),
            "energy_j": self._read(
                g,
                bad,
                "energy_j",
                lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h),
                _nonneg,
                scale=1000.0,
            ),
        }

    def _read_clocks(self, g: _Gpu, bad: set[str]) -> dict[str, Any]:
        nv, h = self._nv, g.handle
        out = {}
        for name, const in (("sm_clock_mhz", "NVML_CLOCK_SM"), ("mem_clock_mhz", "NVML_CLOCK_MEM")):
            out[name] = self._read(
                g,
                bad,
                name,
                lambda const=const: nv.nvmlDeviceGetClockInfo(h, getattr(nv, const)),
                _clock_ok,
                as_int=True,
            )
        return out

    def _read_utilisation(self, g: _Gpu, bad: set[str]) -> dict[str, Any]:
        nv, h = self._nv, g.handle
        # One call fills two fields.
        util = self._query(
            g, ("gpu_util_pct", "mem_bw_util_pct"), lambda: nv.nvmlDeviceGetUtilizationRates(h), bad
        )
        return {
            "gpu_util_pct": self._checked(
                g, "gpu_util_pct", getattr(util, "gpu", None), _pct_ok, bad
            ),
            "mem_bw_util_pct": self._checked(
                g, "mem_bw_util_pct", getattr(util, "memory", None), _pct_ok, bad
            ),
        }

    def _read_memory(self, g: _Gpu, bad: set[str]) -> dict[str, Any]:
        nv, h = self._nv, g.handle
        # One call fills two fields; used is checked against the total it came with.
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
        return {"mem_total_bytes": total, "mem_used_bytes": used}

    def _read_links(self, g: _Gpu, bad: set[str]) -> dict[str, Any]:
        nv, h = self._nv, g.handle
        out = {}
        # The maxima do not change while the driver runs; the current link can train down.
        for name, fn, ok, static in (
            ("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration", _gen_ok, False),
            ("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", _gen_ok, True),
            ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth", _width_ok, False),
            ("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth", _width_ok, True),
        ):
            # Looked up at call time: a binding without the function is unsupported, not a crash.
            out[name] = self._read(
                g, bad, name, lambda fn=fn: getattr(nv, fn)(h), ok, as_int=True, static=static
            )
        out["pcie_tx_kb_s"], out["pcie_rx_kb_s"] = self._pcie_throughput(g, bad)
        out["nvlink_active"] = self._nvlink_active(g, bad)
        out.update(self._nvlink_throughput(g, bad, out["nvlink_active"]))
        return out

    def _read_health(self, g: _Gpu, bad: set[str]) -> dict[str, Any]:
        nv, h = self._nv, g.handle
        mask = self._read(
            g, bad, "throttle_reasons", lambda: self._reasons_mask(g), _mask_ok, as_int=True
        )
        out: dict[str, Any] = {"throttle_reasons": _reason_names(mask)}
        # Four counters, each on its own: a board may keep one and not another (with ECC off
        # NVML answers NotSupported for all four, which leaves them unsupported for good).
        for name, kind, counter in _ECC_COUNTERS:
            out[name] = self._read(
                g,
                bad,
                name,
                lambda kind=kind, counter=counter: nv.nvmlDeviceGetTotalEccErrors(
                    h, getattr(nv, kind), getattr(nv, counter)
                ),
                _count_ok,
                as_int=True,
            )
        return out

    def _field_values(self, handle: Any, ids: list[Any]) -> list[Any]:
        """Values from the field-values API; a field's own error code raises as NVMLError."""
        nv = self._nv
        out = []
        for fv in nv.nvmlDeviceGetFieldValues(handle, ids):
            ret = int(getattr(fv, "nvmlReturn", 0))
            if ret != 0:
                raise nv.NVMLError(ret)  # maps to the NVMLError_* subclass for that code
            member = _VALUE_MEMBERS.get(int(getattr(fv, "valueType", 1)), "uiVal")
            out.append(getattr(fv.value, member))
        return out

    def _memory_temp(self, handle: Any) -> float:
        """HBM temperature through the field-values API (NVML_FI_DEV_MEMORY_TEMP)."""
        return self._field_values(handle, [self._nv.NVML_FI_DEV_MEMORY_TEMP])[0]

    def _reasons_mask(self, g: _Gpu) -> int:
        nv = self._nv
        newer = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if newer is not None and not g.old_reasons_api:
            try:
                return int(newer(g.handle))
            except self._errors.base as e:
                if self._errors.code(e) != self._errors.codes["FUNCTION_NOT_FOUND"]:
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

    def _nvlink_throughput(self, g: _Gpu, bad: set[str], active: int | None) -> dict[str, Any]:
        """NVLink data rates from NVML's KiB counters summed over every link, and the busier
        direction as a share of what the active links carry."""
        out: dict[str, Any] = dict.fromkeys(_NVLINK_RATE_FIELDS)
        if not g.nvlinks:
            g.unsupported.update(_NVLINK_RATE_FIELDS)  # a PCIe-only board: nothing to read
            return out
        nv, h = self._nv, g.handle
        raw = self._query(
            g,
            _NVLINK_RATE_FIELDS,
            lambda: self._field_values(
                h,
                [
                    (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _ALL_LINKS),
                    (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _ALL_LINKS),
                ],
            ),
            bad,
        )
        now, prev, prev_at = self._monotonic(), g.nvlink_kib, g.nvlink_at_s
        g.nvlink_kib = None if raw is None else (float(raw[0]), float(raw[1]))
        g.nvlink_at_s = now
        rates = _rates(prev, prev_at, g.nvlink_kib, now)
        if rates is None:
            return out
        out["nvlink_tx_kb_s"], out["nvlink_rx_kb_s"] = rates
        speed_mbps = self._read(
            g,
            bad,
            "nvlink_util_pct",
            lambda: self._field_values(h, [nv.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON])[0],
            _link_speed_ok,
            static=True,
        )
        if speed_mbps and active:
            busier_b_s = max(rates) * 1024
            # The speed is per link and direction in 10^6 B/s; rounding in the counters can
            # carry a saturated link a hair past 100 %.
            out["nvlink_util_pct"] = min(100.0, 100.0 * busier_b_s / (active * speed_mbps * 1e6))
        return out

    def _drain_xid_events(self) -> None:
        if self._event_set is None:
            return
        nv = self._nv
        by_uuid = {g.uuid: g for g in self._gpus}
        for _ in range(_XID_DRAIN_MAX):
            try:
                data = nv.nvmlEventSetWait_v2(self._event_set, 0)
            except self._errors.base as e:
                if self._errors.code(e) != self._errors.codes["TIMEOUT"]:
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


def _rates(
    prev: tuple[float, float] | None,
    prev_at_s: float | None,
    now: tuple[float, float] | None,
    now_s: float,
) -> tuple[float, float] | None:
    """Per-second rates of two counters read twice; None without two readings, or when a
    counter went back (the driver reloaded) and has to start over."""
    if prev is None or now is None or prev_at_s is None or now_s <= prev_at_s:
        return None
    deltas = (now[0] - prev[0], now[1] - prev[1])
    if min(deltas) < 0:
        return None
    dt = now_s - prev_at_s
    return deltas[0] / dt, deltas[1] / dt


def _reason_names(mask: int | None) -> tuple[str, ...]:
    if not mask:
        return ()
    names = [name for bit, name in enumerate(THROTTLE_REASON_NAMES) if mask & (1 << bit)]
    rest = mask & ~((1 << len(THROTTLE_REASON_NAMES)) - 1)
    if rest:
        names.append(f"other_0x{rest:x}")
    return tuple(names)


# -- the inventory: static facts for the pre-check and the daemon's start --------------------

NvmlState = Literal["ok", "no_library", "no_driver", "error"]


@dataclass(frozen=True)
class GpuFacts:
    """What NVML said about one GPU; None where the query failed (see errors)."""

    index: int
    name: str | None = None
    uuid: str | None = None
    memory_total_bytes: int | None = None
    compute_capability: tuple[int, int] | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    ecc_enabled: bool | None = None
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    temperature_c: int | None = None
    nvlink_links_active: int | None = None
    nvlink_links_total: int | None = None
    lost: bool = False
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Inventory:
    """The machine's GPUs as NVML sees them, or why NVML could not say."""

    state: NvmlState
    detail: str = ""
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    gpus: tuple[GpuFacts, ...] = field(default_factory=tuple)


def _cuda_version(raw: int) -> str:
    # NVML encodes CUDA 12.4 as 12040.
    return f"{raw // 1000}.{(raw % 1000) // 10}"


class _FactReader:
    """Runs NVML queries, turning each failure into an entry in errors (a lost GPU raises)."""

    def __init__(self, nvml: Any, nvml_errors: _NvmlErrors) -> None:
        self.nvml = nvml
        self.nvml_errors = nvml_errors
        self.errors: list[str] = []

    def get(self, label: str, fn_name: str, *args: Any) -> Any:
        """The call's result, or None with the error noted; raises _GpuLost for a lost GPU."""
        try:
            return getattr(self.nvml, fn_name)(*args)
        except Exception as exc:  # NVMLError of any kind, or a function this binding lacks
            self.errors.append(f"{label}: {_error_name(exc)}")
            if self.nvml_errors.is_lost(exc):
                raise _GpuLost from None
            return None


def _optional_int(value: Any) -> int | None:
    return int(value) if value is not None else None


# Each _*_facts fills `facts` as it reads, so what was read before a GPU is lost is kept.


def _identity_facts(reader: _FactReader, handle: Any, facts: dict[str, Any]) -> None:
    name = reader.get("name", "nvmlDeviceGetName", handle)
    facts["name"] = _text(name) if name is not None else None
    uuid = reader.get("uuid", "nvmlDeviceGetUUID", handle)
    facts["uuid"] = _text(uuid) if uuid is not None else None
    mem = reader.get("memory", "nvmlDeviceGetMemoryInfo", handle)
    facts["memory_total_bytes"] = int(mem.total) if mem is not None else None
    cc = reader.get("compute_capability", "nvmlDeviceGetCudaComputeCapability", handle)
    facts["compute_capability"] = (int(cc[0]), int(cc[1])) if cc is not None else None


def _pcie_facts(reader: _FactReader, handle: Any, facts: dict[str, Any]) -> None:
    for key, fn in (
        ("pcie_gen_current", "nvmlDeviceGetCurrPcieLinkGeneration"),
        ("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
        ("pcie_width_current", "nvmlDeviceGetCurrPcieLinkWidth"),
        ("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth"),
    ):
        facts[key] = _optional_int(reader.get(key, fn, handle))


def _ecc_facts(reader: _FactReader, handle: Any, facts: dict[str, Any]) -> None:
    nvml = reader.nvml
    mode = reader.get("ecc_mode", "nvmlDeviceGetEccMode", handle)
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    facts["ecc_enabled"] = (mode[0] == enabled) if mode is not None else None
    if not facts["ecc_enabled"]:
        return  # the counters mean nothing with ECC off
    corrected = getattr(nvml, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
    uncorrected = getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    volatile = getattr(nvml, "NVML_VOLATILE_ECC", 0)
    aggregate = getattr(nvml, "NVML_AGGREGATE_ECC", 1)
    for key, label, kind, counter in (
        ("ecc_corrected_volatile", "ecc_corrected", corrected, volatile),
        ("ecc_uncorrected_volatile", "ecc_uncorrected", uncorrected, volatile),
        ("ecc_uncorrected_aggregate", "ecc_uncorrected_aggregate", uncorrected, aggregate),
    ):
        facts[key] = reader.get(label, "nvmlDeviceGetTotalEccErrors", handle, kind, counter)


def _temperature_facts(reader: _FactReader, handle: Any, facts: dict[str, Any]) -> None:
    sensor = getattr(reader.nvml, "NVML_TEMPERATURE_GPU", 0)
    temp = reader.get("temperature", "nvmlDeviceGetTemperature", handle, sensor)
    facts["temperature_c"] = _optional_int(temp)


def _nvlink_facts(reader: _FactReader, handle: Any, facts: dict[str, Any]) -> None:
    nvml = reader.nvml
    active = total = 0
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except Exception as exc:
            if reader.nvml_errors.is_lost(exc):
                reader.errors.append(f"nvlink: {_error_name(exc)}")
                raise _GpuLost from None
            if link == 0:
                # PCIe-only boards answer NotSupported for the first link: no NVLink at all.
                reader.errors.append(f"nvlink: {_error_name(exc)}")
                facts["nvlink_links_active"] = facts["nvlink_links_total"] = None
                return
            break  # past the last link this GPU has
        total += 1
        active += 1 if state else 0
    facts["nvlink_links_active"], facts["nvlink_links_total"] = active, total


def _read_gpu(nvml: Any, nvml_errors: _NvmlErrors, index: int) -> GpuFacts:
    reader = _FactReader(nvml, nvml_errors)
    facts: dict[str, Any] = {}
    try:
        handle = reader.get("handle", "nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            return GpuFacts(index=index, errors=tuple(reader.errors))
        for read in (
            _identity_facts,
            _pcie_facts,
            _ecc_facts,
            _temperature_facts,
            _nvlink_facts,
        ):
            read(reader, handle, facts)
    except _GpuLost:
        return GpuFacts(index=index, lost=True, errors=tuple(reader.errors), **facts)
    return GpuFacts(index=index, errors=tuple(reader.errors), **facts)


def _init_failure(nvml_errors: _NvmlErrors, exc: BaseException) -> Inventory:
    name = _error_name(exc)
    kind = nvml_errors.init_failure(exc)
    if kind == "no_library":
        return Inventory("no_library", f"NVML library not found ({name})")
    if kind == "no_driver":
        return Inventory("no_driver", f"NVIDIA driver not loaded ({name})")
    if kind == "no_permission":
        return Inventory("error", f"no permission to use NVML ({name})")
    return Inventory("error", f"NVML init failed ({name})")


def read_inventory(nvml: Any = None) -> Inventory:
    """Static facts about every GPU; never raises (a missing library is a state, not an error)."""
    if nvml is None:
        try:
            nvml = _import_pynvml()
        except ImportError as exc:
            return Inventory("no_library", f"{PYNVML_MISSING} ({exc})")
    nvml_errors = _NvmlErrors(nvml)
    try:
        nvml.nvmlInit()
    except Exception as exc:
        return _init_failure(nvml_errors, exc)
    try:
        reader = _FactReader(nvml, nvml_errors)
        driver = reader.get("driver", "nvmlSystemGetDriverVersion")
        cuda = reader.get("cuda", "nvmlSystemGetCudaDriverVersion")
        count = reader.get("count", "nvmlDeviceGetCount")
        gpus = tuple(_read_gpu(nvml, nvml_errors, i) for i in range(int(count or 0)))
        return Inventory(
            "ok" if count is not None else "error",
            "; ".join(reader.errors),
            _text(driver) if driver is not None else None,
            _cuda_version(int(cuda)) if cuda is not None else None,
            gpus,
        )
    except Exception as exc:  # a binding bug must not take the pre-check down
        return Inventory("error", f"NVML query failed ({_error_name(exc)})")
    finally:
        # Shutdown failing changes nothing we report.
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
