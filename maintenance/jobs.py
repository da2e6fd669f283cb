"""The maintenance jobs, registered in one place with what each one needs: the weekly
restart, the monthly re-benchmark, the quarterly recalibration, the predictor's training
and the audit log's retention; the load guard that defers them; what earlier runs left
to restore."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.config import Config
from appliance.domain.lanes import Lane
from appliance.domain.sweep_analysis import Slo
from appliance.domain.threshold_fit import Bounds
from appliance.services.admission import AdmissionQueue
from appliance.services.audit_log import AuditLog
from appliance.services.control_loop import ControlLoop
from appliance.services.events import EventBus
from appliance.services.metric_history import HistorySampler
from appliance.services.metrics import Metrics
from appliance.services.process_memory import EngineRssBaseline
from appliance.services.store import StateStore
from appliance.services.supervisor import EngineSupervisor
from appliance.services.telemetry_loop import TelemetryLoop
from appliance.services.thresholds import LiveThresholds
from maintenance.audit_prune import prune_audit
from maintenance.rebenchmark import RebenchPlan, rebenchmark
from maintenance.recalibrate import recalibrate_thresholds, rollback_thresholds
from maintenance.restart import defrag_restart
from maintenance.scheduler import OUTCOMES, JobFn, JobSpec, MaintenanceScheduler

# How much metric history the load predictor learns from.
PREDICTOR_HISTORY_S = 14 * 86400


@dataclass(frozen=True)
class JobContext:
    """The daemon's parts the jobs act on (built once, before the scheduler)."""

    config: Config
    admission: AdmissionQueue
    supervisor: EngineSupervisor
    telemetry_loop: TelemetryLoop
    store: StateStore
    events: EventBus
    metrics: Metrics
    history: HistorySampler
    controller: ControlLoop
    thresholds: LiveThresholds
    rss_baseline: EngineRssBaseline
    admin_token: str
    audit: AuditLog | None = None  # None: audit.enabled is false


def load_guard(admission: AdmissionQueue, guard_max_queue: int) -> str | None:
    """Why maintenance must wait now, or None."""
    if admission.queued(Lane.REALTIME) or admission.snapshot().running["realtime"]:
        return "realtime traffic present"
    depth = admission.queued()
    if depth > guard_max_queue:
        return f"queue depth {depth} > maintenance.guard_max_queue {guard_max_queue}"
    return None


def restart_baseline(ctx: JobContext) -> tuple[int | None, str | None]:
    """The engine RSS to judge growth against, and where it comes from.

    Preferred: the RSS right after the running engine started (whatever started it). Else
    the RSS right after the last recorded defrag restart. Else none.
    """
    live = ctx.rss_baseline
    if live.rss_bytes:
        return live.rss_bytes, "the engine's start"
    for run in ctx.store.job_runs("restart", limit=20):
        after = run.details.get("after") or {}
        if run.outcome == "ok" and run.details.get("restarted") and after.get("engine_rss_bytes"):
            return int(after["engine_rss_bytes"]), f"the restart of job run {run.id}"
    return None, None


def stored_ceiling(store: StateStore) -> tuple[int, dict[str, Any]] | None:
    """The ceiling of the newest stored benchmark that set one, with that benchmark.

    A sweep without a usable knee (e.g. capped by the daemon's own limit) left the ceiling
    as it was, so the one in force is the newest that had a knee_limit.
    """
    for bench in store.benchmarks(limit=100):
        limit = bench["result"].get("knee_limit")
        if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1:
            return limit, bench
    return None


def predictor_path(cfg: Config) -> Path:
    """Where the trained load model (and its held-out verdict) is kept."""
    return cfg.state_dir / "load_predictor.pt"


async def train_predictor(
    ctx: JobContext, history_s: float = PREDICTOR_HISTORY_S
) -> dict[str, Any]:
    """Fit the LSTM and the EWMA on the stored history, keep the LSTM only where it won."""
    from appliance.predict.runtime import train_load_model

    rows = ctx.history.history(time.time() - history_s)
    threshold = float(ctx.controller.ceiling or ctx.admission.base_limit)
    try:
        report = await asyncio.to_thread(
            train_load_model, rows, predictor_path(ctx.config), burst_threshold=threshold
        )
    except ValueError as exc:  # too little history yet: nothing to learn from, not a failure
        return {"trained": False, "reason": str(exc), "rows": len(rows)}
    details = {
        "trained": True,
        "lstm_enabled": report.enabled,
        "reason": report.reason,
        "burst_threshold": report.burst_threshold,
        "train_points": report.train_points,
        "holdout_points": report.holdout_points,
        "ewma_mae": report.ewma.mae,
        "lstm_mae": report.lstm.mae,
    }
    ctx.events.emit(
        "predictor_trained",
        f"load predictor trained on {report.train_points} points: "
        f"{'LSTM enabled' if report.enabled else 'EWMA kept'} ({report.reason})",
        **{k: v for k, v in details.items() if k != "reason"},
    )
    return details


def _daemon_url(cfg: Config) -> str:
    """Where the re-benchmark reaches the daemon it runs in (loopback for a wildcard)."""
    host = cfg.server.host
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{cfg.server.port}"


def _restart_job(ctx: JobContext) -> JobFn:
    async def run() -> dict[str, Any]:
        baseline, source = restart_baseline(ctx)
        return await defrag_restart(
            ctx.supervisor,
            lambda: list(ctx.telemetry_loop.latest_samples),
            min_growth_ratio=ctx.config.maintenance.restart_min_growth_ratio,
            baseline_engine_rss_bytes=baseline,
            baseline_source=source,
        )

    return run


