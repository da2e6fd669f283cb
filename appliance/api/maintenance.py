"""Maintenance at the edge: the store, metric history and scheduler wired to the daemon's
services, and the admin routes for jobs, benchmarks and threshold sets."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
from aiohttp import web

from appliance.api.keys import SERVICES, Services
from appliance.domain.analysis import Slo
from appliance.domain.rates import CounterRates
from appliance.domain.recalibrate import Bounds, Thresholds
from appliance.errors import ApplianceError, BadRequest, NotFound
from appliance.services.admission import Lane
from appliance.services.history import HistorySampler
from appliance.services.store import StateStore
from appliance.services.supervisor import EngineState
from maintenance.rebenchmark import rebenchmark
from maintenance.recalibrate import recalibrate_thresholds, rollback_thresholds
from maintenance.restart import EngineRssBaseline, defrag_restart, engine_rss
from maintenance.scheduler import OUTCOMES, JobSpec, MaintenanceScheduler

routes = web.RouteTableDef()


class NoRollback(ApplianceError):
    """Nothing to roll back to, or a recalibration is running right now."""

    status = 409
    type = "invalid_request_error"
    code = "no_rollback"
    retryable = False


def history_row(svc: Services, rates: CounterRates | None = None) -> dict[str, Any]:
    """One metric-history row: load, throughput, limits, KV, GPU and host memory,
    temperatures, latency percentiles (what recalibration, the load predictor and
    `appliance logs analyze` read back)."""
    adm = svc.admission.snapshot()
    row: dict[str, Any] = {
        "in_flight": adm.in_flight,
        "queued": sum(adm.queued.values()),
        "queued_realtime": adm.queued["realtime"],
        "limit": adm.limit,
        "base_limit": adm.base_limit,
        "derate_factor": adm.derate_factor,
        "derated": int(adm.derate_factor < 1 or adm.protect),
    }
    try:
        stats = svc.supervisor.engine.stats()
        row.update(
            kv_cache_usage_ratio=stats.kv_cache_usage_ratio,
            running=stats.running,
            waiting=stats.waiting,
        )
    except Exception:
        pass
    gpus = [g for g in svc.telemetry_loop.latest_samples if not g.lost]
    temps = [g.core_temp_c for g in gpus if g.core_temp_c is not None]
    mems = [g.mem_temp_c for g in gpus if g.mem_temp_c is not None]
    power = [g.power_w for g in gpus if g.power_w is not None]
    if temps:
        row["core_temp_c_max"] = max(temps)
    if mems:
        row["mem_temp_c_max"] = max(mems)
    if power:
        row["power_w"] = sum(power)
    util = [g.gpu_util_pct for g in gpus if g.gpu_util_pct is not None]
    if util:
        row["gpu_util_pct"] = sum(util) / len(util)
    bw = [g.mem_bw_util_pct for g in gpus if g.mem_bw_util_pct is not None]
    if bw:
        row["mem_bw_util_pct"] = sum(bw) / len(bw)
    used = [g.mem_used_bytes for g in gpus if g.mem_used_bytes is not None]
    total = [g.mem_total_bytes for g in gpus if g.mem_total_bytes]
    if used and total:
        row["gpu_memory_used_bytes"] = sum(used)
        row["gpu_memory_total_bytes"] = sum(total)
        row["mem_used_ratio"] = sum(used) / sum(total)
    row["rss_bytes"] = _rss_bytes(svc)
    row["memory_limit_bytes"] = _memory_limit_bytes()
    if rates is not None:
        m = svc.metrics
        per_s = rates.sample(
            time.monotonic(),
            {
                "tokens_per_s": m.generated_tokens,
                "requests_per_s": m.finished,
                "arrivals_per_s": m.arrivals,
                "rejected_per_s": m.rejected,
            },
        )
        row.update((k, round(v, 4)) for k, v in per_s.items() if v is not None)
    window = svc.latency.stats(time.monotonic(), min_samples=1)
    if window.ttft_p99_s is not None:
        row["ttft_p99_s"] = window.ttft_p99_s
        row["ttft_p50_s"] = window.ttft_p50_s
    if window.tpot_p99_s is not None:
        row["tpot_p99_s"] = window.tpot_p99_s
        row["tpot_p50_s"] = window.tpot_p50_s
    row["requests_in_window"] = window.count
    return row


def _rss_bytes(svc: Services) -> int:
    """The daemon's RSS plus its engine processes' (what an OOM killer weighs)."""
    try:
        own = psutil.Process(os.getpid()).memory_info().rss
    except psutil.Error:
        own = 0
    return own + engine_rss(svc.supervisor)


def _memory_limit_bytes() -> int:
    """The cgroup's memory.max where one is set (systemd MemoryMax=), else host RAM."""
    try:
        text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if text.isdigit():
            return int(text)
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def load_guard(svc: Services) -> str | None:
    """Why maintenance must wait now, or None."""
    adm = svc.admission
    if adm.queued(Lane.REALTIME) or adm.snapshot().running["realtime"]:
        return "realtime traffic present"
    depth = adm.queued()
    limit = svc.config.maintenance.guard_max_queue
    if depth > limit:
        return f"queue depth {depth} > maintenance.guard_max_queue {limit}"
    return None


