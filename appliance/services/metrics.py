"""The appliance_* Prometheus series, in a registry of our own (vLLM owns the global one)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.registry import Collector

from appliance.domain.lanes import LANE_NAMES
from appliance.services.warning_series import EarlyWarningSeries

# *_created series double the exposition for no operator value.
disable_created_metrics()

# Every status a request is accounted with (api/openai.py: _status_of, _status_of_outcome;
# services/request_ledger.py: final_status), so each series exists before its first request.
REQUEST_STATUSES = (
    "ok",
    "error",
    "cancelled",
    "deadline",
    "deadline_queued",
    "rejected",
    "rate_limited",
    "not_ready",
    "unauthorized",
    "forbidden",
    "bad_request",
)
# Why the supervisor (re)starts an engine: an operator, the maintenance job, a dead engine.
RESTART_CAUSES = ("manual", "maintenance", "engine_dead")
DEADLINE_STAGES = ("queued", "generating")

# Seconds; the CPU engine is slow, a GPU fast: the buckets span both.
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
_TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2)


class Metrics:
    """Counters and histograms updated on the request path; gauges refreshed at scrape."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests_total = Counter(
            "appliance_requests", "Finished requests by outcome", ["status"], registry=r
        )
        self.ttft_seconds = Histogram(
            "appliance_ttft_seconds", "Time to first token", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.tpot_seconds = Histogram(
            "appliance_tpot_seconds",
            "Time per output token after the first",
            buckets=_TPOT_BUCKETS,
            registry=r,
        )
        self.e2e_seconds = Histogram(
            "appliance_e2e_seconds",
            "Request latency, arrival to last token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait_seconds = Histogram(
            "appliance_queue_wait_seconds",
            "Time spent waiting for an engine slot",
            ["priority"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.generated_tokens_total = Counter(
            "appliance_generated_tokens", "Tokens generated", registry=r
        )
        # The same counts as plain numbers, for rates (history, J/token) without the registry.
        self.generated_tokens = 0
        self.arrivals = 0  # requests that reached admission
        self.finished = 0  # of those, answered (any status but rejected/not_ready)
        self.rejected = 0  # 429s
        self.prompt_tokens_total = Counter(
            "appliance_prompt_tokens", "Prompt tokens processed", registry=r
        )
        # vLLM's prefix cache, as `vllm serve` exports it (vllm:prefix_cache_queries/hits).
        self.prefix_cache_queried_tokens_total = Counter(
            "appliance_prefix_cache_queried_tokens", "Prompt tokens looked up", registry=r
        )
        self.prefix_cache_hit_tokens_total = Counter(
            "appliance_prefix_cache_hit_tokens", "Of those, found: prefill skipped", registry=r
        )
        self.deadline_expired_total = Counter(
            "appliance_deadline_expired",
            "Requests whose deadline passed, by lane and where (queued: never ran)",
            ["priority", "stage"],
            registry=r,
        )
        self.audit_dropped_total = Counter(
            "appliance_audit_dropped",
            "Audit records that could not be written (disk or size cap full, queue full)",
            registry=r,
        )
        self.admission_shed_total = Counter(
            "appliance_admission_shed",
            "Requests refused at admission (429 ttft_unreachable) because their first token "
            "would come past the TTFT objective, by lane (auto mode only)",
            ["priority"],
            registry=r,
        )
        self.engine_restarts_total = Counter(
            "appliance_engine_restarts", "Engine restarts by cause", ["cause"], registry=r
        )
        self.maintenance_runs_total = Counter(
            "appliance_maintenance_runs",
            "Maintenance job runs by outcome",
            ["job", "outcome"],
            registry=r,
        )
        self._gauges(r)
        self._known_labels()
        self._refreshers: list[Callable[[], None]] = []
        # The continuous log analysis' findings (services/early_warning.py sets them).
        self.early_warning = EarlyWarningSeries(r)

    def _known_labels(self) -> None:
        """Every known label set at zero from the start: increase() and rate() see the first
        event only when the series existed before it, and a rule sees the series at all."""
        for status in REQUEST_STATUSES:
            self.requests_total.labels(status)
        for lane in LANE_NAMES:
            self.queue_depth.labels(lane)
            self.queue_wait_seconds.labels(lane)
            self.admission_shed_total.labels(lane)
            for stage in DEADLINE_STAGES:
                self.deadline_expired_total.labels(lane, stage)
        for cause in RESTART_CAUSES:
            self.engine_restarts_total.labels(cause)

    def _gauges(self, r: CollectorRegistry) -> None:
        """The gauges a refresher copies live state into before each scrape."""
        self.requests_in_flight = Gauge(
            "appliance_requests_in_flight", "Requests running in the engine", registry=r
        )
        self.queue_depth = Gauge(
            "appliance_queue_depth", "Requests waiting per lane", ["priority"], registry=r
        )
        self.concurrency_limit = Gauge(
            "appliance_concurrency_limit", "How many requests may run at once", registry=r
        )
        self.kv_cache_usage_ratio = Gauge(
            "appliance_kv_cache_usage_ratio", "KV-cache blocks in use (0..1)", registry=r
        )
        self.prefill_outstanding_tokens = Gauge(
            "appliance_prefill_outstanding_tokens",
            "Prompt tokens admitted and still waiting for their first token (estimated)",
            registry=r,
        )
        self.prefill_budget_tokens = Gauge(
            "appliance_prefill_budget_tokens",
            "The controller's cap on those tokens (0: no cap; auto mode sets one)",
            registry=r,
        )
        self.engine_ready = Gauge(
            "appliance_engine_ready", "1 when the engine admits requests", registry=r
        )
        self.engine_running = Gauge(
            "appliance_engine_running_requests", "Requests the engine scheduler runs", registry=r
        )
        self.engine_waiting = Gauge(
            "appliance_engine_waiting_requests", "Requests the engine scheduler holds", registry=r
        )

    def add_collector(self, collector: Collector) -> None:
        """Register a scrape-time collector (e.g. GPU telemetry) in our registry."""
        self.registry.register(collector)

    def add_refresher(self, fn: Callable[[], None]) -> None:
        """Call fn before each scrape to copy live state into gauges."""
        self._refreshers.append(fn)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        for fn in self._refreshers:
            fn()
        return generate_latest(self.registry)
