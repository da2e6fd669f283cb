"""OpenAI-compatible endpoints: /v1/models, /v1/chat/completions, /v1/completions."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from appliance.api.errors import error_body
from appliance.api.generation import Outcome, generate
from appliance.api.keys import SERVICES, Services
from appliance.api.long_context import (
    LONG_CONTEXT,
    LongRequest,
    Progress,
    check_cap,
    plan,
    run_chunked,
    strategy_of,
    wants_chunking,
)
from appliance.api.validation import (
    Limits,
    ParsedRequest,
    chat_messages,
    check_model,
    common,
    completion_prompt_ids,
    decode_body,
)
from appliance.domain.engine_types import GenerationDelta
from appliance.errors import ApplianceError, BadRequest, EngineDead, Unauthorized
from appliance.logs import request_id_var

log = logging.getLogger("appliance.requests")

# When the request reached the daemon (set by the request-id middleware, before parsing).
ARRIVED_S = web.RequestKey("arrived_s", float)

routes = web.RouteTableDef()

# Long prompts tokenize off the loop so one big document does not stall every stream.
_INLINE_TOKENIZE_CHARS = 4096


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


def _check_api_key(request: web.Request, svc: Services) -> None:
    keys = svc.config.server.api_keys
    if not keys:
        return
    auth = request.headers.get("Authorization", "")
    if not auth.startswith("Bearer ") or auth[7:] not in keys:
        raise Unauthorized("Authorization: a valid 'Bearer <api key>' is required")


async def _encode(svc: Services, text: str) -> list[int]:
    if len(text) <= _INLINE_TOKENIZE_CHARS:
        return svc.tokenizer.encode(text)
    return await asyncio.to_thread(svc.tokenizer.encode, text)


async def _read_json(request: web.Request, svc: Services) -> dict[str, Any]:
    limit = svc.config.server.max_body_bytes
    length = request.content_length
    if length is not None and length > limit:
        from appliance.errors import BodyTooLarge

        raise BodyTooLarge(f"body: {length} bytes is over the limit of {limit} bytes", param="body")
    return decode_body(await request.read(), limit)


@routes.get("/v1/models")
async def list_models(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    _check_api_key(request, svc)
    limits = limits_of(svc)
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": svc.model_name,
                    "object": "model",
                    "created": int(svc.started_at_s),
                    "owned_by": "appliance",
                    "max_model_len": limits.max_model_len,
                }
            ],
        }
    )


@routes.post("/v1/chat/completions")
async def chat_completions(request: web.Request) -> web.StreamResponse:
    svc = request.app[SERVICES]
    _check_api_key(request, svc)
    body = await _read_json(request, svc)
    limits = limits_of(svc)
    check_model(body, limits)
    messages = chat_messages(body)
    field_checked = common(body, "chat", None, limits)  # cheap, before the tokenizer runs
    chunk = wants_chunking(body, svc.config.long_context)
    strategy_of(body, svc.config.long_context)  # a bad value is a 400 even when it fits
    prompt = svc.tokenizer.chat_prompt(messages)
    ids = await _encode(svc, prompt)
    check_cap(len(ids), svc.config.long_context, param="messages")
    try:
        parsed = common(body, "chat", ids, limits)
    except BadRequest as exc:
        if not chunk or exc.code != "context_length_exceeded":
            raise
        long = await plan(
            svc, body, messages, len(ids), field_checked.sampling.max_tokens, limits
        )
        return await _serve(request, svc, field_checked, long=long)
    return await _serve(request, svc, parsed)


@routes.post("/v1/completions")
async def completions(request: web.Request) -> web.StreamResponse:
    svc = request.app[SERVICES]
    _check_api_key(request, svc)
    body = await _read_json(request, svc)
    limits = limits_of(svc)
    check_model(body, limits)
    common(body, "completion", None, limits)
    prompt = body.get("prompt")
    if isinstance(prompt, str) and len(prompt) > _INLINE_TOKENIZE_CHARS:
        ids = await asyncio.to_thread(completion_prompt_ids, body, svc.tokenizer, limits)
    else:
        ids = completion_prompt_ids(body, svc.tokenizer, limits)
    parsed = common(body, "completion", ids, limits)
    return await _serve(request, svc, parsed)


def _record(
    svc: Services, parsed: ParsedRequest, outcome: Outcome, arrived_s: float, status: str
) -> None:
    m = svc.metrics
    m.requests_total.labels(status).inc()
    if status == "rejected":
        m.rejected += 1
    elif status != "not_ready":
        m.finished += 1
    if status in ("deadline", "deadline_queued"):
        stage = "queued" if status == "deadline_queued" else "generating"
        m.deadline_expired_total.labels(parsed.lane.label, stage).inc()
    m.prompt_tokens_total.inc(len(parsed.prompt_token_ids))
    m.generated_tokens_total.inc(outcome.completion_tokens)
    m.generated_tokens += outcome.completion_tokens
    tpot: float | None = None
    if outcome.first_token_s is not None:
        ttft = outcome.first_token_s - arrived_s
        m.ttft_seconds.observe(ttft)
        if outcome.completion_tokens > 1 and outcome.last_token_s is not None:
            tpot = (outcome.last_token_s - outcome.first_token_s) / (outcome.completion_tokens - 1)
            m.tpot_seconds.observe(tpot)
        if status == "ok" and outcome.admitted_s is not None and outcome.long_context is None:
            # The controller judges the engine, so its TTFT starts at admission: queue wait
            # grows when the limit shrinks, and counting it would cut the limit to the floor.
            # A chunked document's first token comes after all its parts: not a TTFT either.
            svc.latency.add(time.monotonic(), outcome.first_token_s - outcome.admitted_s, tpot)
    e2e = time.monotonic() - arrived_s
    m.e2e_seconds.observe(e2e)
    # One line per request: what `appliance logs analyze` ties latency spikes to.
    log.info(
        "request done",
        extra={
            "event": "request_done",
            "request_id": request_id_var.get(),
            "ev_status": status,
            "ev_priority": parsed.lane.label,
            "ev_kind": parsed.kind,
            "ev_prompt_tokens": len(parsed.prompt_token_ids),
            "ev_completion_tokens": outcome.completion_tokens,
            "ev_finish_reason": outcome.finish_reason,
            "ev_queue_wait_s": _round(outcome.admitted_s, arrived_s),
            "ev_ttft_s": _round(outcome.first_token_s, arrived_s),
            "ev_tpot_s": None if tpot is None else round(tpot, 6),
            "ev_e2e_s": round(e2e, 6),
        },
    )


def _round(at_s: float | None, since_s: float) -> float | None:
    return None if at_s is None else round(at_s - since_s, 6)


async def _serve(
    request: web.Request, svc: Services, parsed: ParsedRequest, long: LongRequest | None = None
) -> web.StreamResponse:
    """Admission, generation, and the response: JSON or an SSE stream."""
    arrived_s = request.get(ARRIVED_S, time.monotonic())
    request_id = request_id_var.get() or uuid.uuid4().hex
    svc.metrics.arrivals += 1
    if parsed.deadline_ms is None:
        lane_default = svc.config.admission.lane_deadline_ms.for_lane(parsed.lane.label)
        if lane_default is not None:
            parsed = dataclasses.replace(parsed, deadline_ms=lane_default)
    svc.supervisor.check_admitting()
    deadline_abs = arrived_s + parsed.deadline_ms / 1000 if parsed.deadline_ms else None
    outcome = Outcome()
    status = "error"
    try:
        async with svc.admission.slot(parsed.lane, deadline_abs):
            outcome.admitted_s = time.monotonic()
            svc.metrics.queue_wait_seconds.labels(parsed.lane.label).observe(
                outcome.admitted_s - arrived_s
            )
            source: AsyncIterator[GenerationDelta | Progress] = (
                generate(svc, parsed, request_id, outcome, arrived_s)
                if long is None
                else run_chunked(
                    svc,
                    request.app[LONG_CONTEXT],
                    parsed,
                    long,
                    request_id,
                    outcome,
                    arrived_s,
                    limits_of(svc),
                )
            )
            if parsed.stream:
                resp = await _stream(request, svc, parsed, request_id, outcome, source)
            else:
                async for _ in source:
                    pass
                resp = web.json_response(_final_body(svc, parsed, request_id, outcome))
            status = {"deadline": "deadline", "error": "error"}.get(
                outcome.finish_reason or "", "ok"
            )
            return resp
    except asyncio.CancelledError:
        status = "cancelled"  # the client went away; vLLM's request was aborted on the way out
        raise
    except ApplianceError as exc:
        status = _status_of(exc)
        raise
    finally:
        _record(svc, parsed, outcome, arrived_s, status)


def _status_of(exc: ApplianceError) -> str:
    return {429: "rejected", 503: "not_ready", 408: "deadline_queued"}.get(exc.status, "error")


def _ids(parsed: ParsedRequest, request_id: str) -> tuple[str, str]:
    if parsed.kind == "chat":
        return f"chatcmpl-{request_id}", "chat.completion"
    return f"cmpl-{request_id}", "text_completion"


def _usage(parsed: ParsedRequest, outcome: Outcome) -> dict[str, int]:
    # A chunked document counts every pass: what the engine read and wrote for it.
    prompt = len(parsed.prompt_token_ids) + outcome.extra_prompt_tokens
    completion = outcome.completion_tokens + outcome.extra_completion_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _final_body(
    svc: Services, parsed: ParsedRequest, request_id: str, outcome: Outcome
) -> dict[str, Any]:
    oid, obj = _ids(parsed, request_id)
    text = "".join(outcome.text)
    choice: dict[str, Any] = {
        "index": 0,
        "logprobs": None,
        "finish_reason": outcome.finish_reason or "stop",
    }
    if parsed.kind == "chat":
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {
        "id": oid,
        "object": obj,
        "created": int(time.time()),
        "model": svc.model_name,
        "choices": [choice],
        "usage": _usage(parsed, outcome),
        **({"long_context": outcome.long_context} if outcome.long_context else {}),
    }


def _chunk(
    svc: Services,
    parsed: ParsedRequest,
    request_id: str,
    created: int,
    text: str | None,
    finish_reason: str | None,
    first: bool = False,
) -> dict[str, Any]:
    oid, _ = _ids(parsed, request_id)
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
    if parsed.kind == "chat":
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice["delta"] = delta
        obj = "chat.completion.chunk"
    else:
        choice["text"] = text or ""
        obj = "text_completion"
    out = {
        "id": oid,
        "object": obj,
        "created": created,
        "model": svc.model_name,
        "choices": [choice],
    }
    if parsed.include_usage:
        out["usage"] = None
    return out


async def _stream(
    request: web.Request,
    svc: Services,
    parsed: ParsedRequest,
    request_id: str,
    outcome: Outcome,
    source: AsyncIterator[GenerationDelta | Progress],
) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Request-Id": request_id,
        }
    )
    await resp.prepare(request)
    created = int(time.time())

    async def send(obj: dict[str, Any]) -> None:
        await resp.write(f"data: {json.dumps(obj)}\n\n".encode())

    if parsed.kind == "chat":
        await send(_chunk(svc, parsed, request_id, created, "", None, first=True))
    try:
        async for item in source:
            if isinstance(item, Progress):
                # An empty delta carrying the pass that starts: OpenAI clients skip it.
                progress = _chunk(svc, parsed, request_id, created, None, None)
                progress["long_context"] = item.to_dict()
                await send(progress)
            elif item.text:
                await send(_chunk(svc, parsed, request_id, created, item.text, None))
    except EngineDead as exc:
        # Headers are gone already: the failure travels as an error event in the stream.
        await send(error_body(exc))
        await resp.write(b"data: [DONE]\n\n")
        outcome.finish_reason = "error"
        return resp
    final = _chunk(svc, parsed, request_id, created, None, outcome.finish_reason or "stop")
    if parsed.kind == "completion":
        final["choices"][0]["text"] = ""
    await send(final)
    if parsed.include_usage:
        await send(
            {
                "id": final["id"],
                "object": final["object"],
                "created": created,
                "model": svc.model_name,
                "choices": [],
                "usage": _usage(parsed, outcome),
            }
        )
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp
