"""The daemon's long-lived parts, built together once by the composition root
(appliance/daemon/compose.py) and never re-assigned: handlers and jobs read them from here."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from appliance.config import Config
from appliance.domain.gpu_sample import Telemetry
from appliance.domain.latency_window import LatencyWindow
from appliance.ports import FaultInjector, Maintenance, Tokenizer
from appliance.precheck import CheckResult
from appliance.services.accounting import RequestAccounting
from appliance.services.admission import AdmissionQueue
from appliance.services.audit_log import AuditLog
from appliance.services.control_loop import ControlLoop
from appliance.services.early_warning import EarlyWarning
from appliance.services.events import EventBus
from appliance.services.key_store import KeyRegistry
from appliance.services.long_context import LongContextRunner
from appliance.services.metric_history import HistorySampler
from appliance.services.metrics import Metrics
from appliance.services.process_memory import EngineRssBaseline
from appliance.services.quotas import Quotas
from appliance.services.request_ledger import RequestLedger
from appliance.services.slo import SloHistory, SloMeter
from appliance.services.store import StateStore
from appliance.services.supervisor import EngineSupervisor
from appliance.services.telemetry_loop import TelemetryLoop
from appliance.services.thresholds import LiveThresholds
from appliance.services.usage import UsageMeter


class BackgroundTasks:
    """Tasks that outlive the HTTP call that started them (a restart, a job run now)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self.restart: asyncio.Task[Any] | None = None

    def keep(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def restart_running(self) -> bool:
        return self.restart is not None and not self.restart.done()

    async def cancel_restart(self) -> None:
        task = self.restart
        if task is None or task.done():
            return
        task.cancel()
        # Cancelled, or it failed on the way out: either way it has ended.
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


@dataclass(frozen=True)
class Tenancy:
    """Who may ask for what: the keys, their per-minute windows, their usage, the audit
    log, and the ledger that closes every call against them."""

    keys: KeyRegistry
    quotas: Quotas
    usage: UsageMeter
    audit: AuditLog | None  # None: audit.enabled is false
    ledger: RequestLedger


@dataclass(frozen=True)
class Slo:
    """The availability SLO: counted live, and read back from the stored history."""

    meter: SloMeter
    history: SloHistory


@dataclass(frozen=True)
class Services:
    """Everything the handlers use; the settings that change live have one owner each
    (the controller's in `controller`, thresholds in `thresholds`)."""

    config: Config
    model_name: str
    tokenizer: Tokenizer
    events: EventBus
    metrics: Metrics
    accounting: RequestAccounting
    admission: AdmissionQueue
    supervisor: EngineSupervisor
    telemetry: Telemetry
    telemetry_loop: TelemetryLoop
    faults: FaultInjector | None  # the simulated GPU's fault switchboard; None on NVML
    admin_token: str
    started_at_s: float
    store: StateStore
    controller: ControlLoop
    latency: LatencyWindow
    history: HistorySampler
    thresholds: LiveThresholds
    maintenance: Maintenance
    rss_baseline: EngineRssBaseline
    long_context: LongContextRunner
    tenancy: Tenancy
    slo: Slo
    early_warning: EarlyWarning
    prechecks: tuple[CheckResult, ...] = ()
    background: BackgroundTasks = field(default_factory=BackgroundTasks)
