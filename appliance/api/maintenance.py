"""Admin routes for maintenance: jobs, benchmarks, metric history and threshold sets.

The jobs, the threshold sets and the controller's ceiling are owned by the services
(maintenance/jobs.py, services/thresholds.py, services/control_loop.py); these handlers
only translate HTTP to them."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from appliance.api.keys import SERVICES
from appliance.domain.objectives import Objective, choose_ceiling
from appliance.domain.sweep_analysis import ScoreWeights
from appliance.errors import ApplianceError, BadRequest, NotFound
from appliance.services.container import Services

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
    """Store a report of `appliance bench`; ?apply=1 hands it on as the controller's ceiling.

    This is the last phase of the three-phase tuning: the level the sweep found becomes the
    ceiling, and the controller never probes above it. ?objective= picks which level: knee
    (default), score (the configured weights) or a level number on the Pareto front.
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
    objective = None
    if request.query.get("apply") in ("1", "true"):
        objective = _objective(svc, {"objective": request.query.get("objective", "knee")})
    bench_id = svc.store.add_benchmark("cli", body)
    answer: dict[str, Any] = {"id": bench_id, "applied": False}
    if objective is not None:
        try:
            answer |= _apply(svc, bench_id, body, objective)
        except ValueError as exc:
            # Stored, but this run cannot give what was asked: say so, change nothing.
            answer["not_applied"] = str(exc)
    return web.json_response({**answer, "ceiling": svc.controller.ceiling})


@routes.post("/admin/benchmarks/{id}/apply")
async def post_benchmark_apply(request: web.Request) -> web.Response:
    """Make a stored run's objective the controller's ceiling.

    Body (all optional): {"objective": "knee" | "score" | "level", "level": N, "weights":
    {"latency": .., "throughput": .., "utilisation": .., "energy": ..}}; weights default to
    the configured bench.weights.
    """
    svc = request.app[SERVICES]
    try:
        bench_id = int(request.match_info["id"])
    except ValueError:
        raise BadRequest("id: a benchmark run's number", param="id") from None
    run = svc.store.benchmark(bench_id)
    if run is None:
        raise NotFound(f"id: no benchmark run {bench_id}", param="id")
    try:
        body = await request.json() if request.can_read_body else {}
    except ValueError:
        raise BadRequest("body: not valid JSON", param="body") from None
    if not isinstance(body, dict):
        raise BadRequest("body: must be a JSON object", param="body")
    try:
        answer = _apply(svc, bench_id, run["result"], _objective(svc, body))
    except ValueError as exc:
        raise BadRequest(str(exc), param=str(exc).split(":", 1)[0]) from None
    return web.json_response({"id": bench_id, **answer, "ceiling": svc.controller.ceiling})


def _objective(svc: Services, body: dict[str, Any]) -> Objective:
    """The objective a request asks for; BadRequest names the field."""
    unknown = sorted(set(body) - {"objective", "level", "weights"})
    if unknown:
        raise BadRequest(
            f"{unknown[0]}: unknown field; allowed: objective, level, weights", param=unknown[0]
        )
    weights = svc.config.bench.weights.to_policy()
    raw = body.get("weights")
    try:
        if raw is not None:
            names = ("latency", "throughput", "utilisation", "energy")
            if not isinstance(raw, dict) or not set(raw) <= set(names):
                raise ValueError(f"weights: an object of {', '.join(names)}, got {raw!r}")
            weights = ScoreWeights(**{k: float(v) for k, v in raw.items()})
        kind = str(body.get("objective", "knee"))
        if kind.isdigit():
            return Objective.parse(kind)
        return Objective(kind, level=body.get("level"), weights=weights)
    except (TypeError, ValueError) as exc:
        text = str(exc) if ":" in str(exc) else f"weights: {exc}"
        raise BadRequest(text, param=text.split(":", 1)[0].split(".")[0]) from None


def _apply(
    svc: Services, bench_id: int, report: dict[str, Any], objective: Objective
) -> dict[str, Any]:
    """Set (or lift) the ceiling the objective picks from the run; ValueError if it cannot."""
    choice = choose_ceiling(report, objective)
    source = f"benchmark run {bench_id}, objective {objective.kind}: {choice.reason}"
    if choice.ceiling is None:
        svc.controller.clear_ceiling(source)
    else:
        svc.controller.set_ceiling(choice.ceiling, source=source)
    return {"applied": True, "objective": objective.kind, "reason": choice.reason}


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
