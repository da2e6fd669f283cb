"""The early-warning series (services/early_warning.py sets them), every label set created at
start so a rule sees 0 before the first finding instead of an absent series."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge

from appliance.domain.precursors import OOM_RESOURCES, SPIKE_METRICS

WARNING_KINDS = ("oom_precursor", "latency_spike")


class EarlyWarningSeries:
    """appliance_oom_precursor, appliance_oom_eta_seconds, appliance_latency_spike_active and
    appliance_early_warnings_total, in the daemon's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.oom_precursor = Gauge(
            "appliance_oom_precursor",
            "1 while memory grows toward its limit fast enough to reach it within the horizon",
            ["resource"],
            registry=r,
        )
        self.oom_eta_seconds = Gauge(
            "appliance_oom_eta_seconds",
            "Seconds until the memory limit at the current slope (+Inf: not growing; "
            "NaN: too few samples)",
            ["resource"],
            registry=r,
        )
        self.latency_spike_active = Gauge(
            "appliance_latency_spike_active",
            "1 while a latency P99 is far above its recent baseline",
            ["metric"],
            registry=r,
        )
        self.early_warnings_total = Counter(
            "appliance_early_warnings",
            "Early warnings raised (each finding once, when it starts)",
            ["kind"],
            registry=r,
        )
        for resource in OOM_RESOURCES.values():
            self.oom_precursor.labels(resource).set(0)
            self.oom_eta_seconds.labels(resource).set(math.nan)
        for metric in SPIKE_METRICS.values():
            self.latency_spike_active.labels(metric).set(0)
        for kind in WARNING_KINDS:
            self.early_warnings_total.labels(kind)
