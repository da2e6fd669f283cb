"""OpenAI-compatible endpoints: /v1/models, /v1/chat/completions, /v1/completions."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from appliance.api.errors import error_body
from appliance.api.keys import SERVICES, Services
from appliance.api.validation import (
    Limits,
    ParsedRequest,
    chat_messages,
    check_model,
    common,
    completion_prompt_ids,
    decode_body,
)
from appliance.domain.engine_types import GenerationDelta, GenerationRequest
from appliance.errors import ApplianceError, EngineDead, Unauthorized
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
    common(body, "chat", None, limits)  # cheap field checks before the tokenizer runs
    prompt = svc.tokenizer.chat_prompt(messages)
    parsed = common(body, "chat", await _encode(svc, prompt), limits)
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


@dataclass
class _Outcome:
    """What one generation produced, for the response and the metrics."""

    text: list[str] = field(default_factory=list)
    completion_tokens: int = 0
    finish_reason: str | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    admitted_s: float | None = None


async def _generate(
    svc: Services, parsed: ParsedRequest, request_id: str, outcome: _Outcome, arrived_s: float
) -> AsyncIterator[GenerationDelta]:
    """Run the request in the engine, cut at its deadline; fills outcome as it goes."""
    engine = svc.supervisor.engine
    gen_req = GenerationRequest(
        request_id, parsed.prompt_token_ids, parsed.sampling, priority=int(parsed.lane)
    )
    stream = engine.generate(gen_req)
    deadline_s = arrived_s + parsed.deadline_ms / 1000 if parsed.deadline_ms else None
    try:
        while True:
            try:
                if deadline_s is None:
                    delta = await anext(stream)
                else:
                    remaining = deadline_s - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError
                    delta = await asyncio.wait_for(anext(stream), timeout=remaining)
            except StopAsyncIteration:
                break
            except TimeoutError:
                outcome.finish_reason = "deadline"
                break
            now = time.monotonic()
            if delta.new_tokens:
                if outcome.first_token_s is None:
                    outcome.first_token_s = now
                outcome.last_token_s = now
                outcome.completion_tokens += delta.new_tokens
            if delta.text:
                outcome.text.append(delta.text)
            if delta.finish_reason:
                outcome.finish_reason = delta.finish_reason
            yield delta
    finally:
        await stream.aclose()  # aborts the engine request when we stopped early


def _record(
    svc: Services, parsed: ParsedRequest, outcome: _Outcome, arrived_s: float, status: str
) -> None:
    m = svc.metrics
    m.requests_total.labels(status).inc()
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
        if status == "ok" and outcome.admitted_s is not None:
            # The controller judges the engine, so its TTFT starts at admission: queue wait
            # grows when the limit shrinks, and counting it would cut the limit to the floor.
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


async def _serve(request: web.Request, svc: Services, parsed: ParsedRequest) -> web.StreamResponse:
    """Admission, generation, and the response: JSON or an SSE stream."""
    arrived_s = request.get(ARRIVED_S, time.monotonic())
    request_id = request_id_var.get() or uuid.uuid4().hex
    svc.supervisor.check_admitting()
    deadline_abs = arrived_s + parsed.deadline_ms / 1000 if parsed.deadline_ms else None
    outcome = _Outcome()
    status = "error"
    try:
        async with svc.admission.slot(parsed.lane, deadline_abs):
            outcome.admitted_s = time.monotonic()
            svc.metrics.queue_wait_seconds.labels(parsed.lane.label).observe(
                outcome.admitted_s - arrived_s
            )
            if parsed.stream:
                resp = await _stream(request, svc, parsed, request_id, outcome, arrived_s)
            else:
                async for _ in _generate(svc, parsed, request_id, outcome, arrived_s):
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


def _usage(parsed: ParsedRequest, outcome: _Outcome) -> dict[str, int]:
    prompt = len(parsed.prompt_token_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": outcome.completion_tokens,
        "total_tokens": prompt + outcome.completion_tokens,
    }


def _final_body(
    svc: Services, parsed: ParsedRequest, request_id: str, outcome: _Outcome
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
    outcome: _Outcome,
    arrived_s: float,
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
        async for delta in _generate(svc, parsed, request_id, outcome, arrived_s):
            if delta.text:
                await send(_chunk(svc, parsed, request_id, created, delta.text, None))
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
