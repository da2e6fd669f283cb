"""Frozen values that cross the engine port: requests, output deltas, stats."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingSpec:
    """The sampling knobs the API accepts, already validated."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


@dataclass(frozen=True)
class GenerationRequest:
    """One request for the engine: token ids in, sampling spec, lane priority."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingSpec
    priority: int = 0  # lower runs first, as vLLM's priority scheduler expects


@dataclass(frozen=True)
class GenerationDelta:
    """New output since the last delta; finish_reason is set on the last one."""

    text: str
    new_tokens: int
    finish_reason: str | None = None


@dataclass(frozen=True)
class EngineInfo:
    """What the engine learned about itself at start (memory profile, limits)."""

    model_dir: str
    max_model_len: int
    kv_cache_tokens: int | None = None
    block_size: int | None = None
    num_blocks: int | None = None
    kv_cache_space_gib: float | None = None
    device: str = "cpu"
    version: str = ""


@dataclass(frozen=True)
class EngineStats:
    """The scheduler's view at its last step (from vLLM's stat logger)."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage_ratio: float = 0.0
    updated_at_s: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)
