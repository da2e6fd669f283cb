"""NVML adapter against the real `pynvml` module with its C calls patched to a fake GPU.

The error classes, constants and ctypes structures are pynvml's own; only the functions that
would reach libnvidia-ml are replaced. Both readers of the one adapter run against the same
fake: the telemetry sampler and the pre-check's inventory. The last tests run the untouched
module on this machine, which has no NVIDIA driver.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml
import pytest

from appliance.adapters.nvml import NvmlTelemetry, read_inventory

MIB = 2**20


@dataclass
class FakeGpu:
    uuid: str = "GPU-5f3c2a91-7d4e-4b1a-9c3f-2e8d6a1b0c47"
    name: str = "NVIDIA H100 80GB HBM3"
    temp_c: int = 71
    mem_temp_c: int = 79
    mem_temp_return: int = pynvml.NVML_SUCCESS
    thresholds: dict[int, int] = field(
        default_factory=lambda: {
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 90,
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 92,
            pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: 95,
        }
    )
    power_mw: int = 612_345
    limit_mw: int = 700_000
    energy_mj: int = 987_654_321
    sm_mhz: int = 1980
    mem_mhz: int = 2619
    util: tuple[int, int] = (97, 61)
    mem: tuple[int, int] = (74_215 * MIB, 81_559 * MIB)  # used, total
    pcie: tuple[int, int, int, int] = (5, 5, 16, 16)  # gen, gen max, width, width max
    pcie_kb_s: tuple[int, int] = (1_200, 34_000)  # tx, rx
    nvlinks: tuple[int, ...] = (1,) * 18
    reasons: int = (
        pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwThermalSlowdown
    )
    # (error type, counter type) -> count; corrected, uncorrected x volatile, aggregate
    ecc: dict[tuple[int, int], int] = field(
        default_factory=lambda: {
            (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC): 7,
            (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC): 0,
            (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC): 1_234,
            (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC): 2,
        }
    )
    nvlink_kib: tuple[int, int] = (10_000_000, 20_000_000)  # TX, RX counters over all links
    nvlink_speed_mbps: int = 25_781  # per link and direction (H100)
    nvlink_return: int = pynvml.NVML_SUCCESS  # the throughput fields' own return code
    cc: tuple[int, int] = (9, 0)
    ecc_mode: tuple[int, int] = (1, 1)  # current, pending
    xid_supported: bool = True
    # pynvml function name -> exception raised on every call
    errors: dict[str, BaseException] = field(default_factory=dict)


class FakeNvml:
    """Patches pynvml's library-calling functions onto a list of FakeGpu; counts calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.calls: Counter[str] = Counter()
        self.fields_asked: Counter[int] = Counter()  # nvmlDeviceGetFieldValues, per field id
        self.init_error: BaseException | None = None
        self.xid_queue: list[tuple[int, int]] = []  # (gpu index, xid code)
        self.shutdowns = 0
        for name in dir(self):
            if name.startswith("nvml"):
                monkeypatch.setattr(pynvml, name, self._wrap(name, getattr(self, name)))

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            self.calls[name] += 1
            if args and isinstance(args[0], int) and 0 <= args[0] < len(self.gpus):
                err = self.gpus[args[0]].errors.get(name)
                if err is not None:
                    raise err
            return fn(*args)

        return call

    # library and system (method names are pynvml's own)
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.86.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12080

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i  # the handle is the index, so errors can be looked up per GPU

    # identity and readings
    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.gpus[h].uuid

    def nvmlDeviceGetName(self, h: int) -> str:
        return self.gpus[h].name

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self.gpus[h].temp_c

    def nvmlDeviceGetFieldValues(self, h: int, ids: list[Any]) -> Any:
        g = self.gpus[h]
        values = (pynvml.c_nvmlFieldValue_t * len(ids))()
        for v, wanted in zip(values, ids, strict=True):
            field_id, scope = wanted if isinstance(wanted, tuple) else (wanted, 0)
            self.fields_asked[field_id] += 1
            v.fieldId, v.scopeId = field_id, scope
            v.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
            v.nvmlReturn = pynvml.NVML_SUCCESS
            if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP:
                v.nvmlReturn, v.value.uiVal = g.mem_temp_return, g.mem_temp_c
            elif field_id == pynvml.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON:
                v.value.uiVal = g.nvlink_speed_mbps
            else:
                assert scope == 0xFFFFFFFF  # the sum over every link
                tx = field_id == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
                assert tx or field_id == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
                v.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                v.nvmlReturn, v.value.ullVal = g.nvlink_return, g.nvlink_kib[0 if tx else 1]
        return values

    def nvmlDeviceGetTemperatureThreshold(self, h: int, kind: int) -> int:
        return self.gpus[h].thresholds[kind]

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self.gpus[h].power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return self.gpus[h].limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        return self.gpus[h].energy_mj

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        return self.gpus[h].sm_mhz if kind == pynvml.NVML_CLOCK_SM else self.gpus[h].mem_mhz

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        u = pynvml.c_nvmlUtilization_t()
        u.gpu, u.memory = self.gpus[h].util
        return u

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        m = pynvml.c_nvmlMemory_t()
        m.used, m.total = self.gpus[h].mem
        m.free = m.total - m.used
        return m

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self.gpus[h].pcie[0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self.gpus[h].pcie[1]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self.gpus[h].pcie[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self.gpus[h].pcie[3]

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        return self.gpus[h].pcie_kb_s[0 if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else 1]

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        links = self.gpus[h].nvlinks
        if not links:
            raise pynvml.NVMLError_NotSupported()
        if link >= len(links):
            raise pynvml.NVMLError_InvalidArgument()
        return links[link]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self.gpus[h].reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return self.gpus[h].reasons

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        return self.gpus[h].ecc[(kind, counter)]

    # static facts the inventory reads
    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return self.gpus[h].cc

    def nvmlDeviceGetEccMode(self, h: int) -> list[int]:
        return list(self.gpus[h].ecc_mode)

    # Xid events
    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceGetSupportedEventTypes(self, h: int) -> int:
        return pynvml.nvmlEventTypeXidCriticalError if self.gpus[h].xid_supported else 0

    def nvmlDeviceRegisterEvents(self, h: int, bits: int, es: str) -> None:
        assert bits == pynvml.nvmlEventTypeXidCriticalError and es == "event-set"

    def nvmlEventSetWait_v2(self, es: str, timeout_ms: int) -> Any:
        assert timeout_ms == 0  # never block the sampling thread
        if not self.xid_queue:
            raise pynvml.NVMLError_Timeout()
        gpu, code = self.xid_queue.pop(0)
        data = pynvml.c_nvmlEventData_t()
        data.eventType = pynvml.nvmlEventTypeXidCriticalError
        data.eventData = code
        # A real handle is a pointer; the fake's are indices, carried on the side.
        self._event_gpu = gpu
        return data

    def nvmlEventSetFree(self, es: str) -> None:
        pass


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    f = FakeNvml(monkeypatch, [FakeGpu(), FakeGpu(uuid="GPU-second", temp_c=65)])
    # The event's device is a ctypes pointer; map it back to the GPU the fake queued.
    real_uuid = pynvml.nvmlDeviceGetUUID

    def uuid_of(h: Any) -> str:
        if isinstance(h, int):
            return real_uuid(h)
        return f.gpus[f._event_gpu].uuid

    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", uuid_of)
    return f


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_reads_every_field_with_units(fake: FakeNvml) -> None:
    nv = NvmlTelemetry()
    assert nv.available and nv.error is None and nv.gpu_count == 2
    assert nv.driver_version == "570.86.15" and nv.cuda_driver_version == 12080
    s, s2 = nv.sample()
    assert (s.index, s.uuid, s.name, s.simulated, s.lost) == (
        0,
        "GPU-5f3c2a91-7d4e-4b1a-9c3f-2e8d6a1b0c47",
        "NVIDIA H100 80GB HBM3",
        False,
        False,
    )
    assert s2.uuid == "GPU-second" and s2.core_temp_c == 65
    assert s.core_temp_c == 71 and s.mem_temp_c == 79
    assert (s.slowdown_temp_c, s.shutdown_temp_c, s.mem_max_temp_c) == (90, 92, 95)
    assert s.power_w == pytest.approx(612.345) and s.power_limit_w == 700.0
    assert s.energy_j == pytest.approx(987_654.321)
    assert (s.sm_clock_mhz, s.mem_clock_mhz) == (1980, 2619)
    assert (s.gpu_util_pct, s.mem_bw_util_pct) == (97, 61)
    assert (s.mem_used_bytes, s.mem_total_bytes) == (74_215 * MIB, 81_559 * MIB)
    assert (s.pcie_gen, s.pcie_gen_max, s.pcie_width, s.pcie_width_max) == (5, 5, 16, 16)
    assert (s.pcie_tx_kb_s, s.pcie_rx_kb_s) == (1200, 34000)
    assert s.nvlink_active == 18
    # NVLink rates need two readings of NVML's counters.
    assert (s.nvlink_tx_kb_s, s.nvlink_rx_kb_s, s.nvlink_util_pct) == (None, None, None)
    assert s.throttle_reasons == ("sw_power_cap", "hw_thermal_slowdown")
    assert (s.ecc_corrected_volatile, s.ecc_uncorrected_volatile) == (7, 0)
    assert (s.ecc_corrected_aggregate, s.ecc_uncorrected_aggregate) == (1_234, 2)
    assert s.xid_errors == 0
    assert s.unsupported == () and s.invalid == ()
    nv.close()
    nv.close()
    assert fake.shutdowns == 1 and not nv.available


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (pynvml.NVMLError_LibraryNotFound(), "library not found"),
        (pynvml.NVMLError_DriverNotLoaded(), "driver not loaded"),
        (pynvml.NVMLError_NoPermission(), "no permission"),
        (pynvml.NVMLError_Unknown(), "NVML init failed: Unknown (NVML error 999)"),
    ],
)
def test_nvml_missing_is_state(fake: FakeNvml, error: BaseException, text: str) -> None:
    fake.init_error = error
    nv = NvmlTelemetry()
    assert not nv.available and text in (nv.error or "")
    assert nv.sample() == []
    assert nv.status()["available"] is False
    nv.close()
    assert fake.shutdowns == 0  # never initialised, so nothing to shut down


