"""The OpenAI-compatible API: vLLM's own serving layer, with the appliance's admission on top.

Every request is parsed by vLLM's request model and answered by vLLM's serving class (see
adapters/vllm_frontend.py), so fields mean what they mean on `vllm serve`. What this module
adds is what no library does: API keys, lanes, the bounded admission queue (429, 408, 503
with Retry-After), deadlines, long documents read in parts, metrics, one `request_done`
log line per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from appliance.adapters.vllm_frontend import dumps, parse_request, request_fields
from appliance.api import long_context
from appliance.api.errors import Handler, error_body
from appliance.api.keys import SERVICES
from appliance.api.long_context import check_cap, strategy_of, wants_chunking
from appliance.api.middleware import ARRIVED_S
from appliance.api.validation import (
    MAX_DEADLINE_MS,
    chat_messages,
    check_model,
    common,
    decode_body,
)
from appliance.domain.api_keys import KeySpec, RateLimited, entitle
from appliance.domain.lanes import LANE_NAMES, Lane
from appliance.domain.parsed_request import Limits
from appliance.domain.request_scope import (
    CURRENT_SCOPE,
    DEADLINE_FINISH_REASON,
    JsonReply,
    Outcome,
    RequestScope,
    StreamReply,
)
from appliance.errors import ApplianceError, BadRequest, BodyTooLarge, Overloaded
from appliance.json_log import request_id_var
from appliance.services.container import Services
from appliance.services.long_context import ChunkedCall, LongRequest
from appliance.services.request_ledger import CallRecord, prompt_of

routes = web.RouteTableDef()

# The appliance's request fields for long documents (chat only); the others are
# `priority` and `deadline_ms`. Everything else is vLLM's.
_LONG_CONTEXT_FIELDS = ("long_context", "long_context_strategy")


@dataclass(frozen=True)
class Extensions:
    """The appliance's request fields, validated."""

    lane: Lane
    deadline_ms: int | None
    chunk: bool
    lane_downgraded: bool = False


def limits_of(svc: Services) -> Limits:
    """The request limits for the served model."""
    info = svc.supervisor.info
    return Limits(
        model_name=svc.model_name,
        max_model_len=info.max_model_len if info else svc.config.engine.max_model_len,
        max_tokens_default=svc.config.engine.max_tokens_default,
        max_body_bytes=svc.config.server.max_body_bytes,
        vocab_size=svc.tokenizer.vocab_size,
    )


def _authenticate(request: web.Request, svc: Services) -> KeySpec:
    """The caller's key (anonymous while no keys exist); Unauthorized otherwise."""
    return svc.tenancy.keys.authenticate(request.headers.get("Authorization"))


async def _read_json(request: web.Request, svc: Services) -> dict[str, Any]:
    limit = svc.config.server.max_body_bytes
    length = request.content_length
    if length is not None and length > limit:
        raise BodyTooLarge(f"body: {length} bytes is over the limit of {limit} bytes", param="body")
    return decode_body(await request.read(), limit)


def _extensions(body: dict[str, Any], svc: Services, endpoint: str, key: KeySpec) -> Extensions:
    """Take the appliance's fields out of body (vLLM's models must not see them); the lane
    is the one asked for within the key's ceiling (403 above it, unless downgraded)."""
    lane_name = body.pop("priority", None)
    if lane_name is not None and lane_name not in LANE_NAMES:
        raise BadRequest(
            f"priority: must be one of {list(LANE_NAMES)}, got {lane_name!r}", param="priority"
        )
    grant = entitle(key, None if lane_name is None else Lane.parse(lane_name))
    deadline = body.pop("deadline_ms", None)
    if deadline is not None and (
        isinstance(deadline, bool)
        or not isinstance(deadline, int)
        or not 1 <= deadline <= MAX_DEADLINE_MS
    ):
        raise BadRequest(
            f"deadline_ms: must be an integer between 1 and {MAX_DEADLINE_MS}, "
            f"got {json.dumps(deadline)[:40]}",
            param="deadline_ms",
        )
    lane = grant.lane
    if deadline is None:
        deadline = svc.config.admission.lane_deadline_ms.for_lane(lane.label)
    chunk = False
    if endpoint == "chat":
        chunk = wants_chunking(body, svc.config.long_context)
        strategy_of(body, svc.config.long_context)  # a bad value is a 400 even when it fits
    for key in _LONG_CONTEXT_FIELDS:
        if key in body and endpoint != "chat":
            raise BadRequest(f"{key}: only /v1/chat/completions reads long documents", param=key)
    return Extensions(
        lane=lane, deadline_ms=deadline, chunk=chunk, lane_downgraded=grant.downgraded
    )


