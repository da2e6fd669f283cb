"""Liveness, readiness and the Prometheus endpoint."""

from __future__ import annotations

from aiohttp import web

from appliance.api.keys import SERVICES

routes = web.RouteTableDef()


@routes.get("/health/live")
async def live(request: web.Request) -> web.Response:
    return web.json_response({"status": "alive"})


@routes.get("/health/ready")
async def ready(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    ok, reason = svc.supervisor.readiness()
    if ok:
        return web.json_response({"status": "ready"})
    return web.json_response(
        {"status": "not_ready", "reason": reason},
        status=503,
        headers={"Retry-After": str(svc.config.admission.retry_after_s)},
    )


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    return web.Response(
        body=svc.metrics.render(),
        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
    )