def _benchmark_job(ctx: JobContext) -> JobFn:
    m = ctx.config.maintenance

    async def run() -> dict[str, Any]:
        policy = ctx.controller.cfg
        plan = RebenchPlan(
            mode=m.benchmark_mode,
            concurrency=m.benchmark_concurrency,
            max_concurrency=ctx.config.engine.max_num_seqs,
            requests_per_level=m.benchmark_requests_per_level,
            max_tokens=m.benchmark_max_tokens,
        )
        # The daemon's own limit (the controller's, or an old ceiling) must not cap the
        # sweep: a capped sweep can only confirm the cap. Open it to what the engine can run
        # for the run's length; the controller's settings come back afterwards.
        with ctx.controller.opened(plan.max_concurrency, "the monthly benchmark"):
            return await rebenchmark(
                _daemon_url(ctx.config),
                ctx.admin_token,
                ctx.store,
                ctx.events,
                plan=plan,
                regression_ratio=m.regression_ratio,
                ceiling=ctx.controller,
                # The knee is where the SLO in force breaks; the score uses the configured
                # weights.
                slo=Slo(ttft_p99_s=policy.slo_ttft_p99_s, tpot_p99_s=policy.slo_tpot_p99_s),
                weights=ctx.config.bench.weights.to_policy(),
            )

    return run


def _recalibrate_job(ctx: JobContext) -> JobFn:
    m = ctx.config.maintenance

    async def run() -> dict[str, Any]:
        bounds = Bounds(
            max_core_c=999.0 if m.allow_above_hardware else m.hardware_max_core_c,
            max_mem_c=999.0 if m.allow_above_hardware else m.hardware_max_mem_c,
        )
        return await recalibrate_thresholds(
            ctx.store,
            ctx.history.history,
            ctx.thresholds.current(),
            bounds,
            ctx.events,
            ctx.thresholds.rules_path,
            lambda t: ctx.thresholds.apply(t, "the quarterly recalibration"),
        )

    return run


def build_scheduler(ctx: JobContext) -> MaintenanceScheduler:
    """The jobs with their schedules, the load guard and the outcome counter."""
    m = ctx.config.maintenance

    async def predictor() -> dict[str, Any]:
        return await train_predictor(ctx)

    async def audit_prune() -> dict[str, Any]:
        if ctx.audit is None:
            return {"skipped": "audit.enabled is false"}
        return await prune_audit(ctx.audit)

    jobs = [
        JobSpec("restart", m.restart.cron, m.restart.enabled, _restart_job(ctx)),
        JobSpec("benchmark", m.benchmark.cron, m.benchmark.enabled, _benchmark_job(ctx)),
        JobSpec("recalibrate", m.recalibrate.cron, m.recalibrate.enabled, _recalibrate_job(ctx)),
        JobSpec("predictor", m.predictor.cron, m.predictor.enabled, predictor),
        JobSpec("audit_prune", m.audit_prune.cron, m.audit_prune.enabled, audit_prune),
    ]
    counter = ctx.metrics.maintenance_runs_total
    for job in jobs:
        for outcome in OUTCOMES:  # present from the start, so increase() sees the first one
            counter.labels(job.name, outcome)
    return MaintenanceScheduler(
        m,
        jobs,
        ctx.store,
        ctx.events,
        lambda: load_guard(ctx.admission, m.guard_max_queue),
        on_outcome=lambda job, outcome: counter.labels(job, outcome).inc(),
    )


def restore(store: StateStore, thresholds: LiveThresholds, controller: ControlLoop) -> None:
    """What earlier runs decided, in force again: the active threshold set and the stored
    benchmark's concurrency ceiling."""
    active = store.active_thresholds()
    if active is not None:
        thresholds.apply(thresholds.current(), f"the stored threshold set {active['id']}")
    if controller.ceiling is not None:
        return
    kept = store.kept_ceiling()
    if kept is not None:
        # The last decision, whichever run and objective made it (None: lifted).
        limit, source = kept
        if limit is not None:
            controller.set_ceiling(limit, f"the kept ceiling ({source})", keep=False)
        return
    # A state file from before ceilings were kept: the newest stored run that set one.
    found = stored_ceiling(store)
    if found is not None:
        limit, bench = found
        controller.set_ceiling(limit, f"the stored benchmark {bench['id']}")


class DaemonMaintenance:
    """The scheduler and the threshold sets, as the admin API and the lifecycle use them."""

    def __init__(self, ctx: JobContext) -> None:
        self._ctx = ctx
        self._scheduler = build_scheduler(ctx)

    @property
    def names(self) -> list[str]:
        return self._scheduler.names

    def is_running(self, name: str) -> bool:
        return self._scheduler.is_running(name)

    def jobs_info(self) -> list[dict[str, Any]]:
        return self._scheduler.jobs_info()

    def spawn(self, name: str, trigger: str = "manual") -> asyncio.Task[str]:
        return self._scheduler.spawn(name, trigger)

    def start(self) -> None:
        self._scheduler.start()

    def shutdown(self) -> None:
        self._scheduler.shutdown()

    def restore(self) -> None:
        restore(self._ctx.store, self._ctx.thresholds, self._ctx.controller)

    def rollback_thresholds(self) -> dict[str, Any] | None:
        t = self._ctx.thresholds
        return rollback_thresholds(
            self._ctx.store,
            t.current(),
            self._ctx.events,
            t.rules_path,
            lambda new: t.apply(new, "a threshold rollback"),
        )