def test_not_supported_is_recorded_and_not_asked_again(fake: FakeNvml) -> None:
    g = fake.gpus[0]
    g.mem_temp_return = pynvml.NVML_ERROR_NOT_SUPPORTED  # per-field return in FieldValues
    g.errors["nvmlDeviceGetTotalEnergyConsumption"] = pynvml.NVMLError_NotSupported()
    g.errors["nvmlDeviceGetTotalEccErrors"] = pynvml.NVMLError_NotSupported()  # ECC off
    g.nvlinks = ()
    g.xid_supported = False
    nv = NvmlTelemetry()
    for _ in range(3):
        s = nv.sample()[0]
    assert s.mem_temp_c is None and s.energy_j is None and s.ecc_uncorrected_volatile is None
    assert s.nvlink_active is None and s.nvlink_util_pct is None and s.xid_errors is None
    assert set(s.unsupported) == {
        "mem_temp_c",
        "energy_j",
        "ecc_corrected_volatile",
        "ecc_uncorrected_volatile",
        "ecc_corrected_aggregate",
        "ecc_uncorrected_aggregate",
        "nvlink_active",
        "nvlink_tx_kb_s",
        "nvlink_rx_kb_s",
        "nvlink_util_pct",
        "xid_errors",
    }
    assert s.invalid == ()
    assert s.core_temp_c == 71  # everything else still read
    # GPU 1 supports it all and is asked every time; GPU 0 only once.
    assert fake.fields_asked[pynvml.NVML_FI_DEV_MEMORY_TEMP] == 1 + 3
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 4 + 4 * 3
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1 + 3
    assert nv.status()["gpus"][0]["unsupported"] == sorted(s.unsupported)


