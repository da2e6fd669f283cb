"""Typed application keys: every service the handlers use, never module globals."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from appliance.config import Config
from appliance.domain.gpu_sample import Telemetry
from appliance.domain.latency_window import LatencyWindow
from appliance.ports import Tokenizer
from appliance.precheck import CheckResult
from appliance.services.admission import AdmissionQueue
from appliance.services.control_loop import ControlLoop
from appliance.services.events import EventBus
from appliance.services.history import HistorySampler
from appliance.services.metrics import Metrics
from appliance.services.store import StateStore
from appliance.services.supervisor import EngineSupervisor
from appliance.services.telemetry_loop import TelemetryLoop
from maintenance.restart import EngineRssBaseline
from maintenance.scheduler import MaintenanceScheduler


@dataclass
class Services:
    """The daemon's long-lived parts, built once in build_app."""

    config: Config
    model_name: str
    tokenizer: Tokenizer
    events: EventBus
    metrics: Metrics
    admission: AdmissionQueue
    supervisor: EngineSupervisor
    telemetry: Telemetry
    telemetry_loop: TelemetryLoop
    admin_token: str
    started_at_s: float
    store: StateStore
    controller: ControlLoop
    latency: LatencyWindow
    slo_ttft_p99_s: float
    slo_tpot_p99_s: float
    restart_task: asyncio.Task[float] | None = None
    prechecks: list[CheckResult] = field(default_factory=list)
    # Set in the maintenance cleanup context (they need the running loop).
    history: HistorySampler = None  # type: ignore[assignment]
    scheduler: MaintenanceScheduler = None  # type: ignore[assignment]
    # The engine's RSS right after its latest start: the restart job's growth baseline.
    engine_rss_baseline: EngineRssBaseline | None = None
    # The throughput knee from the last benchmark: the concurrency ceiling. Stored with the
    # benchmark and reloaded at start (maintenance_ctx), so a restart does not forget it.
    ceiling: int | None = None
    background: set[asyncio.Task[Any]] = field(default_factory=set)

    def set_ceiling(self, limit: int, source: str = "the benchmark knee") -> None:
        """Hand the benchmark's knee on as the concurrency ceiling."""
        self.ceiling = limit
        self.events.emit(
            "ceiling", f"concurrency ceiling set to {limit} from {source}", ceiling=limit
        )


SERVICES = web.AppKey("services", Services)
