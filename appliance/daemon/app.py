"""The daemon's aiohttp application: the services composed, the routes on top, the
lifecycle attached (the engine starts in the background once it listens)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiohttp import web

from appliance.api import admin, health, maintenance, openai, usage
from appliance.api.errors import error_middleware
from appliance.api.keys import SERVICES
from appliance.api.middleware import request_id_middleware
from appliance.config import Config
from appliance.daemon.compose import compose
from appliance.daemon.lifecycle import FATAL, contexts
from appliance.domain.gpu_sample import Telemetry
from appliance.ports import EngineFactory, Tokenizer
from appliance.precheck import CheckResult


def build_app(
    cfg: Config,
    engine_factory: EngineFactory,
    tokenizer: Tokenizer,
    telemetry: Telemetry | None = None,
    prechecks: Sequence[CheckResult] = (),
) -> web.Application:
    """The app with every route over freshly composed services."""
    app = web.Application(
        middlewares=[request_id_middleware, error_middleware, admin.admin_auth_middleware],
        # Our own check names the limit; aiohttp's is a backstop one byte above it.
        client_max_size=cfg.server.max_body_bytes + 1,
    )
    svc = compose(cfg, engine_factory, tokenizer, telemetry, prechecks)
    app[SERVICES] = svc
    app[FATAL] = asyncio.get_event_loop().create_future()
    for table in (health.routes, openai.routes, admin.routes, maintenance.routes, usage.routes):
        app.add_routes(table)
    app.cleanup_ctx.extend(contexts(svc))
    # aiohttp's shutdown signal comes before it waits for open handlers: end the /admin/events
    # streams there, or each connected console holds any runner's shutdown up.
    app.on_shutdown.append(_end_event_streams)
    return app


async def _end_event_streams(app: web.Application) -> None:
    app[SERVICES].events.close()
