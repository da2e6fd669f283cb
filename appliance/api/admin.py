"""Admin API under /admin/: bearer-token auth, status snapshot, events, engine control."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from dataclasses import asdict
from typing import Any

from aiohttp import web

from appliance.api.errors import Handler
from appliance.api.keys import SERVICES
from appliance.config.telemetry import FAULT_NAMES
from appliance.errors import ApplianceError, BadRequest, Unauthorized
from appliance.services.container import Services
from appliance.services.supervisor import EngineState

routes = web.RouteTableDef()


class Conflict(ApplianceError):
    status = 409
    type = "conflict"
    code = "conflict"


@web.middleware
async def admin_auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every /admin/ call needs 'Authorization: Bearer <token>'."""
    if request.path.startswith("/admin/") or request.path == "/admin":
        token = request.app[SERVICES].admin_token
        auth = request.headers.get("Authorization", "")
        given = auth[7:].strip() if auth.startswith("Bearer ") else ""
        if not given or not hmac.compare_digest(given.encode(), token.encode()):
            raise Unauthorized(
                "Authorization: 'Bearer <admin token>' required; the token is in "
                "$APPLIANCE_ADMIN_TOKEN or the file admin.token in the state directory",
                code="invalid_admin_token",
            )
    return await handler(request)


def status_snapshot(svc: Services) -> dict[str, Any]:
    """The whole daemon state as one JSON-able dict."""
    sup = svc.supervisor
    engine: dict[str, Any] = {
        "state": sup.state.value,
        "model": svc.model_name,
        "restarts_total": dict(sup.restarts_total),
        "started_at_s": sup.started_at_s,
        "last_error": sup.last_error,
    }
    if sup.info is not None:
        engine.update(asdict(sup.info))
    try:
        e = sup.engine
        engine["stats"] = asdict(e.stats())
        engine["counters"] = e.counters()
        engine["child_pids"] = e.child_pids()
        engine["unfinished"] = e.num_unfinished()
    except ApplianceError:
        engine["stats"] = None
    adm = svc.admission.snapshot()
    return {
        "time_s": time.time(),
        "uptime_s": round(time.time() - svc.started_at_s, 1),
        "engine": engine,
        "admission": asdict(adm),
        "config": {
            "concurrency_limit": svc.config.concurrency_limit(),
            "max_queue_wait_s": svc.config.admission.max_queue_wait_s,
            "queue_capacity": svc.config.admission.queue_capacity.model_dump(),
            "max_model_len": svc.config.engine.max_model_len,
        },
        "telemetry": telemetry_snapshot(svc),
        "controller": svc.controller.snapshot(),
        "latency": _latency_snapshot(svc),
        "events": [e.to_dict() for e in svc.events.recent(20)],
        "long_context": svc.long_context.tracker.snapshot(),
        "availability": svc.slo.history.snapshot(),
    }


def _latency_snapshot(svc: Services) -> dict[str, Any]:
    stats = svc.latency.stats(time.monotonic(), min_samples=1)
    return {
        "window_s": svc.latency.window_s,
        "requests": stats.count,
        "ttft_p50_s": stats.ttft_p50_s,
        "ttft_p99_s": stats.ttft_p99_s,
        "tpot_p50_s": stats.tpot_p50_s,
        "tpot_p99_s": stats.tpot_p99_s,
    }


# SLOs an operator may set at run time: a millisecond to an hour.
_SLO_MIN_S = 0.001
_SLO_MAX_S = 3600.0


