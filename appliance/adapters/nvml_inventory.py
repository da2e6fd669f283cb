"""Static GPU facts for the pre-check, read through NVML; every NVML failure becomes a value."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Literal

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


class _GpuLost(Exception):
    """A query reported the GPU gone; stop asking it anything else."""


def _error_name(exc: BaseException) -> str:
    # str() of an NVMLError calls back into the library, which may be the thing that is missing.
    name = type(exc).__name__
    return name.removeprefix("NVMLError_") if name.startswith("NVMLError_") else name


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _cuda_version(raw: int) -> str:
    # NVML encodes CUDA 12.4 as 12040.
    return f"{raw // 1000}.{(raw % 1000) // 10}"


class _Reader:
    """Runs NVML queries for one GPU, turning each failure into an entry in errors."""

    def __init__(self, nvml: Any):
        self.nvml = nvml
        self.errors: list[str] = []
        self._lost_cls = getattr(nvml, "NVMLError_GpuIsLost", None)

    def get(self, label: str, fn_name: str, *args: Any) -> Any:
        try:
            return getattr(self.nvml, fn_name)(*args)
        except Exception as exc:  # NVMLError of any kind, or a function this binding lacks
            if self._lost_cls is not None and isinstance(exc, self._lost_cls):
                self.errors.append(f"{label}: GpuIsLost")
                raise _GpuLost from None
            self.errors.append(f"{label}: {_error_name(exc)}")
            return None


def _nvlink(reader: _Reader, handle: Any) -> tuple[int | None, int | None]:
    nvml = reader.nvml
    active = total = 0
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except Exception as exc:
            lost = getattr(nvml, "NVMLError_GpuIsLost", None)
            if lost is not None and isinstance(exc, lost):
                raise _GpuLost from None
            if link == 0:
                # PCIe-only boards answer NotSupported for the first link: no NVLink at all.
                reader.errors.append(f"nvlink: {_error_name(exc)}")
                return None, None
            break  # past the last link this GPU has
        total += 1
        active += 1 if state else 0
    return active, total


def _read_gpu(nvml: Any, index: int) -> GpuFacts:
    reader = _Reader(nvml)
    facts: dict[str, Any] = {}
    try:
        handle = reader.get("handle", "nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            return GpuFacts(index=index, errors=tuple(reader.errors))
        name = reader.get("name", "nvmlDeviceGetName", handle)
        facts["name"] = _text(name) if name is not None else None
        uuid = reader.get("uuid", "nvmlDeviceGetUUID", handle)
        facts["uuid"] = _text(uuid) if uuid is not None else None
        mem = reader.get("memory", "nvmlDeviceGetMemoryInfo", handle)
        facts["memory_total_bytes"] = int(mem.total) if mem is not None else None
        cc = reader.get("compute_capability", "nvmlDeviceGetCudaComputeCapability", handle)
        facts["compute_capability"] = (int(cc[0]), int(cc[1])) if cc is not None else None
        for key, fn in (
            ("pcie_gen_current", "nvmlDeviceGetCurrPcieLinkGeneration"),
            ("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
            ("pcie_width_current", "nvmlDeviceGetCurrPcieLinkWidth"),
            ("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth"),
        ):
            value = reader.get(key, fn, handle)
            facts[key] = int(value) if value is not None else None
        mode = reader.get("ecc_mode", "nvmlDeviceGetEccMode", handle)
        enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
        facts["ecc_enabled"] = (mode[0] == enabled) if mode is not None else None
        if facts["ecc_enabled"]:
            corrected = getattr(nvml, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
            uncorrected = getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
            volatile = getattr(nvml, "NVML_VOLATILE_ECC", 0)
            aggregate = getattr(nvml, "NVML_AGGREGATE_ECC", 1)
            fn = "nvmlDeviceGetTotalEccErrors"
            facts["ecc_corrected_volatile"] = reader.get(
                "ecc_corrected", fn, handle, corrected, volatile
            )
            facts["ecc_uncorrected_volatile"] = reader.get(
                "ecc_uncorrected", fn, handle, uncorrected, volatile
            )
            facts["ecc_uncorrected_aggregate"] = reader.get(
                "ecc_uncorrected_aggregate", fn, handle, uncorrected, aggregate
            )
        sensor = getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
        temp = reader.get("temperature", "nvmlDeviceGetTemperature", handle, sensor)
        facts["temperature_c"] = int(temp) if temp is not None else None
        facts["nvlink_links_active"], facts["nvlink_links_total"] = _nvlink(reader, handle)
    except _GpuLost:
        return GpuFacts(index=index, lost=True, errors=tuple(reader.errors), **facts)
    return GpuFacts(index=index, errors=tuple(reader.errors), **facts)


def _init_failure(nvml: Any, exc: BaseException) -> Inventory:
    name = _error_name(exc)
    if isinstance(exc, getattr(nvml, "NVMLError_LibraryNotFound", ())):
        return Inventory("no_library", f"NVML library not found ({name})")
    if isinstance(exc, getattr(nvml, "NVMLError_DriverNotLoaded", ())):
        return Inventory("no_driver", f"NVIDIA driver not loaded ({name})")
    return Inventory("error", f"NVML init failed ({name})")


def read_inventory(nvml: Any = None) -> Inventory:
    """Static facts about every GPU; never raises (a missing library is a state, not an error)."""
    if nvml is None:
        try:
            import pynvml as nvml  # lazy: CPU-only machines never load it otherwise
        except ImportError as exc:
            return Inventory("no_library", f"nvidia-ml-py is not installed ({exc})")
    try:
        nvml.nvmlInit()
    except Exception as exc:
        return _init_failure(nvml, exc)
    try:
        reader = _Reader(nvml)
        driver = reader.get("driver", "nvmlSystemGetDriverVersion")
        cuda = reader.get("cuda", "nvmlSystemGetCudaDriverVersion")
        count = reader.get("count", "nvmlDeviceGetCount")
        gpus = tuple(_read_gpu(nvml, i) for i in range(int(count or 0)))
        detail = "; ".join(reader.errors)
        return Inventory(
            "ok" if count is not None else "error",
            detail,
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
