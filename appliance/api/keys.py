"""Typed application keys: every service the handlers use, never module globals."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web

from appliance.config import Config
from appliance.domain.gpu_sample import Telemetry
from appliance.ports import Tokenizer
from appliance.precheck import CheckResult
from appliance.services.admission import AdmissionQueue
from appliance.services.events import EventBus
from appliance.services.metrics import Metrics
from appliance.services.supervisor import EngineSupervisor
from appliance.services.telemetry_loop import TelemetryLoop


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
    restart_task: asyncio.Task[float] | None = None
    prechecks: list[CheckResult] = field(default_factory=list)


SERVICES = web.AppKey("services", Services)
