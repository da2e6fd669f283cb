"""Ports owned by the consumers: the engine and its tokenizer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

from appliance.domain.engine_types import (
    EngineInfo,
    EngineStats,
    GenerationDelta,
    GenerationRequest,
)
from appliance.domain.request_scope import JsonReply, StreamReply


class Tokenizer(Protocol):
    """Counts tokens before the engine sees a request, and renders chat prompts."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str: ...

    @property
    def vocab_size(self) -> int: ...


class OpenAIFrontend(Protocol):
    """vLLM's OpenAI serving layer over one engine (adapters/vllm_frontend.py)."""

    async def serve(self, endpoint: str, request: Any) -> JsonReply | StreamReply: ...

    async def models(self) -> dict[str, Any]: ...


class Engine(Protocol):
    """One running inference engine; a new instance per (re)start."""

    async def start(self) -> EngineInfo: ...

    @property
    def frontend(self) -> OpenAIFrontend:
        """The serving layer over this engine, once started."""

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]: ...

    async def abort(self, request_id: str) -> None: ...

    async def check_health(self) -> None:
        """Raise EngineDead when the engine cannot serve any more."""

    @property
    def is_dead(self) -> bool: ...

    def stats(self) -> EngineStats: ...

    def num_unfinished(self) -> int: ...

    def counters(self) -> dict[str, int]:
        """Engine-side running totals (prompt and generated tokens it processed)."""

    def child_pids(self) -> list[int]: ...

    async def shutdown(self) -> None: ...


EngineFactory = Callable[[], Engine]