def current_thresholds(svc: Services) -> Thresholds:
    """The active recalibrated set, else the configured values."""
    configured = configured_thresholds(svc)
    active = svc.store.active_thresholds()
    if active is None:
        return configured
    # A set stored by an older version may lack a field: that field keeps the configured value.
    values: dict[str, Any] = configured.to_dict()
    values.update((k, v) for k, v in active["data"].items() if k in values)
    return Thresholds(**values)


def configured_thresholds(svc: Services) -> Thresholds:
    """The values config.yaml sets (what applies before any recalibration)."""
    slo_ttft = svc.config.slo.ttft_p99_s
    return Thresholds(
        derate_core_c=svc.config.thermal.derate_core_c,
        protect_mem_c=svc.config.thermal.protect_mem_c,
        slo_ttft_p99_s=slo_ttft,
        slo_tpot_p99_s=svc.config.slo.tpot_p99_s,
        alert_ttft_p99_s=slo_ttft * 1.5,
        alert_queue_depth=float(max(1, svc.config.admission.queue_capacity.interactive // 2)),
    )


def apply_thresholds(svc: Services, t: Thresholds) -> None:
    """Live-apply recalibrated thermal thresholds and SLOs."""
    loop = svc.telemetry_loop
    loop.policy_cfg = dataclasses.replace(
        loop.policy_cfg, derate_core_c=t.derate_core_c, protect_mem_c=t.protect_mem_c
    )
    svc.slo_ttft_p99_s, svc.slo_tpot_p99_s = t.slo_ttft_p99_s, t.slo_tpot_p99_s
    svc.controller.cfg = dataclasses.replace(
        svc.controller.cfg, slo_ttft_p99_s=t.slo_ttft_p99_s, slo_tpot_p99_s=t.slo_tpot_p99_s
    )


def predictor_path(svc: Services) -> Path:
    """Where the trained load model (and its held-out verdict) is kept."""
    return svc.config.state_dir / "load_predictor.pt"


async def train_predictor(svc: Services, history_s: float = 14 * 86400) -> dict[str, Any]:
    """Fit the LSTM and the EWMA on the stored history, keep the LSTM only where it won."""
    from appliance.predict.runtime import train_load_model

    rows = svc.history.history(time.time() - history_s)
    threshold = float(svc.ceiling or svc.admission.base_limit)
    try:
        report = await asyncio.to_thread(
            train_load_model, rows, predictor_path(svc), burst_threshold=threshold
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
    svc.events.emit(
        "predictor_trained",
        f"load predictor trained on {report.train_points} points: "
        f"{'LSTM enabled' if report.enabled else 'EWMA kept'} ({report.reason})",
        **{k: v for k, v in details.items() if k != "reason"},
    )
    return details


def rules_path(svc: Services) -> Path:
    """The generated Prometheus rules file carrying the recalibrated thresholds."""
    return svc.config.state_dir / "alerts.recalibrated.yml"


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


def restart_baseline(svc: Services) -> tuple[int | None, str | None]:
    """The engine RSS to judge growth against, and where it comes from.

    Preferred: the RSS right after the running engine started (whatever started it). Else
    the RSS right after the last recorded defrag restart. Else none.
    """
    live = svc.engine_rss_baseline
    if live is not None and live.rss_bytes:
        return live.rss_bytes, "the engine's start"
    for run in svc.store.job_runs("restart", limit=20):
        after = run.details.get("after") or {}
        if run.outcome == "ok" and run.details.get("restarted") and after.get("engine_rss_bytes"):
            return int(after["engine_rss_bytes"]), f"the restart of job run {run.id}"
    return None, None


def build_scheduler(svc: Services) -> MaintenanceScheduler:
    """The three jobs with their explicit arguments, registered in one place."""
    m = svc.config.maintenance
    host = svc.config.server.host
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{svc.config.server.port}"

    async def restart_job() -> dict[str, Any]:
        baseline, source = restart_baseline(svc)
        return await defrag_restart(
            svc.supervisor,
            lambda: list(svc.telemetry_loop.latest_samples),
            min_growth_ratio=m.restart_min_growth_ratio,
            baseline_engine_rss_bytes=baseline,
            baseline_source=source,
        )

    async def benchmark_job() -> dict[str, Any]:
        return await rebenchmark(
            url,
            svc.admin_token,
            svc.store,
            svc.events,
            concurrency=m.benchmark_concurrency,
            requests_per_level=m.benchmark_requests_per_level,
            max_tokens=m.benchmark_max_tokens,
            regression_ratio=m.regression_ratio,
            set_ceiling=svc.set_ceiling,
            # The knee is where the SLO in force breaks; the score uses the configured weights.
            slo=Slo(ttft_p99_s=svc.slo_ttft_p99_s, tpot_p99_s=svc.slo_tpot_p99_s),
            weights=svc.config.bench.weights.to_policy(),
        )

    async def predictor_job() -> dict[str, Any]:
        return await train_predictor(svc)

    async def recalibrate_job() -> dict[str, Any]:
        bounds = Bounds(
            max_core_c=999.0 if m.allow_above_hardware else m.hardware_max_core_c,
            max_mem_c=999.0 if m.allow_above_hardware else m.hardware_max_mem_c,
        )
        return await recalibrate_thresholds(
            svc.store,
            svc.history.history,
            current_thresholds(svc),
            bounds,
            svc.events,
            rules_path(svc),
            lambda t: apply_thresholds(svc, t),
        )

    jobs = [
        JobSpec("restart", m.restart.cron, m.restart.enabled, restart_job),
        JobSpec("benchmark", m.benchmark.cron, m.benchmark.enabled, benchmark_job),
        JobSpec("recalibrate", m.recalibrate.cron, m.recalibrate.enabled, recalibrate_job),
        JobSpec("predictor", m.predictor.cron, m.predictor.enabled, predictor_job),
    ]
    counter = svc.metrics.maintenance_runs_total
    for job in jobs:
        for outcome in OUTCOMES:  # present from the start, so increase() sees the first one
            counter.labels(job.name, outcome)
    return MaintenanceScheduler(
        m,
        jobs,
        svc.store,
        svc.events,
        lambda: load_guard(svc),
        on_outcome=lambda job, outcome: counter.labels(job, outcome).inc(),
    )


async def maintenance_ctx(app: web.Application) -> AsyncIterator[None]:
    """Start history sampling and the scheduler inside the running loop; stop them after.

    What earlier runs decided is restored first: the active threshold set and the
    benchmark's concurrency ceiling.
    """
    svc = app[SERVICES]
    rates = CounterRates()
    svc.history = HistorySampler(
        svc.store, lambda: history_row(svc, rates), svc.config.maintenance
    )
    await svc.history.start()
    if svc.store.active_thresholds() is not None:
        apply_thresholds(svc, current_thresholds(svc))
    found = stored_ceiling(svc.store)
    if svc.ceiling is None and found is not None:
        limit, bench = found
        svc.set_ceiling(limit, f"the stored benchmark {bench['id']}")
    # The restart job's growth baseline: the engine RSS after every start from now on, and
    # now if the engine came up before this context ran.
    baseline = EngineRssBaseline(lambda: engine_rss(svc.supervisor))
    svc.events.add_sink(baseline.on_event)
    if svc.supervisor.state is EngineState.READY:
        baseline.take()
    svc.engine_rss_baseline = baseline
    svc.scheduler = build_scheduler(svc)
    svc.scheduler.start()
    yield
    svc.scheduler.shutdown()
    await svc.history.stop()


@routes.get("/admin/jobs")
async def get_jobs(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    return web.json_response({"jobs": svc.scheduler.jobs_info()})


@routes.post("/admin/jobs/{name}/run")
async def post_job_run(request: web.Request) -> web.Response:
    """Run a job now in the background (202); ?force=1 skips the load guard."""
    svc = request.app[SERVICES]
    name = request.match_info["name"]
    if name not in svc.scheduler.names:
        raise NotFound(f"job: '{name}' is not a job; jobs: {svc.scheduler.names}", param="name")
    trigger = "forced" if request.query.get("force") in ("1", "true") else "manual"
    task = svc.scheduler.spawn(name, trigger)
    svc.background.add(task)
    task.add_done_callback(svc.background.discard)
    return web.json_response({"job": name, "status": "started", "trigger": trigger}, status=202)


@routes.get("/admin/benchmarks")
async def get_benchmarks(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    return web.json_response({"benchmarks": svc.store.benchmarks(limit=10)})


@routes.post("/admin/benchmarks")
async def post_benchmark(request: web.Request) -> web.Response:
    """Store a report of `appliance bench`; ?apply=1 makes its knee_limit the ceiling.

    This is the last phase of the three-phase tuning: the limit the sweep found is handed
    to the controller, which then never probes above it.
    """
    svc = request.app[SERVICES]
    try:
        body = await request.json()
    except ValueError:
        raise BadRequest("body: not valid JSON", param="body") from None
    if not isinstance(body, dict) or not isinstance(body.get("levels"), list):
        raise BadRequest("body: a report of `appliance bench --json` (with levels)", param="body")
    knee = body.get("knee_limit")
    if knee is not None and (isinstance(knee, bool) or not isinstance(knee, int) or knee < 1):
        raise BadRequest("knee_limit: must be a whole number >= 1 or null", param="knee_limit")
    bench_id = svc.store.add_benchmark("cli", body)
    applied = False
    if request.query.get("apply") in ("1", "true") and knee is not None:
        svc.set_ceiling(knee, source=f"appliance bench (run {bench_id})")
        applied = True
    return web.json_response({"id": bench_id, "applied": applied, "ceiling": svc.ceiling})


@routes.get("/admin/history")
async def get_history(request: web.Request) -> web.Response:
    """Stored metric history since ?since_s= (default: the last hour)."""
    svc = request.app[SERVICES]
    try:
        since = float(request.query.get("since_s", time.time() - 3600))
    except ValueError:
        since = time.time() - 3600
    return web.json_response({"rows": svc.history.history(since)})


@routes.get("/admin/thresholds")
async def get_thresholds(request: web.Request) -> web.Response:
    """The thresholds in force, the earlier sets (rollback targets, newest first) and the
    sets that were rolled back."""
    svc = request.app[SERVICES]
    sets = svc.store.thresholds(limit=50)
    active = svc.store.active_thresholds()
    return web.json_response(
        {
            "active": {
                "id": active["id"] if active else None,
                "ts_s": active["ts_s"] if active else None,
                "source": active["source"] if active else "config",
                "data": current_thresholds(svc).to_dict(),
            },
            "previous": [t for t in sets if t["state"] == "previous"],
            "rolled_back": [t for t in sets if t["state"] == "rolled_back"],
            "rules_path": str(rules_path(svc)),
        }
    )


@routes.post("/admin/thresholds/rollback")
async def post_thresholds_rollback(request: web.Request) -> web.Response:
    """Re-activate the set before the active one, apply it live, regenerate the rules."""
    svc = request.app[SERVICES]
    if svc.scheduler.is_running("recalibrate"):
        raise NoRollback("thresholds: a recalibration is running; roll back after it ends")
    result = rollback_thresholds(
        svc.store,
        current_thresholds(svc),
        svc.events,
        rules_path(svc),
        lambda t: apply_thresholds(svc, t),
    )
    if result is None:
        raise NoRollback("thresholds: no earlier set to roll back to")
    return web.json_response({**result, "active": current_thresholds(svc).to_dict()})