@routes.get("/v1/models")
async def list_models(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    _authenticate(request, svc)
    frontend = svc.supervisor.frontend()
    return web.json_response(await frontend.models(), dumps=dumps)


def _route(
    endpoint: str, serve: Callable[[web.Request, str], Awaitable[web.StreamResponse]]
) -> Handler:
    """A handler that serves endpoint with serve (admitted generation, or a utility)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        return await serve(request, endpoint)

    handle.__name__ = f"{endpoint}_handler"
    return handle


async def _utility(request: web.Request, endpoint: str) -> web.StreamResponse:
    """Tokenizer endpoints: no engine step, so no admission slot."""
    svc = request.app[SERVICES]
    _authenticate(request, svc)
    parsed = parse_request(endpoint, await _read_json(request, svc))
    reply = await svc.supervisor.frontend().serve(endpoint, parsed)
    assert isinstance(reply, JsonReply)
    return web.json_response(reply.body, status=reply.status, dumps=dumps)


async def _generate(request: web.Request, endpoint: str) -> web.StreamResponse:
    """A generating call, accounted to its key once however it ends."""
    svc = request.app[SERVICES]
    rid = request_id_var.get() or uuid.uuid4().hex
    call = svc.tenancy.ledger.open(endpoint, request.get(ARRIVED_S, time.monotonic()), rid)
    try:
        resp = await _generate_call(request, svc, call)
        call.http_status = resp.status
        return resp
    except ApplianceError as exc:
        call.http_status = exc.status
        call.status = call.status or _status_of(exc)
        raise
    except asyncio.CancelledError:
        call.http_status, call.status = 499, "cancelled"  # 499: nginx's "client went away"
        raise
    except Exception:
        call.http_status, call.status = 500, "error"
        raise
    finally:
        svc.tenancy.ledger.close(call)


async def _generate_call(
    request: web.Request, svc: Services, call: CallRecord
) -> web.StreamResponse:
    endpoint, rid = call.endpoint, call.request_id
    call.key = _authenticate(request, svc)
    body = await _read_json(request, svc)
    call.prompt, call.model = prompt_of(body), str(body.get("model") or svc.model_name)
    ext = _extensions(body, svc, endpoint, call.key)
    call.lane = ext.lane.label
    call.charge = svc.tenancy.quotas.admit(call.key, _token_estimate(body, call.prompt, svc))
    if "request_id" in request_fields(endpoint) and "request_id" not in body:
        body["request_id"] = rid
    if endpoint in ("chat", "completion") and all(
        body.get(k) is None for k in ("max_tokens", "max_completion_tokens")
    ):
        # engine.max_tokens_default caps an answer the client left open (vLLM would run
        # to the end of the context); vLLM still clamps it to the room the prompt leaves.
        body["max_tokens"] = svc.config.engine.max_tokens_default
    if ext.chunk:
        long = await _long_document(svc, body)
        if long is not None:
            return await _serve_chunked(request, svc, body, ext, long, call)
    for key in _LONG_CONTEXT_FIELDS:
        body.pop(key, None)
    parsed = parse_request(endpoint, body)
    return await _serve(request, svc, ext, parsed, call)


def _token_estimate(body: dict[str, Any], prompt: str, svc: Services) -> int:
    """What a key's tokens-per-minute window is charged up front (settled with the real
    count after the answer): about 4 characters a token of prompt, plus the answer's cap."""
    cap = body.get("max_completion_tokens") or body.get("max_tokens")
    answer = cap if isinstance(cap, int) and cap > 0 else svc.config.engine.max_tokens_default
    return _prompt_estimate(prompt) + answer


