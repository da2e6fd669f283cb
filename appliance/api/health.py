"""Liveness, readiness and the Prometheus endpoint."""

from __future__ import annotations

from aiohttp import web

from appliance.api.keys import SERVICES, Services

routes = web.RouteTableDef()


@routes.get("/health/live")
async def live(request: web.Request) -> web.Response:
    return web.json_response({"status": "alive"})


def readiness(svc: Services) -> tuple[bool, str, str | None]:
    """(ready, reason, detail): the engine's state first, then thermal PROTECT.

    PROTECT (HBM at its limit, a core at its slowdown threshold, a lost GPU) admits only
    realtime requests, so the box is not ready for general traffic: a balancer in front
    should send it elsewhere until the policy clears it.
    """
    ok, reason = svc.supervisor.readiness()
    if not ok:
        return False, reason, None
    if svc.admission.protect:
        decision = svc.telemetry_loop.latest_decision
        return False, "protect", decision.reason if decision is not None else None
    return True, reason, None


@routes.get("/health")
@routes.get("/ping")
@routes.post("/ping")
async def vllm_health(request: web.Request) -> web.Response:
    """vLLM's probe, as vLLM answers it: 200 with no body while the engine is alive, else
    503 (tools written for vLLM, GuideLLM among them, check it before they start)."""
    alive = request.app[SERVICES].supervisor.engine_alive()
    return web.Response(status=200 if alive else 503)


@routes.get("/version")
async def version(request: web.Request) -> web.Response:
    """vLLM's version endpoint, plus the appliance's own."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    info = request.app[SERVICES].supervisor.info
    try:
        ours = dist_version("appliance")
    except PackageNotFoundError:
        ours = "unknown"
    return web.json_response({"version": info.version if info else "", "appliance": ours})


@routes.get("/health/ready")
async def ready(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    ok, reason, detail = readiness(svc)
    if ok:
        return web.json_response({"status": "ready"})
    body = {"status": "not_ready", "reason": reason}
    if detail:
        body["detail"] = detail
    return web.json_response(
        body, status=503, headers={"Retry-After": str(svc.config.admission.retry_after_s)}
    )


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    return web.Response(
        body=svc.metrics.render(),
        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
    )
