"""The request fields of a document read in parts: `long_context` and its strategy.

The reading itself is services/long_context.py; this module only checks what the client
asked for and answers 400/413 naming the field."""

from __future__ import annotations

from typing import Any

from appliance.config import LongContextConfig
from appliance.domain.chunking import Strategy
from appliance.errors import BadRequest, BodyTooLarge

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
