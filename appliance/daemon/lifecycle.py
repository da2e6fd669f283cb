"""Start the services in order and stop them in reverse: the store (closed last), the
keys, usage and audit log (so every request is accounted, and written out after the drain),
telemetry (derating applies from the first request), the engine, the controller, then
metric history, its early-warning analysis and maintenance (after restoring what earlier
runs decided)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from appliance.errors import EngineStartError
from appliance.services import slo
from appliance.services.container import Services
from appliance.services.periodic import Periodic

log = logging.getLogger("appliance.daemon")
# How often the usage totals reach the state store.
USAGE_FLUSH_INTERVAL_S = 5.0

# Set when the first engine start fails: serve() exits non-zero so systemd can act.
FATAL = web.AppKey("fatal", asyncio.Future)


def contexts(svc: Services) -> list[Callable[[web.Application], AsyncIterator[None]]]:
    """aiohttp cleanup contexts, in start order."""

    async def store(app: web.Application) -> AsyncIterator[None]:
        yield
        slo.mark_clean_stop(svc.store)
        svc.store.close()

    async def tenancy(app: web.Application) -> AsyncIterator[None]:
        # A revoked key is refused within a second, without a restart.
        watch = asyncio.create_task(svc.tenancy.keys.watch(), name="keys-watch")
        flush = Periodic(
            "usage-flush",
            lambda: asyncio.to_thread(svc.tenancy.usage.flush),
            lambda: USAGE_FLUSH_INTERVAL_S,
            log,
        )
        if svc.tenancy.audit is not None:
            await svc.tenancy.audit.start()
        await flush.start()
        yield
        await flush.stop()
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        if svc.tenancy.audit is not None:
            await svc.tenancy.audit.stop()
        await asyncio.to_thread(svc.tenancy.usage.flush)

    async def telemetry(app: web.Application) -> AsyncIterator[None]:
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

    async def engine(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(_start_engine(svc, app[FATAL]), name="engine-start")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await svc.background.cancel_restart()
        await svc.supervisor.stop()

    async def controller(app: web.Application) -> AsyncIterator[None]:
        await svc.controller.start()
        yield
        await svc.controller.stop()

    async def maintenance(app: web.Application) -> AsyncIterator[None]:
        await svc.history.start()
        await svc.early_warning.start()
        svc.maintenance.restore()
        svc.maintenance.start()
        yield
        svc.maintenance.shutdown()
        await svc.early_warning.stop()
        await svc.history.stop()

    return [store, tenancy, telemetry, engine, controller, maintenance]


async def _start_engine(svc: Services, fatal: asyncio.Future[Any]) -> None:
    try:
        await svc.supervisor.start()
    except EngineStartError as exc:
        svc.events.emit("engine_start_failed", str(exc))
        if not fatal.done():
            fatal.set_exception(exc)