@routes.put("/admin/controller")
async def put_controller(request: web.Request) -> web.Response:
    """Set the controller: mode, limit, min, max, slo_ttft_p99_s, slo_tpot_p99_s (optional)."""
    svc = request.app[SERVICES]
    try:
        body = await request.json()
    except ValueError:
        raise BadRequest("body: not valid JSON", param="body") from None
    if not isinstance(body, dict):
        raise BadRequest("body: must be a JSON object", param="body")
    allowed = ("mode", "limit", "min", "max", "slo_ttft_p99_s", "slo_tpot_p99_s")
    unknown = set(body) - set(allowed)
    if unknown:
        raise BadRequest(
            f"{sorted(unknown)[0]}: unknown field; allowed: {', '.join(allowed)}",
            param=sorted(unknown)[0],
        )
    if "mode" in body and body["mode"] not in ("auto", "manual"):
        raise BadRequest(f"mode: must be 'auto' or 'manual', got {body['mode']!r}", param="mode")
    ints: dict[str, int | None] = {}
    for key in ("limit", "min", "max"):
        value = body.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096
        ):
            raise BadRequest(f"{key}: must be an integer between 1 and 4096", param=key)
        ints[key] = value
    slos: dict[str, float | None] = {}
    for key in ("slo_ttft_p99_s", "slo_tpot_p99_s"):
        value = body.get(key)
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not _SLO_MIN_S <= value <= _SLO_MAX_S
        ):
            raise BadRequest(
                f"{key}: must be a number of seconds between {_SLO_MIN_S} and {_SLO_MAX_S}",
                param=key,
            )
        slos[key] = None if value is None else float(value)
    try:
        svc.controller.configure(
            mode=body.get("mode"),
            limit=ints["limit"],
            min_limit=ints["min"],
            max_limit=ints["max"],
            slo_ttft_p99_s=slos["slo_ttft_p99_s"],
            slo_tpot_p99_s=slos["slo_tpot_p99_s"],
        )
    except ValueError as exc:
        raise BadRequest(str(exc), param="max") from None
    return web.json_response(svc.controller.snapshot())


def telemetry_snapshot(svc: Services) -> dict[str, Any]:
    """GPU samples, thermal state and the adapter's own status."""
    loop = svc.telemetry_loop
    state = loop.thermal_state
    out: dict[str, Any] = {
        "source": svc.telemetry.name,
        "simulated": svc.telemetry.simulated,
        "gpus": [s.to_dict() for s in loop.latest_samples],
        "thermal": {
            "level": state.level.value,
            "factor": state.factor,
            "since_s": state.since_s,
            "reason": loop.latest_decision.reason if loop.latest_decision else None,
        },
        "energy_total_j": loop.energy_total_j,
        "energy_per_token_j": {
            "window_s": loop.energy_per_token.window_s,
            "recent": loop.energy_per_token.recent_j(),
            "lifetime": loop.energy_per_token.lifetime_j(),
        },
        "samples_taken": loop.samples_taken,
        "last_sample_ms": None
        if loop.last_sample_duration_s is None
        else round(loop.last_sample_duration_s * 1000, 3),
        "errors": loop.errors,
        "last_error": loop.last_error,
    }
    if svc.faults is not None:
        out["faults"] = svc.faults.active_faults()
    status = getattr(svc.telemetry, "status", None)
    if callable(status):
        out["adapter"] = status()
    return out


@routes.get("/admin/estimate")
async def get_estimate(request: web.Request) -> web.Response:
    """The memory plan for the running config; ?seq_len=N&batch_size=N for what-ifs."""
    from appliance.precheck import plan_for_config

    svc = request.app[SERVICES]
    args: dict[str, int] = {}
    for key, hi in (("seq_len", 10_000_000), ("batch_size", 100_000)):
        if key in request.query:
            try:
                value = int(request.query[key])
            except ValueError:
                value = 0
            if not 1 <= value <= hi:
                raise BadRequest(f"{key}: must be an integer between 1 and {hi}", param=key)
            args[key] = value
    try:
        plan = await asyncio.to_thread(plan_for_config, svc.config, **args)
    except ValueError as exc:
        raise BadRequest(str(exc), param="model") from None
    return web.json_response(plan.to_dict())


@routes.get("/admin/precheck")
async def get_precheck(request: web.Request) -> web.Response:
    """The pre-check results from daemon start."""
    from appliance.precheck import exit_code, summary

    results = request.app[SERVICES].prechecks
    return web.json_response(
        {
            "results": [r.to_dict() for r in results],
            "summary": summary(results),
            "exit_code": exit_code(results),
        }
    )


