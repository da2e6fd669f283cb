"""A request the appliance serves itself (a document read in parts), once validated."""

from __future__ import annotations

from dataclasses import dataclass

from appliance.domain.engine_types import SamplingSpec
from appliance.domain.lanes import Lane


@dataclass(frozen=True)
class Limits:
    """What the served model and the config allow."""

    model_name: str
    max_model_len: int
    max_tokens_default: int
    max_body_bytes: int
    vocab_size: int


@dataclass(frozen=True)
class ParsedRequest:
    """A validated request, ready for admission."""

    kind: str  # "chat" or "completion"
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingSpec
    stream: bool
    include_usage: bool
    lane: Lane
    deadline_ms: int | None
