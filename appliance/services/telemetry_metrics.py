"""Scrape-time Prometheus view of the telemetry loop: per-GPU gauges, derate, energy."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from appliance.services.telemetry_loop import TelemetryLoop

# (series, help, GpuSample field, scale)
_PER_GPU = (
    ("appliance_gpu_temperature_celsius", "GPU core temperature", "core_temp_c", 1.0),
    ("appliance_gpu_memory_temperature_celsius", "GPU HBM temperature", "mem_temp_c", 1.0),
    ("appliance_gpu_power_watts", "GPU power draw", "power_w", 1.0),
    ("appliance_gpu_power_limit_watts", "GPU enforced power limit", "power_limit_w", 1.0),
    ("appliance_gpu_utilization_ratio", "GPU utilisation (0..1)", "gpu_util_pct", 0.01),
    ("appliance_gpu_memory_used_bytes", "GPU memory in use", "mem_used_bytes", 1.0),
    ("appliance_gpu_sm_clock_hertz", "SM clock", "sm_clock_mhz", 1e6),
    (
        "appliance_gpu_slowdown_temperature_celsius",
        "The GPU's own slowdown threshold",
        "slowdown_temp_c",
        1.0,
    ),
)


class TelemetryCollector:
    """Reads the loop's latest samples at scrape time; missing fields are left out."""

    def __init__(self, loop: TelemetryLoop) -> None:
        self._loop = loop

    def collect(self) -> Iterator[Metric]:
        samples = self._loop.latest_samples
        for name, help_text, field, scale in _PER_GPU:
            fam = GaugeMetricFamily(name, help_text, labels=["gpu", "simulated"])
            for s in samples:
                value = getattr(s, field)
                if value is not None and not s.lost:
                    fam.add_metric([str(s.index), str(s.simulated).lower()], float(value) * scale)
            yield fam
        lost = GaugeMetricFamily(
            "appliance_gpu_lost", "1 when the GPU fell off the bus", labels=["gpu"]
        )
        for s in samples:
            lost.add_metric([str(s.index)], 1.0 if s.lost else 0.0)
        yield lost
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
