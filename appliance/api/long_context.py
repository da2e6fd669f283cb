"""Chat requests over the context, read in parts: the one answer vLLM's layer cannot give.

A document longer than the context is not a request vLLM serves; the appliance reads it in
parts (services/long_context.py) inside one admission slot. This module is that request's
HTTP side: it checks the fields the client asked with (`long_context` and its strategy,
400/413 naming the field) and writes the OpenAI answer itself, JSON or stream, with the
`long_context` summary and progress events.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from appliance.api.errors import error_body
from appliance.config import LongContextConfig
from appliance.domain.chunking import Strategy
from appliance.domain.engine_types import GenerationDelta
from appliance.domain.parsed_request import ParsedRequest
from appliance.domain.request_scope import Outcome
from appliance.errors import BadRequest, BodyTooLarge, EngineDead
from appliance.services.container import Services
from appliance.services.long_context import Progress

_MODES = ("chunk", "error")


def wants_chunking(body: dict[str, Any], cfg: LongContextConfig) -> bool:
    """The request's `long_context` ("chunk" | "error"), else the configured mode."""
    value = body.get("long_context")
    if value is None:
        return cfg.mode == "chunk"
    if value not in _MODES:
        raise BadRequest(
            f"long_context: must be one of {list(_MODES)}, got {value!r}", param="long_context"
        )
    return bool(value == "chunk")


def strategy_of(body: dict[str, Any], cfg: LongContextConfig) -> Strategy:
    """The request's `long_context_strategy`, else the configured one."""
    value = body.get("long_context_strategy", cfg.strategy)
    try:
        return Strategy(value)
    except ValueError:
        raise BadRequest(
            "long_context_strategy: must be one of "
            f"{[s.value for s in Strategy]}, got {value!r}",
            param="long_context_strategy",
        ) from None


def check_cap(prompt_tokens: int, cfg: LongContextConfig, *, param: str) -> None:
    """413 over the hard cap, chunked or not."""
    if prompt_tokens > cfg.max_prompt_tokens:
        raise BodyTooLarge(
            f"{param}: the prompt is {prompt_tokens} tokens, over "
            f"long_context.max_prompt_tokens={cfg.max_prompt_tokens}",
            param=param,
            code="prompt_too_long",
        )


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


def final_body(
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


async def stream_reply(
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


async def json_reply(
    svc: Services,
    parsed: ParsedRequest,
    request_id: str,
    outcome: Outcome,
    source: AsyncIterator[GenerationDelta | Progress],
) -> web.Response:
    """The chunked document's answer as one JSON body, once every pass is done."""
    async for _ in source:
        pass
    return web.json_response(final_body(svc, parsed, request_id, outcome))