def test_gpu_lost_yields_lost_samples_and_other_gpus_carry_on(fake: FakeNvml) -> None:
    nv = NvmlTelemetry()
    assert not any(s.lost for s in nv.sample())
    fake.gpus[1].errors["nvmlDeviceGetTemperature"] = pynvml.NVMLError_GpuIsLost()
    a, b = nv.sample()
    assert not a.lost and a.core_temp_c == 71
    assert b.lost and b.uuid == "GPU-second" and b.core_temp_c is None
    calls = fake.calls["nvmlDeviceGetTemperature"]
    a, b = nv.sample()
    assert b.lost
    assert fake.calls["nvmlDeviceGetTemperature"] == calls + 1  # the lost GPU is left alone
    assert nv.status()["gpus"][1]["lost"] is True


def test_gpu_lost_in_a_field_value_return(fake: FakeNvml) -> None:
    fake.gpus[0].mem_temp_return = pynvml.NVML_ERROR_GPU_IS_LOST
    nv = NvmlTelemetry()
    assert nv.sample()[0].lost


def test_gpu_lost_at_start(fake: FakeNvml) -> None:
    fake.gpus[1].errors["nvmlDeviceGetHandleByIndex"] = pynvml.NVMLError_GpuIsLost()
    nv = NvmlTelemetry()
    assert nv.available and [s.lost for s in nv.sample()] == [False, True]


