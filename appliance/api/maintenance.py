"""Admin routes for maintenance: jobs, benchmarks, metric history and threshold sets.

The jobs, the threshold sets and the controller's ceiling are owned by the services
(maintenance/jobs.py, services/thresholds.py, services/control_loop.py); these handlers
only translate HTTP to them."""

from __future__ import annotations

import time

from aiohttp import web

from appliance.api.keys import SERVICES
from appliance.errors import ApplianceError, BadRequest, NotFound

routes = web.RouteTableDef()


class NoRollback(ApplianceError):
    """Nothing to roll back to, or a recalibration is running right now."""

    status = 409
    type = "invalid_request_error"
    code = "no_rollback"
    retryable = False


@routes.get("/admin/jobs")
async def get_jobs(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    return web.json_response({"jobs": svc.maintenance.jobs_info()})


@routes.post("/admin/jobs/{name}/run")
async def post_job_run(request: web.Request) -> web.Response:
    """Run a job now in the background (202); ?force=1 skips the load guard."""
    svc = request.app[SERVICES]
    name = request.match_info["name"]
    if name not in svc.maintenance.names:
        raise NotFound(
            f"job: '{name}' is not a job; jobs: {svc.maintenance.names}", param="name"
        )
    trigger = "forced" if request.query.get("force") in ("1", "true") else "manual"
    svc.background.keep(svc.maintenance.spawn(name, trigger))
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
        svc.controller.set_ceiling(knee, source=f"appliance bench (run {bench_id})")
        applied = True
    return web.json_response(
        {"id": bench_id, "applied": applied, "ceiling": svc.controller.ceiling}
    )


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
                "data": svc.thresholds.current().to_dict(),
            },
            "previous": [t for t in sets if t["state"] == "previous"],
            "rolled_back": [t for t in sets if t["state"] == "rolled_back"],
            "rules_path": str(svc.thresholds.rules_path),
        }
    )


@routes.post("/admin/thresholds/rollback")
async def post_thresholds_rollback(request: web.Request) -> web.Response:
    """Re-activate the set before the active one, apply it live, regenerate the rules."""
    svc = request.app[SERVICES]
    if svc.maintenance.is_running("recalibrate"):
        raise NoRollback("thresholds: a recalibration is running; roll back after it ends")
    result = svc.maintenance.rollback_thresholds()
    if result is None:
        raise NoRollback("thresholds: no earlier set to roll back to")
    return web.json_response({**result, "active": svc.thresholds.current().to_dict()})
