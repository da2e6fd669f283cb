"""Build the daemon's services in one step, each from the parts it needs (nothing runs
yet; lifecycle.py starts them)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from appliance.adapters.simgpu import SimGpu
from appliance.config import Config, served_model_name
from appliance.daemon import wiring
from appliance.domain.controller import ControlMode
from appliance.domain.gpu_sample import Telemetry
from appliance.domain.latency_window import LatencyWindow
from appliance.ports import EngineFactory, Tokenizer
from appliance.precheck import CheckResult
from appliance.services.accounting import RequestAccounting
from appliance.services.admin_token import load_or_create_admin_token
from appliance.services.admission import AdmissionQueue
from appliance.services.audit_log import AuditLog, AuditSettings
from appliance.services.container import Services, Slo, Tenancy
from appliance.services.control_loop import ControlLoop
from appliance.services.early_warning import EarlyWarning
from appliance.services.events import EventBus
from appliance.services.key_store import KeyRegistry, KeyStore
from appliance.services.long_context import LongContextRunner
from appliance.services.metric_history import HistorySampler
from appliance.services.metric_row import MetricRows
from appliance.services.metrics import Metrics
from appliance.services.process_memory import EngineRssBaseline, engine_rss
from appliance.services.quotas import Quotas
from appliance.services.request_ledger import RequestLedger
from appliance.services.slo import SloHistory, SloMeter, previous_run_crashed
from appliance.services.store import StateStore
from appliance.services.supervisor import EngineSupervisor
from appliance.services.target_metrics import TargetCollector
from appliance.services.telemetry_loop import TelemetryLoop, build_telemetry
from appliance.services.telemetry_metrics import TelemetryCollector
from appliance.services.thresholds import LiveThresholds
from appliance.services.usage import UsageMeter
from maintenance.jobs import DaemonMaintenance, JobContext, predictor_path


def compose(
    cfg: Config,
    engine_factory: EngineFactory,
    tokenizer: Tokenizer,
    telemetry: Telemetry | None = None,
    prechecks: Sequence[CheckResult] = (),
) -> Services:
    """Every service, wired; the simulated GPU unless `telemetry` is given or configured."""
    events = EventBus()
    store = StateStore(cfg.state_dir / "appliance.db")
    events.add_sink(lambda e: store.add_event(e.ts_s, e.kind, e.reason, e.data))
    admission = AdmissionQueue(cfg.admission, limit=cfg.concurrency_limit())
    supervisor = EngineSupervisor(
        engine_factory, admission, events, cfg.engine, retry_after_s=cfg.admission.retry_after_s
    )
    telemetry = telemetry if telemetry is not None else build_telemetry(cfg.telemetry)
    # The simulated GPU heats with the engine's load and takes faults; NVML does neither.
    faults = telemetry if isinstance(telemetry, SimGpu) else None
    if faults is not None:
        faults.set_load_fn(lambda: wiring.engine_load(supervisor, admission))
    metrics = Metrics()
    telemetry_loop = _telemetry_loop(cfg, telemetry, events, admission, metrics)
    latency = LatencyWindow(window_s=max(60.0, cfg.controller.window_s))
    slo = _slo(store, metrics, supervisor, admission, events)
    rows = MetricRows(admission, supervisor, telemetry_loop, metrics, latency, slo.meter)
    history = HistorySampler(store, rows.row, cfg.maintenance, after_sample=slo.history.refresh)
    controller = _controller(cfg, admission, supervisor, latency, history, events, store)
    thresholds = LiveThresholds(cfg, store, controller, telemetry_loop)
    rss_baseline = EngineRssBaseline(lambda: engine_rss(supervisor))
    # The restart job's growth baseline: the engine RSS after every start.
    events.add_sink(rss_baseline.on_event)
    admin_token = load_or_create_admin_token(cfg.state_dir / cfg.server.admin_token_file)
    tenancy = _tenancy(cfg, store, metrics, events)
    maintenance = DaemonMaintenance(
        JobContext(
            config=cfg,
            admission=admission,
            supervisor=supervisor,
            telemetry_loop=telemetry_loop,
            store=store,
            events=events,
            metrics=metrics,
            history=history,
            controller=controller,
            thresholds=thresholds,
            rss_baseline=rss_baseline,
            admin_token=admin_token,
            audit=tenancy.audit,
        )
    )
    metrics.add_refresher(wiring.admission_metrics(metrics, admission, supervisor))
    metrics.add_collector(TelemetryCollector(telemetry_loop))
    metrics.add_collector(TargetCollector(controller, cfg.admission.queue_capacity))
    return Services(
        config=cfg,
        model_name=served_model_name(cfg),
        tokenizer=tokenizer,
        events=events,
        metrics=metrics,
        accounting=RequestAccounting(metrics, latency, slo.meter),
        admission=admission,
        supervisor=supervisor,
        telemetry=telemetry,
        telemetry_loop=telemetry_loop,
        faults=faults,
        admin_token=admin_token,
        started_at_s=time.time(),
        store=store,
        controller=controller,
        latency=latency,
        history=history,
        thresholds=thresholds,
        maintenance=maintenance,
        rss_baseline=rss_baseline,
        long_context=LongContextRunner(cfg.long_context, tokenizer, supervisor),
        tenancy=tenancy,
        slo=slo,
        early_warning=EarlyWarning(history.history, events, metrics.early_warning, cfg.maintenance),
        prechecks=tuple(prechecks),
    )


def _slo(
    store: StateStore,
    metrics: Metrics,
    supervisor: EngineSupervisor,
    admission: AdmissionQueue,
    events: EventBus,
) -> Slo:
    """The availability SLO: counters fed by accounting, state changes and the scrape;
    the per-window figures from the history rows the sampler writes."""
    meter = SloMeter(
        metrics.registry,
        wiring.readiness_reason(supervisor, admission),
        after_crash=previous_run_crashed(store),
    )
    events.add_sink(meter.on_event)
    metrics.add_refresher(meter.advance)
    history = SloHistory(store)
    metrics.add_collector(history)
    return Slo(meter, history)


def _tenancy(cfg: Config, store: StateStore, metrics: Metrics, events: EventBus) -> Tenancy:
    """Who may ask for what: the keys (kept beside the state store), their per-minute
    windows, their usage and the audit log of every call."""
    keys = KeyRegistry(KeyStore(store.path), cfg.server.api_keys)
    usage = UsageMeter(store, metrics.registry, time.time)
    for spec in keys.keys:
        usage.known_key(spec.name)
    audit = None
    if cfg.audit.enabled:

        def dropped(count: int, reason: str) -> None:
            metrics.audit_dropped_total.inc(count)
            events.emit("audit_dropped", f"{count} audit records not written: {reason}")

        settings = AuditSettings(
            path=cfg.state_dir / "audit.db",
            store_text=cfg.audit.store_text,
            retention_days=cfg.audit.retention_days,
            max_size_mib=cfg.audit.max_size_mib,
        )
        audit = AuditLog(settings, on_drop=dropped)
    quotas = Quotas()
    return Tenancy(keys, quotas, usage, audit, RequestLedger(usage, quotas, audit, metrics))


def _telemetry_loop(
    cfg: Config,
    telemetry: Telemetry,
    events: EventBus,
    admission: AdmissionQueue,
    metrics: Metrics,
) -> TelemetryLoop:
    """Samples every interval; a lost GPU and each thermal decision reach admission."""
    return TelemetryLoop(
        telemetry,
        cfg.thermal.to_policy(),
        cfg.telemetry.interval_s,
        on_sample=wiring.lost_gpu_watch(events),
        on_decision=wiring.thermal_to_admission(admission, events),
        tokens_fn=lambda: metrics.generated_tokens,
    )


def _controller(
    cfg: Config,
    admission: AdmissionQueue,
    supervisor: EngineSupervisor,
    latency: LatencyWindow,
    history: HistorySampler,
    events: EventBus,
    store: StateStore,
) -> ControlLoop:
    """The batch controller over the measured latency and the engine's KV usage, with the
    load forecast from the stored history when `controller.forecast` is auto."""
    forecast = (
        wiring.forecaster(history, predictor_path(cfg), cfg.controller.forecast_horizon_s)
        if cfg.controller.forecast == "auto"
        else None
    )
    return ControlLoop(
        cfg.controller.to_policy(cfg.slo, cfg.engine.max_num_seqs),
        ControlMode(cfg.controller.mode),
        admission,
        latency,
        kv_usage=lambda: wiring.kv_usage(supervisor),
        step_latency=supervisor.step_latency,
        events=events,
        record=store.add_decision,
        forecast=forecast,
        keep_ceiling=store.keep_ceiling,
    )
