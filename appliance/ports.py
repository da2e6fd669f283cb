"""Ports owned by the consumers: the engine and its tokenizer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

from appliance.domain.engine_types import (
    EngineInfo,
    EngineStats,
    GenerationDelta,
    GenerationRequest,
)


class Tokenizer(Protocol):
    """Counts tokens before the engine sees a request, and renders chat prompts."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str: ...

    @property
    def vocab_size(self) -> int: ...


class Engine(Protocol):
    """One running inference engine; a new instance per (re)start."""

    async def start(self) -> EngineInfo: ...

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
