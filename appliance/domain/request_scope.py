"""What one HTTP request carries down to the engine, and what the engine reports back.

vLLM's serving classes call the engine client with vLLM's own arguments only. The
appliance's part of a request (its lane, its deadline, the accounting for metrics and the
controller) travels beside them in a context variable: set by the HTTP handler around the
call, read by the engine client wrapper in every `generate` the serving class makes
(tasks copy the context, so `n` > 1 and batched prompts see it too).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

# The finish reason of an answer cut at its deadline (an appliance extension).
DEADLINE_FINISH_REASON = "deadline"


@dataclass
class Outcome:
    """What one request produced, for the response, the metrics and the controller."""

    text: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    admitted_s: float | None = None
    # Set when the engine failed under the request (the stream's error event names it).
    error: Exception | None = None
    # Chunked long documents: the passes before the last, counted into usage.
    extra_prompt_tokens: int = 0
    extra_completion_tokens: int = 0
    long_context: dict[str, object] | None = None
    # The answer's text per engine request and choice, in arrival order (the audit log's
    # hash of the answer); the chunked path's answer is in `text`.
    choice_text: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    # Called once with the first token's time: admission takes the prompt out of its
    # prefill backlog there (the controller's prefill budget).
    on_first_token: Callable[[float], None] | None = field(default=None, repr=False, compare=False)

    def add_text(self, engine_request_id: str, index: int, text: str) -> None:
        """Append a piece of one choice's answer."""
        if text:
            self.choice_text.setdefault((engine_request_id, index), []).append(text)

    def answer_text(self) -> str:
        """The whole answer: each choice's text, choices apart by a blank line."""
        if self.choice_text:
            return "\n\n".join("".join(parts) for parts in self.choice_text.values())
        return "".join(self.text)

    def tokens_out(self, count: int, now_s: float) -> None:
        """count new tokens arrived at now_s."""
        if count <= 0:
            return
        if self.first_token_s is None:
            self.first_token_s = now_s
            if self.on_first_token is not None:
                self.on_first_token(now_s)
        self.last_token_s = now_s
        self.completion_tokens += count


@dataclass
class RequestScope:
    """The appliance's side of one request, seen by the engine client wrapper."""

    priority: int  # the lane; lower runs first, as vLLM's priority scheduler expects
    deadline_s: float | None  # time.monotonic() at which the answer so far is returned
    outcome: Outcome


CURRENT_SCOPE: ContextVar[RequestScope | None] = ContextVar("appliance_request", default=None)


@dataclass(frozen=True)
class JsonReply:
    """A whole answer from the serving layer: status and JSON body."""

    status: int
    body: Any


@dataclass(frozen=True)
class StreamReply:
    """A server-sent-event stream from the serving layer: ready `data: ...` frames."""

    frames: AsyncIterator[str]