# -- one definition of a lost GPU, for the sampler and the inventory alike -------------------

LOST_ERRORS = [pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_ResetRequired]
LOST_ERRORS.append(pynvml.NVMLError_GpuNotFound)


@pytest.mark.parametrize("error", LOST_ERRORS)
@pytest.mark.parametrize("function", ["nvmlDeviceGetTemperature", "nvmlDeviceGetNvLinkState"])
def test_sampler_and_inventory_agree_a_gpu_is_lost(
    fake: FakeNvml, error: type[BaseException], function: str
) -> None:
    fake.gpus[1].errors[function] = error()
    nv = NvmlTelemetry()
    assert [s.lost for s in nv.sample()] == [False, True]
    nv.close()
    inv = read_inventory()
    assert inv.state == "ok"
    assert [g.lost for g in inv.gpus] == [False, True]
    lost = inv.gpus[1]
    # What was read before the loss is kept: the board can still be named.
    assert lost.name == "NVIDIA H100 80GB HBM3" and lost.uuid == "GPU-second"
    assert any(e.endswith(error.__name__.removeprefix("NVMLError_")) for e in lost.errors)


@pytest.mark.parametrize("error", LOST_ERRORS)
def test_a_gpu_lost_at_its_handle_is_lost_for_both(
    fake: FakeNvml, error: type[BaseException]
) -> None:
    fake.gpus[0].errors["nvmlDeviceGetHandleByIndex"] = error()
    assert [s.lost for s in NvmlTelemetry().sample()] == [True, False]
    assert [g.lost for g in read_inventory().gpus] == [True, False]


@pytest.mark.parametrize(
    "error", [pynvml.NVMLError_Unknown, pynvml.NVMLError_Timeout, pynvml.NVMLError_NotSupported]
)
def test_sampler_and_inventory_agree_other_errors_are_not_a_lost_gpu(
    fake: FakeNvml, error: type[BaseException]
) -> None:
    fake.gpus[1].errors["nvmlDeviceGetTemperature"] = error()
    s = NvmlTelemetry().sample()[1]
    assert not s.lost and s.core_temp_c is None and s.power_w is not None
    g = read_inventory().gpus[1]
    assert not g.lost and g.temperature_c is None and g.nvlink_links_total == 18
    assert f"temperature: {error.__name__.removeprefix('NVMLError_')}" in g.errors


