"""The aiohttp application: one factory, services started and stopped in one place."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator

from aiohttp import web

from appliance.api import admin, health, openai
from appliance.api.errors import Handler, error_middleware
from appliance.api.keys import SERVICES, Services
from appliance.config import Config, served_model_name
from appliance.errors import EngineStartError
from appliance.logs import request_id_var
from appliance.ports import EngineFactory, Tokenizer
from appliance.services.admin_token import load_or_create_admin_token
from appliance.services.admission import LANE_NAMES, AdmissionQueue
from appliance.services.events import EventBus
from appliance.services.metrics import Metrics
from appliance.services.supervisor import EngineState, EngineSupervisor

log = logging.getLogger("appliance.app")

# Set when the first engine start fails: serve() exits non-zero so systemd can act.
FATAL = web.AppKey("fatal", asyncio.Future)


@web.middleware
async def request_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tag every log line of a request with its id (the client's X-Request-Id, or a new one)."""
    rid = request.headers.get("X-Request-Id") or uuid.uuid4().hex[:16]
    token = request_id_var.set(rid)
    try:
        resp = await handler(request)
        if not resp.prepared:
            resp.headers.setdefault("X-Request-Id", rid)
        return resp
    finally:
        request_id_var.reset(token)


def build_services(cfg: Config, engine_factory: EngineFactory, tokenizer: Tokenizer) -> Services:
    """Construct the daemon's services (nothing started yet)."""
    events = EventBus()
    admission = AdmissionQueue(cfg.admission)
    supervisor = EngineSupervisor(
        engine_factory, admission, events, cfg.engine, retry_after_s=cfg.admission.retry_after_s
    )
    svc = Services(
        config=cfg,
        model_name=served_model_name(cfg),
        tokenizer=tokenizer,
        events=events,
        metrics=Metrics(),
        admission=admission,
        supervisor=supervisor,
        admin_token=load_or_create_admin_token(cfg.state_dir / cfg.server.admin_token_file),
        started_at_s=time.time(),
    )
    _wire_metrics(svc)
    return svc


def _wire_metrics(svc: Services) -> None:
    m = svc.metrics
    restarts_seen: dict[str, int] = {}

    def refresh() -> None:
        snap = svc.admission.snapshot()
        m.requests_in_flight.set(snap.in_flight)
        m.concurrency_limit.set(snap.limit)
        for lane in LANE_NAMES:
            m.queue_depth.labels(lane).set(snap.queued[lane])
        m.engine_ready.set(1 if svc.supervisor.state is EngineState.READY else 0)
        for cause, count in svc.supervisor.restarts_total.items():
            delta = count - restarts_seen.get(cause, 0)
            if delta > 0:
                m.engine_restarts_total.labels(cause).inc(delta)
                restarts_seen[cause] = count
        try:
            stats = svc.supervisor.engine.stats()
        except Exception:
            return
        m.kv_cache_usage_ratio.set(stats.kv_cache_usage_ratio)
        m.engine_running.set(stats.running)
        m.engine_waiting.set(stats.waiting)

    m.add_refresher(refresh)


def build_app(cfg: Config, engine_factory: EngineFactory, tokenizer: Tokenizer) -> web.Application:
    """The app with every route; the engine starts in the background once it listens."""
    app = web.Application(
        middlewares=[request_id_middleware, error_middleware, admin.admin_auth_middleware],
        # Our own check names the limit; aiohttp's is a backstop one byte above it.
        client_max_size=cfg.server.max_body_bytes + 1,
    )
    svc = build_services(cfg, engine_factory, tokenizer)
    app[SERVICES] = svc
    app[FATAL] = asyncio.get_event_loop().create_future()
    app.add_routes(health.routes)
    app.add_routes(openai.routes)
    app.add_routes(admin.routes)
    app.cleanup_ctx.append(_engine_ctx)
    return app


async def _engine_ctx(app: web.Application) -> AsyncIterator[None]:
    svc = app[SERVICES]
    fatal = app[FATAL]

    async def start() -> None:
        try:
            await svc.supervisor.start()
        except EngineStartError as exc:
            svc.events.emit("engine_start_failed", str(exc))
            if not fatal.done():
                fatal.set_exception(exc)

    task = asyncio.create_task(start(), name="engine-start")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    if svc.restart_task is not None and not svc.restart_task.done():
        svc.restart_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await svc.restart_task
    await svc.supervisor.stop()
