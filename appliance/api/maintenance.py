"""Maintenance at the edge: the store, metric history and scheduler wired to the daemon's
services, and the admin routes for jobs and benchmarks."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from appliance.api.keys import SERVICES, Services
from appliance.domain.recalibrate import Bounds, Thresholds
from appliance.errors import NotFound
from appliance.services.admission import Lane
from appliance.services.history import HistorySampler
from maintenance.rebenchmark import rebenchmark
from maintenance.recalibrate import recalibrate_thresholds
from maintenance.restart import defrag_restart
from maintenance.scheduler import OUTCOMES, JobSpec, MaintenanceScheduler

routes = web.RouteTableDef()


def history_row(svc: Services) -> dict[str, Any]:
    """One metric-history row: load, limits, KV, temperatures, latency percentiles."""
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
    window = svc.latency.stats(time.monotonic(), min_samples=1)
    if window.ttft_p99_s is not None:
        row["ttft_p99_s"] = window.ttft_p99_s
        row["ttft_p50_s"] = window.ttft_p50_s
    if window.tpot_p99_s is not None:
        row["tpot_p99_s"] = window.tpot_p99_s
        row["tpot_p50_s"] = window.tpot_p50_s
    row["requests_in_window"] = window.count
    return row


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
    stored = [t for t in svc.store.thresholds(limit=5) if t["active"]]
    if stored:
        return Thresholds(**stored[0]["data"])
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


def build_scheduler(svc: Services) -> MaintenanceScheduler:
    """The three jobs with their explicit arguments, registered in one place."""
    m = svc.config.maintenance
    host = svc.config.server.host
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{svc.config.server.port}"

    async def restart_job() -> dict[str, Any]:
        last = [
            r
            for r in svc.store.job_runs("restart", limit=10)
            if r.outcome == "ok" and r.details.get("restarted")
        ]
        baseline = last[0].details["after"]["engine_rss_bytes"] if last else None
        return await defrag_restart(
            svc.supervisor,
            lambda: list(svc.telemetry_loop.latest_samples),
            min_growth_ratio=m.restart_min_growth_ratio,
            baseline_engine_rss_bytes=baseline,
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
        )

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
            svc.config.state_dir / "alerts.recalibrated.yml",
            lambda t: apply_thresholds(svc, t),
        )

    jobs = [
        JobSpec("restart", m.restart.cron, m.restart.enabled, restart_job),
        JobSpec("benchmark", m.benchmark.cron, m.benchmark.enabled, benchmark_job),
        JobSpec("recalibrate", m.recalibrate.cron, m.recalibrate.enabled, recalibrate_job),
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
    """Start history sampling and the scheduler inside the running loop; stop them after."""
    svc = app[SERVICES]
    svc.history = HistorySampler(svc.store, lambda: history_row(svc), svc.config.maintenance)
    await svc.history.start()
    active = [t for t in svc.store.thresholds(limit=5) if t["active"]]
    if active:
        apply_thresholds(svc, Thresholds(**active[0]["data"]))
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


@routes.get("/admin/history")
async def get_history(request: web.Request) -> web.Response:
    """Stored metric history since ?since_s= (default: the last hour)."""
    svc = request.app[SERVICES]
    try:
        since = float(request.query.get("since_s", time.time() - 3600))
    except ValueError:
        since = time.time() - 3600
    return web.json_response({"rows": svc.history.history(since)})