def test_inventory_reads_the_same_gpus_the_sampler_does(fake: FakeNvml) -> None:
    samples = NvmlTelemetry().sample()
    inv = read_inventory()
    assert inv.driver_version == "570.86.15" and inv.cuda_driver_version == "12.8"
    assert [g.uuid for g in inv.gpus] == [s.uuid for s in samples]
    for g, s in zip(inv.gpus, samples, strict=True):
        assert g.errors == () and not g.lost
        assert g.memory_total_bytes == s.mem_total_bytes
        assert g.temperature_c == s.core_temp_c
        assert (g.pcie_gen_current, g.pcie_gen_max, g.pcie_width_current, g.pcie_width_max) == (
            s.pcie_gen,
            s.pcie_gen_max,
            s.pcie_width,
            s.pcie_width_max,
        )
        assert g.nvlink_links_active == s.nvlink_active == 18
        assert g.ecc_uncorrected_volatile == s.ecc_uncorrected_volatile == 0
        assert g.ecc_corrected_volatile == s.ecc_corrected_volatile == 7
    assert fake.shutdowns == 1  # the inventory opens NVML and shuts it again


def test_unknown_error_is_transient_and_logged_once(
    fake: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="appliance.adapters.nvml")
    fake.gpus[0].errors["nvmlDeviceGetPowerUsage"] = pynvml.NVMLError_Unknown()
    nv = NvmlTelemetry()
    for _ in range(3):
        s = nv.sample()[0]
        assert s.power_w is None and s.invalid == ("power_w",)
        assert "power_w" not in s.unsupported
    assert sum("power_w" in r.getMessage() for r in caplog.records) == 1
    del fake.gpus[0].errors["nvmlDeviceGetPowerUsage"]
    s = nv.sample()[0]
    assert s.power_w == pytest.approx(612.345) and s.invalid == ()


def test_timeout_and_foreign_exceptions_do_not_escape(fake: FakeNvml) -> None:
    fake.gpus[0].errors["nvmlDeviceGetClockInfo"] = pynvml.NVMLError_Timeout()
    fake.gpus[0].errors["nvmlDeviceGetUtilizationRates"] = OSError("ioctl failed")
    s = NvmlTelemetry().sample()[0]
    assert s.sm_clock_mhz is None and s.gpu_util_pct is None and s.mem_bw_util_pct is None
    assert {"sm_clock_mhz", "mem_clock_mhz", "gpu_util_pct", "mem_bw_util_pct"} <= set(s.invalid)


@pytest.mark.parametrize(
    ("attr", "value", "field_name"),
    [
        ("temp_c", -5, "core_temp_c"),
        ("temp_c", 0, "core_temp_c"),
        ("temp_c", 4_294_967_295, "core_temp_c"),
        ("mem_temp_c", 255, "mem_temp_c"),
        ("power_mw", 10**12, "power_w"),
        ("limit_mw", 0, "power_limit_w"),
        ("sm_mhz", 65_535_000, "sm_clock_mhz"),
        ("util", (150, 61), "gpu_util_pct"),
        ("mem", (90_000 * MIB, 81_559 * MIB), "mem_used_bytes"),
        ("pcie", (0, 5, 16, 16), "pcie_gen"),
        ("pcie_kb_s", (2**32 - 1, 10), "pcie_tx_kb_s"),
    ],
)
def test_odd_values_become_invalid_and_are_logged_once(
    fake: FakeNvml,
    caplog: pytest.LogCaptureFixture,
    attr: str,
    value: Any,
    field_name: str,
) -> None:
    caplog.set_level(logging.WARNING, logger="appliance.adapters.nvml")
    setattr(fake.gpus[0], attr, value)
    nv = NvmlTelemetry(pcie_throughput_interval_s=0.001)
    for _ in range(3):
        s = nv.sample()[0]
        assert getattr(s, field_name) is None
        assert field_name in s.invalid
    odd = [r for r in caplog.records if "implausible" in r.getMessage()]
    assert len(odd) == 1 and field_name in odd[0].getMessage()


