"""Ports owned by the consumers: the engine, its tokenizer, the scheduler, GPU faults."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

from appliance.domain.engine_types import (
    EngineInfo,
    EngineStats,
    GenerationDelta,
    GenerationRequest,
)
from appliance.domain.request_scope import JsonReply, StreamReply
from appliance.domain.step_latency import StepLatency


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

    def step_latency(
        self,
        since_s: float,
        *,
        min_steps: int = 0,
        floor_s: float = -math.inf,
        request_floor_s: float | None = None,
    ) -> StepLatency:
        """The engine's steps since since_s (monotonic clock): live TPOT and TTFT; back to
        the last min_steps decode steps where fewer are since it, never before floor_s; a
        request's TPOT back over a request's decode, never before request_floor_s (floor_s
        where None)."""

    def num_unfinished(self) -> int: ...

    def counters(self) -> dict[str, int]:
        """Engine-side running totals since this engine started: prompt and generated tokens
        it processed, prompt tokens looked up in and found in its prefix cache."""

    def child_pids(self) -> list[int]: ...

    async def shutdown(self) -> None: ...


EngineFactory = Callable[[], Engine]


class Maintenance(Protocol):
    """Maintenance as the admin API and the lifecycle see it (maintenance/jobs.py)."""

    @property
    def names(self) -> list[str]: ...

    def is_running(self, name: str) -> bool: ...

    def jobs_info(self) -> list[dict[str, Any]]: ...

    def spawn(self, name: str, trigger: str = "manual") -> asyncio.Task[str]: ...

    def start(self) -> None: ...

    def shutdown(self) -> None: ...

    def restore(self) -> None:
        """Put back in force what earlier runs decided (thresholds, ceiling)."""

    def rollback_thresholds(self) -> dict[str, Any] | None:
        """Re-activate the threshold set before the active one; None when there is none."""


class FaultInjector(Protocol):
    """Simulated-GPU faults, for drills and tests (adapters/simgpu.py)."""

    def set_fault(
        self,
        name: str,
        gpu: int | None = None,
        *,
        delta_c: float = 10.0,
        factor: float = 2.0,
        duration_s: float | None = None,
    ) -> None: ...

    def clear_faults(self, name: str | None = None, gpu: int | None = None) -> int: ...

    def active_faults(self) -> list[dict[str, Any]]: ...
