"""Checks the appliance makes itself: the body, and a document read in parts.

Everything else a request says is checked by vLLM's own request models and sampling
checks (adapters/vllm_frontend.py), as `vllm serve` checks it. A chat prompt over the
context that the client asked to read in parts never reaches vLLM's layer, so the fields
that path serves are checked here; every error names the field and the limit."""

from __future__ import annotations

import json
import math
from typing import Any

from appliance.domain.engine_types import SamplingSpec
from appliance.domain.lanes import LANE_NAMES, Lane
from appliance.domain.parsed_request import Limits, ParsedRequest
from appliance.errors import BadRequest, BodyTooLarge, ModelNotFound

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP = 4
MAX_DEADLINE_MS = 3_600_000


def decode_body(raw: bytes, limit_bytes: int) -> dict[str, Any]:
    """Bytes -> JSON object, or BadRequest/BodyTooLarge naming the problem."""
    if len(raw) > limit_bytes:
        raise BodyTooLarge(
            f"body: {len(raw)} bytes is over the limit of {limit_bytes} bytes", param="body"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"body: not valid UTF-8 (byte {exc.start})", param="body") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRequest(
            f"body: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
            param="body",
        ) from None
    if not isinstance(data, dict):
        raise BadRequest("body: must be a JSON object", param="body")
    return data


def _int(body: dict[str, Any], key: str, lo: int, hi: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{key}: must be an integer, got {type(value).__name__}", param=key)
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise BadRequest(f"{key}: must be {bound}, got {value}", param=key)
    return value


def _float(
    body: dict[str, Any], key: str, lo: float, hi: float, default: float, lo_open: bool = False
) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRequest(f"{key}: must be a number, got {json.dumps(value)[:40]}", param=key)
    if value > hi or value < lo or (lo_open and value == lo):
        left = "(" if lo_open else "["
        raise BadRequest(f"{key}: must be in {left}{lo:g}, {hi:g}], got {value:g}", param=key)
    return float(value)


def _bool(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"{key}: must be true or false", param=key)
    return value


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise BadRequest("stop: must be a non-empty string or a list of them", param="stop")
    if len(items) > MAX_STOP:
        raise BadRequest(f"stop: at most {MAX_STOP} sequences, got {len(items)}", param="stop")
    return tuple(items)


def check_model(body: dict[str, Any], limits: Limits) -> None:
    """The model field must name the served model (404 otherwise)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model: required, a string naming the model", param="model")
    if model != limits.model_name:
        raise ModelNotFound(
            f"model: '{model}' is not served here; available: ['{limits.model_name}']",
            param="model",
        )


def _message_text(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise BadRequest(
                    f"messages[{index}].content[{j}]: only text parts are supported",
                    param=f"messages[{index}].content",
                )
            parts.append(part["text"])
        return "".join(parts)
    raise BadRequest(
        f"messages[{index}].content: must be a string or a list of text parts",
        param=f"messages[{index}].content",
    )


def chat_messages(body: dict[str, Any]) -> list[dict[str, str]]:
    """Validated chat messages as role/content strings."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise BadRequest("messages: required, a list of {role, content}", param="messages")
    if not messages:
        raise BadRequest("messages: must not be empty (at least 1 message)", param="messages")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise BadRequest(f"messages[{i}]: must be an object", param=f"messages[{i}]")
        role = msg.get("role")
        if role not in ROLES:
            raise BadRequest(
                f"messages[{i}].role: must be one of {list(ROLES)}, got {role!r}",
                param=f"messages[{i}].role",
            )
        out.append(
            {
                "role": "system" if role == "developer" else role,
                "content": _message_text(msg.get("content"), i),
            }
        )
    return out




def common(
    body: dict[str, Any],
    kind: str,
    prompt_ids: list[int] | None,
    limits: Limits,
    lane_default: str = "interactive",
) -> ParsedRequest:
    """Sampling, streaming, lane and length checks shared by both endpoints.

    With prompt_ids None only the field checks run: cheap, before the tokenizer.
    """
    room_check = prompt_ids is not None
    prompt_ids = prompt_ids or []
    _int(body, "n", 1, 1)  # only n=1 is served
    max_key = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    max_tokens = _int(body, max_key, 1)
    room = limits.max_model_len - len(prompt_ids) if room_check else limits.max_model_len
    if room < 1:
        raise BadRequest(
            f"messages: the prompt is {len(prompt_ids)} tokens; the context limit is "
            f"{limits.max_model_len} tokens"
            if kind == "chat"
            else f"prompt: {len(prompt_ids)} tokens; the context limit is "
            f"{limits.max_model_len} tokens",
            param="messages" if kind == "chat" else "prompt",
            code="context_length_exceeded",
        )
    if max_tokens is None:
        max_tokens = min(limits.max_tokens_default, room)
    elif room_check and max_tokens > room:
        raise BadRequest(
            f"{max_key}: prompt ({len(prompt_ids)} tokens) + {max_key} ({max_tokens}) = "
            f"{len(prompt_ids) + max_tokens} exceeds the context limit of "
            f"{limits.max_model_len} tokens",
            param=max_key,
            code="context_length_exceeded",
        )
    sampling = SamplingSpec(
        max_tokens=max_tokens,
        temperature=_float(body, "temperature", 0.0, 2.0, 1.0),
        top_p=_float(body, "top_p", 0.0, 1.0, 1.0, lo_open=True),
        seed=_int(body, "seed", -(2**63), 2**63 - 1),
        stop=_stop(body),
        presence_penalty=_float(body, "presence_penalty", -2.0, 2.0, 0.0),
        frequency_penalty=_float(body, "frequency_penalty", -2.0, 2.0, 0.0),
    )
    stream = _bool(body, "stream")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise BadRequest("stream_options: must be an object", param="stream_options")
    include_usage = bool(opts and opts.get("include_usage"))
    priority = body.get("priority", lane_default)
    if priority not in LANE_NAMES:
        raise BadRequest(
            f"priority: must be one of {list(LANE_NAMES)}, got {priority!r}", param="priority"
        )
    return ParsedRequest(
        kind=kind,
        prompt_token_ids=tuple(prompt_ids),
        sampling=sampling,
        stream=stream,
        include_usage=include_usage,
        lane=Lane.parse(priority),
        deadline_ms=_int(body, "deadline_ms", 1, MAX_DEADLINE_MS),
    )
