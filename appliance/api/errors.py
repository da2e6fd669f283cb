"""The one JSON error shape (OpenAI's), and the middleware that maps every failure to it."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from appliance.errors import ApplianceError, BodyTooLarge, NotFound, Overloaded

log = logging.getLogger("appliance.api")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_body(exc: ApplianceError) -> dict[str, object]:
    """OpenAI's error object: message, type, param, code."""
    return {
        "error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}
    }


def error_response(exc: ApplianceError) -> web.Response:
    """An HTTP response for exc, with Retry-After where the caller should come back."""
    headers = {}
    retry = getattr(exc, "retry_after_s", None)
    if retry is not None:
        headers["Retry-After"] = str(int(retry))
    if not exc.retryable:
        headers["x-should-retry"] = "false"  # honoured by the official OpenAI clients
    # A key's rate limit names its window as OpenAI does (x-ratelimit-*).
    headers.update(getattr(exc, "headers", None) or {})
    return web.Response(
        status=exc.status,
        text=json.dumps(error_body(exc)),
        content_type="application/json",
        headers=headers,
    )


def _from_http(exc: web.HTTPException) -> ApplianceError:
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return BodyTooLarge(f"body: larger than the limit ({exc.text})", param="body")
    if isinstance(exc, web.HTTPNotFound):
        return NotFound("no such endpoint", code="not_found")
    err = ApplianceError(exc.reason or "error")
    err.status = exc.status
    err.type = "invalid_request_error" if 400 <= exc.status < 500 else "internal_error"
    return err


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map ApplianceError and aiohttp's own HTTP errors to the JSON shape, in one place."""
    try:
        return await handler(request)
    except ApplianceError as exc:
        if isinstance(exc, Overloaded) or exc.status >= 500:
            log.warning(exc.message, extra={"status": exc.status, "code": exc.code})
        return error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(_from_http(exc))
    except Exception:
        log.exception("unhandled error", extra={"path": request.path})
        return error_response(ApplianceError("internal error; see the daemon log"))
