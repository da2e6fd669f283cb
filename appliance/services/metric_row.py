"""What one metric-history row holds: load, throughput, limits, KV, GPU and host memory,
temperatures and latency percentiles (what recalibration, the load predictor and
`appliance logs analyze` read back)."""

from __future__ import annotations

import time
from typing import Any

from appliance.domain.gpu_sample import GpuSample
from appliance.domain.latency_window import LatencyWindow
from appliance.domain.rates import CounterRates
from appliance.services.admission import AdmissionQueue
from appliance.services.metrics import Metrics
from appliance.services.process_memory import daemon_rss, engine_rss, memory_limit_bytes
from appliance.services.slo import SloMeter
from appliance.services.supervisor import EngineSupervisor
from appliance.services.telemetry_loop import TelemetryLoop


class MetricRows:
    """Builds one row from the live services; rates are per second since the last row."""

    def __init__(
        self,
        admission: AdmissionQueue,
        supervisor: EngineSupervisor,
        telemetry_loop: TelemetryLoop,
        metrics: Metrics,
        latency: LatencyWindow,
        slo: SloMeter | None = None,
    ) -> None:
        self._admission = admission
        self._supervisor = supervisor
        self._telemetry_loop = telemetry_loop
        self._metrics = metrics
        self._latency = latency
        self._slo = slo
        self._rates = CounterRates()

    def row(self) -> dict[str, Any]:
        row = self._admission_fields()
        row.update(self._engine_fields())
        row.update(gpu_fields([g for g in self._telemetry_loop.latest_samples if not g.lost]))
        row["rss_bytes"] = daemon_rss() + engine_rss(self._supervisor)
        row["memory_limit_bytes"] = memory_limit_bytes()
        row.update(self._rate_fields())
        row.update(self._latency_fields())
        if self._slo is not None:
            row.update(self._slo.row_fields())
        return row

    def _admission_fields(self) -> dict[str, Any]:
        adm = self._admission.snapshot()
        return {
            "in_flight": adm.in_flight,
            "queued": sum(adm.queued.values()),
            "queued_realtime": adm.queued["realtime"],
            "limit": adm.limit,
            "base_limit": adm.base_limit,
            "derate_factor": adm.derate_factor,
            "derated": int(adm.derate_factor < 1 or adm.protect),
        }

    def _engine_fields(self) -> dict[str, Any]:
        stats = self._supervisor.stats()
        if stats is None:  # no engine right now (starting, restarting): no engine fields
            return {}
        return {
            "kv_cache_usage_ratio": stats.kv_cache_usage_ratio,
            "running": stats.running,
            "waiting": stats.waiting,
        }

    def _rate_fields(self) -> dict[str, float]:
        m = self._metrics
        per_s = self._rates.sample(
            time.monotonic(),
            {
                "tokens_per_s": m.generated_tokens,
                "requests_per_s": m.finished,
                "arrivals_per_s": m.arrivals,
                "rejected_per_s": m.rejected,
            },
        )
        return {k: round(v, 4) for k, v in per_s.items() if v is not None}

    def _latency_fields(self) -> dict[str, Any]:
        window = self._latency.stats(time.monotonic(), min_samples=1)
        out: dict[str, Any] = {}
        if window.ttft_p99_s is not None:
            out["ttft_p99_s"] = window.ttft_p99_s
            out["ttft_p50_s"] = window.ttft_p50_s
        if window.tpot_p99_s is not None:
            out["tpot_p99_s"] = window.tpot_p99_s
            out["tpot_p50_s"] = window.tpot_p50_s
        out["requests_in_window"] = window.count
        return out


def gpu_fields(gpus: list[GpuSample]) -> dict[str, Any]:
    """Hottest core and HBM, summed power and memory, mean utilisation and bandwidth."""
    out: dict[str, Any] = {}
    temps = [g.core_temp_c for g in gpus if g.core_temp_c is not None]
    mems = [g.mem_temp_c for g in gpus if g.mem_temp_c is not None]
    power = [g.power_w for g in gpus if g.power_w is not None]
    util = [g.gpu_util_pct for g in gpus if g.gpu_util_pct is not None]
    bw = [g.mem_bw_util_pct for g in gpus if g.mem_bw_util_pct is not None]
    used = [g.mem_used_bytes for g in gpus if g.mem_used_bytes is not None]
    total = [g.mem_total_bytes for g in gpus if g.mem_total_bytes]
    if temps:
        out["core_temp_c_max"] = max(temps)
    if mems:
        out["mem_temp_c_max"] = max(mems)
    if power:
        out["power_w"] = sum(power)
    if util:
        out["gpu_util_pct"] = sum(util) / len(util)
    if bw:
        out["mem_bw_util_pct"] = sum(bw) / len(bw)
    if used and total:
        out["gpu_memory_used_bytes"] = sum(used)
        out["gpu_memory_total_bytes"] = sum(total)
        out["mem_used_ratio"] = sum(used) / sum(total)
    return out
