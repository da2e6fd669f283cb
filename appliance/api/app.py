"""The aiohttp application: one factory, services started and stopped in one place."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from appliance.adapters.simgpu import SimGpu
from appliance.api import admin, health, maintenance, openai
from appliance.api.errors import Handler, error_middleware
from appliance.api.keys import SERVICES, Services
from appliance.api.long_context import LongContextTracker
from appliance.config import Config, served_model_name
from appliance.domain.controller import ControlMode
from appliance.domain.gpu_sample import GpuSample, Telemetry
from appliance.domain.latency_window import LatencyWindow
from appliance.domain.thermal import ThermalDecision, ThermalLevel
from appliance.errors import EngineStartError
from appliance.logs import request_id_var
from appliance.ports import EngineFactory, Tokenizer
from appliance.services.admin_token import load_or_create_admin_token
from appliance.services.admission import LANE_NAMES, AdmissionQueue
from appliance.services.control_loop import ControlLoop
from appliance.services.events import EventBus
from appliance.services.metrics import Metrics
from appliance.services.store import StateStore
from appliance.services.supervisor import EngineState, EngineSupervisor
from appliance.services.telemetry_loop import TelemetryLoop, build_telemetry
from appliance.services.telemetry_metrics import TelemetryCollector

log = logging.getLogger("appliance.app")

# Set when the first engine start fails: serve() exits non-zero so systemd can act.
FATAL = web.AppKey("fatal", asyncio.Future)


@web.middleware
async def request_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tag every log line of a request with its id (the client's X-Request-Id, or a new one)."""
    rid = request.headers.get("X-Request-Id") or uuid.uuid4().hex[:16]
    # Deadlines and latencies count from here, before body parsing and tokenization.
    request[openai.ARRIVED_S] = time.monotonic()
    token = request_id_var.set(rid)
    try:
        resp = await handler(request)
        if not resp.prepared:
            resp.headers.setdefault("X-Request-Id", rid)
        return resp
    finally:
        request_id_var.reset(token)


def build_services(
    cfg: Config,
    engine_factory: EngineFactory,
    tokenizer: Tokenizer,
    telemetry: Telemetry | None = None,
) -> Services:
    """Construct the daemon's services (nothing started yet)."""
    events = EventBus()
    admission = AdmissionQueue(cfg.admission, limit=cfg.concurrency_limit())
    supervisor = EngineSupervisor(
        engine_factory, admission, events, cfg.engine, retry_after_s=cfg.admission.retry_after_s
    )
    if telemetry is None:
        telemetry = build_telemetry(cfg.telemetry)
    if isinstance(telemetry, SimGpu):
        telemetry.set_load_fn(lambda: _engine_load(supervisor, admission))

    def on_decision(d: ThermalDecision) -> None:
        admission.set_derate(d.factor, protect=d.level is ThermalLevel.PROTECT)
        if d.changed:
            events.emit(
                "thermal",
                d.reason,
                level=d.level.value,
                factor=round(d.factor, 3),
                gpu=d.gpu_index,
                temp_c=d.temp_c,
                limit=admission.limit,
            )

    metrics = Metrics()
    telemetry_loop = TelemetryLoop(
        telemetry,
        cfg.thermal.to_policy(),
        cfg.telemetry.interval_s,
        on_sample=_lost_gpu_watch(events),
        on_decision=on_decision,
        tokens_fn=lambda: metrics.generated_tokens,
    )
    store = StateStore(cfg.state_dir / "appliance.db")
    latency = LatencyWindow(window_s=max(60.0, cfg.controller.window_s))
    holder: dict[str, Services] = {}
    controller = ControlLoop(
        cfg.controller.to_policy(cfg.slo, cfg.engine.max_num_seqs),
        ControlMode(cfg.controller.mode),
        admission,
        latency,
        kv_usage=lambda: _kv_usage(supervisor),
        ceiling=lambda: holder["svc"].ceiling if "svc" in holder else None,
        events=events,
        record=store.add_decision,
        forecast=_forecaster(cfg, holder) if cfg.controller.forecast == "auto" else None,
    )
    events.add_sink(lambda e: store.add_event(e.ts_s, e.kind, e.reason, e.data))
    svc = Services(
        config=cfg,
        model_name=served_model_name(cfg),
        tokenizer=tokenizer,
        events=events,
        metrics=metrics,
        admission=admission,
        supervisor=supervisor,
        telemetry=telemetry,
        telemetry_loop=telemetry_loop,
        admin_token=load_or_create_admin_token(cfg.state_dir / cfg.server.admin_token_file),
        started_at_s=time.time(),
        store=store,
        latency=latency,
        controller=controller,
        slo_ttft_p99_s=cfg.slo.ttft_p99_s,
        slo_tpot_p99_s=cfg.slo.tpot_p99_s,
    )
    holder["svc"] = svc
    _wire_metrics(svc)
    svc.metrics.add_collector(TelemetryCollector(telemetry_loop))
    return svc