@routes.post("/admin/telemetry/faults")
async def post_fault(request: web.Request) -> web.Response:
    """Inject a simulated-GPU fault: {name, gpu?, delta_c?, factor?, duration_s?}."""
    svc = request.app[SERVICES]
    faults = svc.faults
    if faults is None:
        raise Conflict("faults can only be injected into the simulated GPU (telemetry.source sim)")
    try:
        body = await request.json()
    except ValueError:
        raise BadRequest("body: not valid JSON", param="body") from None
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        raise BadRequest(f"name: required, one of {', '.join(FAULT_NAMES)}", param="name")
    kwargs = {k: body[k] for k in ("delta_c", "factor", "duration_s") if k in body}
    try:
        faults.set_fault(body["name"], body.get("gpu"), **kwargs)
    except (ValueError, TypeError) as exc:
        raise BadRequest(f"fault: {exc}".replace("\n", " "), param="name") from None
    svc.events.emit("fault_injected", f"simulated fault {body['name']} set", **body)
    return web.json_response({"faults": faults.active_faults()})


@routes.delete("/admin/telemetry/faults")
async def delete_faults(request: web.Request) -> web.Response:
    """Clear simulated-GPU faults (all, or ?name=...)."""
    svc = request.app[SERVICES]
    faults = svc.faults
    if faults is None:
        raise Conflict("no simulated GPU to clear faults on")
    removed = faults.clear_faults(request.query.get("name"))
    svc.events.emit("fault_cleared", f"{removed} simulated fault(s) cleared", removed=removed)
    return web.json_response({"removed": removed, "faults": faults.active_faults()})


@routes.get("/admin/status")
async def get_status(request: web.Request) -> web.Response:
    return web.json_response(status_snapshot(request.app[SERVICES]))


@routes.get("/admin/events")
async def get_events(request: web.Request) -> web.StreamResponse:
    """Server-sent events of state changes; ?history=N replays the last N first."""
    svc = request.app[SERVICES]
    try:
        history = max(0, min(500, int(request.query.get("history", "20"))))
    except ValueError:
        raise BadRequest("history: must be an integer between 0 and 500", param="history") from None
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)

    async def send(event: Any) -> None:
        await resp.write(
            f"id: {event.seq}\nevent: {event.kind}\n"
            f"data: {json.dumps(event.to_dict())}\n\n".encode()
        )

    subscription = svc.events.subscribe()
    # Subscribe before replaying so nothing falls between history and live.
    next_event = asyncio.ensure_future(anext(subscription))
    try:
        for event in svc.events.recent(history) if history else []:
            await send(event)
        while True:
            done, _ = await asyncio.wait({next_event}, timeout=15)
            if not done:
                await resp.write(b": keep-alive\n\n")  # proxies close idle streams
                continue
            try:
                event = next_event.result()
            except StopAsyncIteration:  # the daemon is shutting down
                return resp
            await send(event)
            next_event = asyncio.ensure_future(anext(subscription))
    finally:
        next_event.cancel()
        with contextlib.suppress(BaseException):
            await subscription.aclose()


@routes.post("/admin/engine/restart")
async def post_restart(request: web.Request) -> web.Response:
    """Start a graceful restart in the background; 202 at once, progress via events."""
    svc = request.app[SERVICES]
    if svc.background.restart_running() or svc.supervisor.state is EngineState.RESTARTING:
        raise Conflict("a restart is already in progress")
    svc.supervisor.check_admitting()
    # The restart outlives this HTTP call: the services keep the task (and cancel it at stop).
    svc.background.restart = asyncio.create_task(
        svc.supervisor.restart("requested through the admin API"), name="admin-restart"
    )
    return web.json_response({"status": "restarting"}, status=202)


@routes.post("/admin/engine/pause")
async def post_pause(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    svc.supervisor.pause()
    return web.json_response({"status": svc.supervisor.state.value})


@routes.post("/admin/engine/resume")
async def post_resume(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    svc.supervisor.resume()
    return web.json_response({"status": svc.supervisor.state.value})