def test_ecc_counts_by_type_and_counter_and_an_odd_one_is_invalid(fake: FakeNvml) -> None:
    g = fake.gpus[0]
    g.ecc[(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)] = 2**64 - 1
    s = NvmlTelemetry().sample()[0]
    assert s.ecc_uncorrected_volatile is None and s.invalid == ("ecc_uncorrected_volatile",)
    # The other three counters still read.
    assert (s.ecc_corrected_volatile, s.ecc_corrected_aggregate) == (7, 1_234)
    assert s.ecc_uncorrected_aggregate == 2


def test_nvlink_rates_and_use_come_from_two_readings(fake: FakeNvml) -> None:
    clock = Clock()
    nv = NvmlTelemetry(monotonic=clock)
    assert nv.sample()[0].nvlink_tx_kb_s is None
    g = fake.gpus[0]
    clock.now += 10
    g.nvlink_kib = (g.nvlink_kib[0] + 1_000_000, g.nvlink_kib[1] + 4_000_000)
    s = nv.sample()[0]
    assert (s.nvlink_tx_kb_s, s.nvlink_rx_kb_s) == (100_000, 400_000)
    # The busier direction over 18 links at 25,781 MB/s each.
    assert s.nvlink_util_pct == pytest.approx(100 * 400_000 * 1024 / (18 * 25_781e6))
    # A counter that went back (the driver reloaded) gives no rate until it counts again.
    clock.now += 10
    g.nvlink_kib = (5, 5)
    s = nv.sample()[0]
    assert (s.nvlink_tx_kb_s, s.nvlink_util_pct) == (None, None) and s.invalid == ()
    clock.now += 10
    g.nvlink_kib = (5 + 2_000, 5)
    assert nv.sample()[0].nvlink_tx_kb_s == 200


def test_nvlink_without_throughput_fields_or_speed(fake: FakeNvml) -> None:
    clock = Clock()
    fake.gpus[0].nvlink_return = pynvml.NVML_ERROR_NOT_SUPPORTED  # an older driver
    fake.gpus[1].nvlink_speed_mbps = 0
    nv = NvmlTelemetry(monotonic=clock)
    nv.sample()
    clock.now += 1
    a, b = nv.sample()
    assert a.nvlink_active == 18 and a.nvlink_util_pct is None
    assert {"nvlink_tx_kb_s", "nvlink_rx_kb_s", "nvlink_util_pct"} <= set(a.unsupported)
    # No plausible link speed: the rates stand, the share of capacity cannot be had.
    assert b.nvlink_tx_kb_s == 0 and b.nvlink_util_pct is None
    assert b.invalid == ("nvlink_util_pct",)


def test_odd_threshold_is_read_again(fake: FakeNvml) -> None:
    fake.gpus[0].thresholds[pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN] = 0
    nv = NvmlTelemetry()
    assert nv.sample()[0].slowdown_temp_c is None
    fake.gpus[0].thresholds[pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN] = 88
    assert nv.sample()[0].slowdown_temp_c == 88
    calls = fake.calls["nvmlDeviceGetTemperatureThreshold"]
    nv.sample()
    assert fake.calls["nvmlDeviceGetTemperatureThreshold"] == calls  # all cached now