def _forecaster(cfg: Config, holder: dict[str, Services]) -> Callable[[], object]:
    """Pending requests expected soon, from the last five minutes of metric history."""
    model = cfg.state_dir / "load_predictor.pt"

    def forecast() -> object:
        from appliance.predict.runtime import load_forecast

        history = holder["svc"].history if "svc" in holder else None
        if history is None:
            return None
        rows = history.history(time.time() - 300)
        return load_forecast(
            rows, model if model.exists() else None, horizon_s=cfg.controller.forecast_horizon_s
        )

    return forecast


def _lost_gpu_watch(events: EventBus) -> Callable[[list[GpuSample]], None]:
    """An event when a GPU falls off the bus and when it is back (the policy protects)."""
    lost: set[str] = set()

    def on_sample(samples: list[GpuSample]) -> None:
        now = {s.uuid for s in samples if s.lost}
        for s in samples:
            if s.lost and s.uuid not in lost:
                events.emit(
                    "gpu_lost",
                    f"{s.label} ({s.uuid}) is lost: PROTECT, readiness 503, realtime only",
                    gpu=s.index,
                    uuid=s.uuid,
                )
        for s in samples:
            if s.uuid in lost and s.uuid not in now:
                events.emit("gpu_recovered", f"{s.label} ({s.uuid}) answers again", gpu=s.index)
        lost.clear()
        lost.update(now)

    return on_sample


def _kv_usage(supervisor: EngineSupervisor) -> float:
    try:
        return supervisor.engine.stats().kv_cache_usage_ratio
    except Exception:
        return 0.0


def _engine_load(supervisor: EngineSupervisor, admission: AdmissionQueue) -> float:
    """0..1: sequences running now over the most allowed; drives the simulated GPU's power."""
    try:
        running = supervisor.engine.stats().running
    except Exception:
        return 0.0
    return min(1.0, max(running, admission.in_flight) / max(1, admission.base_limit))


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


def build_app(
    cfg: Config,
    engine_factory: EngineFactory,
    tokenizer: Tokenizer,
    telemetry: Telemetry | None = None,
) -> web.Application:
    """The app with every route; the engine starts in the background once it listens."""
    app = web.Application(
        middlewares=[request_id_middleware, error_middleware, admin.admin_auth_middleware],
        # Our own check names the limit; aiohttp's is a backstop one byte above it.
        client_max_size=cfg.server.max_body_bytes + 1,
    )
    svc = build_services(cfg, engine_factory, tokenizer, telemetry)
    app[SERVICES] = svc
    app[openai.LONG_CONTEXT] = LongContextTracker()
    app[FATAL] = asyncio.get_event_loop().create_future()
    app.add_routes(health.routes)
    app.add_routes(openai.routes)
    app.add_routes(admin.routes)
    app.add_routes(maintenance.routes)
    # Start order: the store (closed last), telemetry (derating applies from the first
    # request), the engine, the controller, maintenance. Teardown runs in reverse.
    app.cleanup_ctx.append(_store_ctx)
    app.cleanup_ctx.append(_telemetry_ctx)
    app.cleanup_ctx.append(_engine_ctx)
    app.cleanup_ctx.append(_controller_ctx)
    app.cleanup_ctx.append(maintenance.maintenance_ctx)
    return app


async def _controller_ctx(app: web.Application) -> AsyncIterator[None]:
    svc = app[SERVICES]
    await svc.controller.start()
    yield
    await svc.controller.stop()


async def _store_ctx(app: web.Application) -> AsyncIterator[None]:
    yield
    app[SERVICES].store.close()


async def _telemetry_ctx(app: web.Application) -> AsyncIterator[None]:
    svc = app[SERVICES]
    await svc.telemetry_loop.start()
    svc.events.emit(
        "telemetry_started",
        f"telemetry from {svc.telemetry.name}",
        source=svc.telemetry.name,
        simulated=svc.telemetry.simulated,
    )
    yield
    await svc.telemetry_loop.stop()
    svc.telemetry.close()


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