def _prompt_estimate(prompt: str) -> int:
    """The prompt's tokens as admission counts them, before vLLM tokenises it: about 4
    characters a token (the prefill budget's rate is measured in the same unit)."""
    return len(prompt) // 4 + 1


def _reply_headers(call: CallRecord, ext: Extensions) -> dict[str, str]:
    headers = dict(call.charge.headers) if call.charge is not None else {}
    if ext.lane_downgraded:
        headers["x-appliance-lane"] = ext.lane.label  # served below the lane asked for
    return headers


@contextlib.asynccontextmanager
async def _admitted(
    svc: Services, ext: Extensions, call: CallRecord
) -> AsyncIterator[float | None]:
    """Readiness, the lane's queue, one slot for the body; the request's metrics and log
    line on the way out, whatever happened. Yields the deadline (monotonic s) or None."""
    status = "error"
    outcome, arrived_s = call.outcome, call.arrived_s
    try:
        svc.metrics.arrivals += 1
        svc.supervisor.check_admitting()
        deadline_s = arrived_s + ext.deadline_ms / 1000 if ext.deadline_ms else None
        assert call.key is not None
        async with svc.admission.slot(
            ext.lane, deadline_s, call.key, prefill_tokens=_prompt_estimate(call.prompt)
        ) as slot:
            outcome.on_first_token = slot.first_token
            outcome.admitted_s = time.monotonic()
            svc.metrics.queue_wait_seconds.labels(ext.lane.label).observe(
                outcome.admitted_s - arrived_s
            )
            yield deadline_s
            status = _status_of_outcome(outcome)
    except asyncio.CancelledError:
        status = "cancelled"  # the client went away; vLLM's request was aborted on the way out
        raise
    except ApplianceError as exc:
        status = _status_of(exc)
        raise
    finally:
        call.status, call.accounted = status, True
        svc.accounting.record(ext.lane, call.endpoint, outcome, arrived_s, status)


async def _serve(
    request: web.Request, svc: Services, ext: Extensions, parsed: Any, call: CallRecord
) -> web.StreamResponse:
    """Admission, then vLLM's serving class under the request's scope."""
    outcome = call.outcome
    async with _admitted(svc, ext, call) as deadline_s:
        token = CURRENT_SCOPE.set(RequestScope(int(ext.lane), deadline_s, outcome))
        try:
            reply = await svc.supervisor.frontend().serve(call.endpoint, parsed)
            headers = _reply_headers(call, ext)
            if isinstance(reply, StreamReply):
                return await _stream(request, reply, outcome, headers)
            return web.json_response(reply.body, status=reply.status, dumps=dumps, headers=headers)
        finally:
            CURRENT_SCOPE.reset(token)


async def _stream(
    request: web.Request, reply: StreamReply, outcome: Outcome, headers: dict[str, str]
) -> web.StreamResponse:
    """vLLM's SSE frames as they come; an engine failure's frame in the appliance's shape."""
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Request-Id": request_id_var.get() or "",
            **headers,
        }
    )
    await resp.prepare(request)
    try:
        async for frame in reply.frames:
            if outcome.error is not None and frame.startswith('data: {"error"'):
                # vLLM types every failure in a stream as a 400; say what it was.
                if isinstance(outcome.error, ApplianceError):
                    frame = f"data: {json.dumps(error_body(outcome.error))}\n\n"
                outcome.finish_reason = "error"
            await resp.write(frame.encode())
    finally:
        # A client gone mid-write leaves vLLM's generator suspended: closing it aborts the
        # engine request now, not at garbage collection.
        close = getattr(reply.frames, "aclose", None)
        if close is not None:
            await close()
    await resp.write_eof()
    return resp


# What a document read in parts honours; any other field is refused there, never ignored.
_CHUNKED_FIELDS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "stream",
        "stream_options",
        "request_id",
        "n",
        "user",
        *_LONG_CONTEXT_FIELDS,
    }
)


