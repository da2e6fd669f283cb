"""Per-request tagging: the request id on every log line, and when the request arrived."""

from __future__ import annotations

import time
import uuid

from aiohttp import web

from appliance.api.errors import Handler
from appliance.json_log import request_id_var

# When the request reached the daemon (set here, before parsing).
ARRIVED_S = web.RequestKey("arrived_s", float)


@web.middleware
async def request_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tag every log line of a request with its id (the client's X-Request-Id, or a new one)."""
    rid = request.headers.get("X-Request-Id") or uuid.uuid4().hex[:16]
    # Deadlines and latencies count from here, before body parsing and tokenization.
    request[ARRIVED_S] = time.monotonic()
    token = request_id_var.set(rid)
    try:
        resp = await handler(request)
        if not resp.prepared:
            resp.headers.setdefault("X-Request-Id", rid)
        return resp
    finally:
        request_id_var.reset(token)
