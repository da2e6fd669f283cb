"""Scrape-time Prometheus view of the telemetry loop: per-GPU gauges and counters, derate,
energy. A field the GPU does not report (None) leaves its series out for that GPU."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from appliance.domain.gpu_sample import GpuSample
from appliance.services.telemetry_loop import TelemetryLoop

# NVML's PCIe and NVLink figures are KiB/s; Prometheus wants bytes.
_KIB = 1024.0

# (series, help, GpuSample field, scale)
_PER_GPU = (
    ("appliance_gpu_temperature_celsius", "GPU core temperature", "core_temp_c", 1.0),
    ("appliance_gpu_memory_temperature_celsius", "GPU HBM temperature", "mem_temp_c", 1.0),
    ("appliance_gpu_power_watts", "GPU power draw", "power_w", 1.0),
    ("appliance_gpu_power_limit_watts", "GPU enforced power limit", "power_limit_w", 1.0),
    ("appliance_gpu_utilization_ratio", "GPU utilisation (0..1)", "gpu_util_pct", 0.01),
    (
        "appliance_gpu_memory_bandwidth_utilization_ratio",
        "Share of time HBM was read or written (NVML utilization.memory, 0..1)",
        "mem_bw_util_pct",
        0.01,
    ),
    ("appliance_gpu_memory_used_bytes", "GPU memory in use", "mem_used_bytes", 1.0),
    ("appliance_gpu_sm_clock_hertz", "SM clock", "sm_clock_mhz", 1e6),
    (
        "appliance_gpu_slowdown_temperature_celsius",
        "The GPU's own slowdown threshold",
        "slowdown_temp_c",
        1.0,
    ),
    ("appliance_gpu_nvlink_links_active", "NVLink links up", "nvlink_active", 1.0),
    (
        "appliance_gpu_nvlink_utilization_ratio",
        "NVLink use: the busier direction over what the active links carry (0..1)",
        "nvlink_util_pct",
        0.01,
    ),
)
# (series, help, {direction: GpuSample field}): throughput gauges in bytes per second.
_PER_DIRECTION = (
    (
        "appliance_gpu_pcie_bytes_per_second",
        "PCIe throughput (NVML samples it over 20 ms, re-read every pcie_throughput_interval_s)",
        {"tx": "pcie_tx_kb_s", "rx": "pcie_rx_kb_s"},
    ),
    (
        "appliance_gpu_nvlink_bytes_per_second",
        "NVLink data throughput over every link, across the last sampling interval",
        {"tx": "nvlink_tx_kb_s", "rx": "nvlink_rx_kb_s"},
    ),
)
# ECC counts: (type, counter) -> GpuSample field.
_ECC = {
    ("corrected", "volatile"): "ecc_corrected_volatile",
    ("uncorrected", "volatile"): "ecc_uncorrected_volatile",
    ("corrected", "aggregate"): "ecc_corrected_aggregate",
    ("uncorrected", "aggregate"): "ecc_uncorrected_aggregate",
}
_GPU_LABELS = ["gpu", "simulated"]


def _gpu_labels(s: GpuSample) -> list[str]:
    return [str(s.index), str(s.simulated).lower()]


def _readings(samples: Sequence[GpuSample], field: str) -> Iterator[tuple[GpuSample, float]]:
    """(sample, value) for every GPU that answers and reports the field."""
    for s in samples:
        value = getattr(s, field)
        if value is not None and not s.lost:
            yield s, float(value)


def gpu_families(samples: Sequence[GpuSample]) -> Iterator[Metric]:
    """Every per-GPU series of one set of samples."""
    for name, help_text, field, scale in _PER_GPU:
        fam = GaugeMetricFamily(name, help_text, labels=_GPU_LABELS)
        for s, value in _readings(samples, field):
            fam.add_metric(_gpu_labels(s), value * scale)
        yield fam
    for name, help_text, fields in _PER_DIRECTION:
        fam = GaugeMetricFamily(name, help_text, labels=[*_GPU_LABELS, "direction"])
        for direction, field in fields.items():
            for s, value in _readings(samples, field):
                fam.add_metric([*_gpu_labels(s), direction], value * _KIB)
        yield fam
    ecc = CounterMetricFamily(
        "appliance_gpu_ecc_errors",
        "GPU memory ECC errors (volatile: since the driver loaded; aggregate: board lifetime)",
        labels=[*_GPU_LABELS, "type", "counter"],
    )
    for (kind, counter), field in _ECC.items():
        for s, value in _readings(samples, field):
            ecc.add_metric([*_gpu_labels(s), kind, counter], value)
    yield ecc
    xid = CounterMetricFamily(
        "appliance_gpu_xid_errors",
        "Critical Xid events the driver reported since the daemon started",
        labels=_GPU_LABELS,
    )
    for s, value in _readings(samples, "xid_errors"):
        xid.add_metric(_gpu_labels(s), value)
    yield xid
    lost = GaugeMetricFamily(
        "appliance_gpu_lost", "1 when the GPU fell off the bus", labels=["gpu"]
    )
    for s in samples:
        lost.add_metric([str(s.index)], 1.0 if s.lost else 0.0)
    yield lost


class TelemetryCollector:
    """Reads the loop's latest samples at scrape time; missing fields are left out."""

    def __init__(self, loop: TelemetryLoop) -> None:
        self._loop = loop

    def collect(self) -> Iterator[Metric]:
        yield from gpu_families(self._loop.latest_samples)
        state = self._loop.thermal_state
        yield GaugeMetricFamily(
            "appliance_derate_level", "0 normal, 1 derate, 2 protect", value=state.level.severity
        )
        yield GaugeMetricFamily(
            "appliance_derate_factor",
            "Multiplier applied to the concurrency limit",
            value=state.factor,
        )
        energy = CounterMetricFamily(
            "appliance_energy_joules", "GPU energy used since the daemon started"
        )
        energy.add_metric([], self._loop.energy_total_j)
        yield energy
        per_token = self._loop.energy_per_token.recent_j()
        fam = GaugeMetricFamily(
            "appliance_energy_per_token_joules",
            "GPU energy per generated token over the last minute (absent while idle)",
        )
        if per_token is not None:
            fam.add_metric([], per_token)
        yield fam