def test_throttle_reasons_fall_back_to_the_older_call(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.gpus[0].errors["nvmlDeviceGetCurrentClocksEventReasons"] = (
        pynvml.NVMLError_FunctionNotFound()
    )
    nv = NvmlTelemetry()
    assert nv.sample()[0].throttle_reasons == ("sw_power_cap", "hw_thermal_slowdown")
    nv.sample()
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 2
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1 + 2  # once on GPU 0
    # A pynvml so old it lacks the newer name entirely.
    monkeypatch.delattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons")
    fake.gpus[1].reasons = pynvml.nvmlClocksThrottleReasonGpuIdle | 0x1000
    assert NvmlTelemetry().sample()[1].throttle_reasons == ("gpu_idle", "other_0x1000")


def test_xid_events_are_counted_per_gpu(fake: FakeNvml, caplog: pytest.LogCaptureFixture) -> None:
    nv = NvmlTelemetry()
    assert [s.xid_errors for s in nv.sample()] == [0, 0]
    fake.xid_queue = [(1, 79)]
    assert [s.xid_errors for s in nv.sample()] == [0, 1]
    assert any("Xid 79 on gpu1" in r.getMessage() for r in caplog.records)
    assert [s.xid_errors for s in nv.sample()] == [0, 1]


def test_pcie_throughput_is_read_at_most_every_interval(fake: FakeNvml) -> None:
    clock = Clock()
    nv = NvmlTelemetry(pcie_throughput_interval_s=10.0, monotonic=clock)
    nv.sample()
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 4  # tx + rx on two GPUs
    fake.gpus[0].pcie_kb_s = (5, 6)
    clock.now += 5
    s = nv.sample()[0]
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 4
    assert (s.pcie_tx_kb_s, s.pcie_rx_kb_s) == (1200, 34000)  # the last reading, kept
    clock.now += 5
    s = nv.sample()[0]
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 8
    assert (s.pcie_tx_kb_s, s.pcie_rx_kb_s) == (5, 6)
    off = NvmlTelemetry(pcie_throughput_interval_s=0)
    assert off.sample()[0].pcie_tx_kb_s is None
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 8


def test_missing_function_in_an_old_pynvml_is_unsupported(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(pynvml, "nvmlDeviceGetTotalEnergyConsumption")
    s = NvmlTelemetry().sample()[0]
    assert s.energy_j is None and "energy_j" in s.unsupported


# -- the real module, untouched, on this GPU-less machine -----------------------------


def _nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(_nvml_works(), reason="this machine has a working NVIDIA driver")
def test_real_pynvml_without_a_driver_is_a_clear_state_not_a_crash() -> None:
    nv = NvmlTelemetry()
    assert nv.available is False
    assert nv.error is not None and (
        "library not found" in nv.error or "driver not loaded" in nv.error
    )
    assert nv.sample() == []
    assert nv.gpu_count == 0
    nv.close()


def test_pynvml_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise
    nv = NvmlTelemetry()
    assert not nv.available and "not installed" in (nv.error or "")
    assert nv.sample() == []
    inv = read_inventory()
    assert inv.state == "no_library" and "not installed" in inv.detail


# -- scripts/gpu_sample_check.py -------------------------------------------------------

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_sample_check.py"


def _load_script() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_sample_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_check_script_reports_samples_and_timing(
    fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _load_script().main(["--count", "20"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpu"] is True and out["gpu_count"] == 2
    assert [s["uuid"] for s in out["samples"]] == [g.uuid for g in fake.gpus]
    assert out["samples"][0]["mem_temp_c"] == 79
    timing = out["timing"]
    assert timing["samples"] == 20
    assert 0 < timing["median_ms"] <= timing["p99_ms"] <= timing["max_ms"]
    assert fake.shutdowns == 1


@pytest.mark.skipif(_nvml_works(), reason="this machine has a working NVIDIA driver")
def test_check_script_without_a_gpu_says_so_and_exits_0() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--count", "5"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0
    out = json.loads(proc.stdout)
    assert out["gpu"] is False and out["message"].startswith("no GPU")
