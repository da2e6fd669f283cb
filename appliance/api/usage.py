"""Admin routes for the keys and what they used: GET /admin/usage, GET /admin/keys."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Any

from aiohttp import web

from appliance.api.keys import SERVICES
from appliance.errors import BadRequest
from appliance.services.usage import utc_day

routes = web.RouteTableDef()

# The span /admin/usage answers when no `from` is given: the last week, today included.
DEFAULT_DAYS = 7
MAX_DAYS = 400


def _day(request: web.Request, name: str, default: str) -> str:
    value = request.query.get(name, default)
    try:
        return dt.date.fromisoformat(value).isoformat()
    except ValueError:
        raise BadRequest(
            f"{name}: must be a date as YYYY-MM-DD (UTC), got {value[:40]!r}", param=name
        ) from None


@routes.get("/admin/usage")
async def get_usage(request: web.Request) -> web.Response:
    """Requests and tokens per key, from..to (UTC days, both included; default the last 7)."""
    svc = request.app[SERVICES]
    today = utc_day(time.time())
    week_ago = (dt.date.fromisoformat(today) - dt.timedelta(days=DEFAULT_DAYS - 1)).isoformat()
    to_day = _day(request, "to", today)
    from_day = _day(request, "from", week_ago)
    span = (dt.date.fromisoformat(to_day) - dt.date.fromisoformat(from_day)).days
    if span < 0:
        raise BadRequest(f"from: {from_day} is after to ({to_day})", param="from")
    if span >= MAX_DAYS:
        raise BadRequest(f"from: at most {MAX_DAYS} days per call, asked {span + 1}", param="from")
    report = await asyncio.to_thread(svc.tenancy.usage.report, from_day, to_day)
    return web.json_response(report)


@routes.get("/admin/keys")
async def get_keys(request: web.Request) -> web.Response:
    """The active keys (name, lanes, limits; never a secret) and what each runs and queues."""
    svc = request.app[SERVICES]
    snap = svc.admission.snapshot()
    keys: list[dict[str, Any]] = [
        {
            **spec.as_dict(),
            "running": snap.running_by_key.get(spec.name, 0),
            "queued": snap.queued_by_key.get(spec.name, 0),
        }
        for spec in svc.tenancy.keys.keys
    ]
    return web.json_response({"open": svc.tenancy.keys.open, "keys": keys})
