"""Test doubles for the engine port: fast, and able to fail on demand."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from appliance.domain.engine_types import (
    EngineInfo,
    EngineStats,
    GenerationDelta,
    GenerationRequest,
)
from appliance.errors import EngineDead, EngineStartError


class WordTokenizer:
    """One token per whitespace-separated word; the chat prompt is role: content lines."""

    vocab_size = 50_000

    def __init__(self) -> None:
        # Ids in order of first sight: no two words share one, so decode(encode(t)) == t
        # (up to whitespace) for the first vocab_size distinct words.
        self._ids: dict[str, int] = {}
        self._words: dict[int, str] = {}

    def encode(self, text: str) -> list[int]:
        ids = []
        for w in text.split():
            i = self._ids.get(w)
            if i is None:
                i = self._ids[w] = len(self._ids) % self.vocab_size
                self._words.setdefault(i, w)
            ids.append(i)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(self._words.get(i, f"<{i}>") for i in ids)

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        return "\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant:"


class FakeEngine:
    """Emits 'tok0 tok1 ...' with a delay per token; records what it was asked."""

    def __init__(
        self,
        token_delay_s: float = 0.01,
        start_delay_s: float = 0.0,
        fail_start: bool = False,
        max_model_len: int = 256,
    ) -> None:
        self.token_delay_s = token_delay_s
        self.start_delay_s = start_delay_s
        self.fail_start = fail_start
        self.max_model_len = max_model_len
        self.seen: list[GenerationRequest] = []
        self.aborted: list[str] = []
        self.running: set[str] = set()
        self.dead = False
        self.shut_down = False

    async def start(self) -> EngineInfo:
        await asyncio.sleep(self.start_delay_s)
        if self.fail_start:
            raise EngineStartError("fake engine refused to start")
        return EngineInfo(
            model_dir="/fake",
            max_model_len=self.max_model_len,
            kv_cache_tokens=4096,
            block_size=16,
            num_blocks=256,
        )

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        self.seen.append(request)
        self.running.add(request.request_id)
        finished = False
        try:
            n = request.sampling.max_tokens
            for i in range(n):
                await asyncio.sleep(self.token_delay_s)
                if self.dead:
                    raise EngineDead("fake engine died")
                last = i == n - 1
                yield GenerationDelta(
                    text=f"tok{i} ", new_tokens=1, finish_reason="length" if last else None
                )
            finished = True
        finally:
            self.running.discard(request.request_id)
            if not finished:
                self.aborted.append(request.request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def check_health(self) -> None:
        if self.dead:
            raise EngineDead("fake engine is dead")

    @property
    def is_dead(self) -> bool:
        return self.dead

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self.running))

    def num_unfinished(self) -> int:
        return len(self.running)

    def counters(self) -> dict[str, int]:
        return {"requests_total": len(self.seen)}

    def child_pids(self) -> list[int]:
        return []

    async def shutdown(self) -> None:
        self.shut_down = True