async def _long_document(svc: Services, body: dict[str, Any]) -> LongRequest | None:
    """The chunking plan when the chat prompt is over the context, else None."""
    limits = limits_of(svc)
    check_model(body, limits)
    messages = chat_messages(body)
    prompt = svc.tokenizer.chat_prompt(messages)
    ids = await asyncio.to_thread(svc.tokenizer.encode, prompt)
    check_cap(len(ids), svc.config.long_context, param="messages")
    probe = dict(body, priority="interactive")
    probe.pop("deadline_ms", None)
    try:
        common(probe, "chat", ids, limits)
        return None  # it fits: vLLM serves it as it is
    except BadRequest as exc:
        if exc.code != "context_length_exceeded":
            raise
    extra = sorted(set(body) - _CHUNKED_FIELDS)
    if extra:
        raise BadRequest(
            f"{extra[0]}: not served for a document read in parts (long_context: chunk); "
            f"served there: {sorted(_CHUNKED_FIELDS)}",
            param=extra[0],
        )
    field_checked = common(probe, "chat", None, limits)
    return await svc.long_context.plan(
        strategy_of(body, svc.config.long_context),
        messages,
        len(ids),
        field_checked.sampling.max_tokens,
        limits,
    )


async def _serve_chunked(
    request: web.Request,
    svc: Services,
    body: dict[str, Any],
    ext: Extensions,
    long: LongRequest,
    call: CallRecord,
) -> web.StreamResponse:
    """A document over the context, read in parts inside one admission slot."""
    rid = body.get("request_id") or uuid.uuid4().hex
    limits = limits_of(svc)
    parsed = common(dict(body, priority=ext.lane.label), "chat", None, limits)
    parsed = dataclasses.replace(parsed, deadline_ms=ext.deadline_ms)
    outcome, arrived_s = call.outcome, call.arrived_s
    async with _admitted(svc, ext, call):
        source = svc.long_context.run(ChunkedCall(parsed, long, rid, outcome, arrived_s, limits))
        try:
            if parsed.stream:
                return await long_context.stream_reply(request, svc, parsed, rid, outcome, source)
            return await long_context.json_reply(svc, parsed, rid, outcome, source)
        finally:
            outcome.prompt_tokens = outcome.extra_prompt_tokens


def _status_of_outcome(outcome: Outcome) -> str:
    if outcome.error is not None or outcome.finish_reason == "error":
        return "error"
    return "deadline" if outcome.finish_reason == DEADLINE_FINISH_REASON else "ok"


def _status_of(exc: ApplianceError) -> str:
    """The accounting status of a refusal or failure."""
    if isinstance(exc, RateLimited):
        return "rate_limited"
    if isinstance(exc, Overloaded):
        return "rejected"
    named = {401: "unauthorized", 403: "forbidden", 503: "not_ready", 408: "deadline_queued"}
    if exc.status in named:
        return named[exc.status]
    return "bad_request" if 400 <= exc.status < 500 else "error"


# vLLM's endpoints, each under the appliance's key check; the generating ones admitted.
for _path, _endpoint in (
    ("/v1/chat/completions", "chat"),
    ("/v1/completions", "completion"),
    ("/v1/responses", "responses"),
):
    routes.post(_path)(_route(_endpoint, _generate))
for _path, _endpoint in (("/tokenize", "tokenize"), ("/detokenize", "detokenize")):
    routes.post(_path)(_route(_endpoint, _utility))
# Pooling models (embeddings, classification, scores): admitted like generation; the lane
# orders the queue, a deadline bounds the wait (one engine step leaves nothing to cut).
for _path, _endpoint in (
    ("/v1/embeddings", "embeddings"),
    ("/pooling", "pooling"),
    ("/classify", "classify"),
    ("/score", "score"),
    ("/v1/score", "score"),
    ("/rerank", "rerank"),
    ("/v1/rerank", "rerank"),
    ("/v2/rerank", "rerank"),
):
    routes.post(_path)(_route(_endpoint, _generate))
