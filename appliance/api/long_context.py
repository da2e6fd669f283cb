"""Chat prompts longer than the context, read in parts inside one admission slot.

The parts run one after another on the slot the request was admitted to, so a long
document never takes more of the engine than any other request; the request's deadline
covers all passes together. Only the last pass streams to the client; the passes before
it show as progress (a chunk with an empty delta and a `long_context` field in the stream,
and an entry in `/admin/status`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from appliance.api.generation import generate
from appliance.api.keys import Services
from appliance.api.validation import Limits, ParsedRequest
from appliance.config import LongContextConfig
from appliance.domain import chunking
from appliance.domain.chunking import Stage, Strategy, Window
from appliance.domain.engine_types import GenerationDelta
from appliance.domain.request_scope import DEADLINE_FINISH_REASON, Outcome
from appliance.errors import BadRequest, BodyTooLarge

_MODES = ("chunk", "error")
# Tokens kept free in every pass for the chat template and the instructions around a part.
_PROMPT_SLACK_TOKENS = 160


@dataclass(frozen=True)
class Progress:
    """A pass is starting: what the stream and the status page show."""

    stage: Stage
    part: int  # 1-based; for reduce, the number of parts combined
    parts: int
    strategy: Strategy

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage.value,
            "part": self.part,
            "parts": self.parts,
            "strategy": self.strategy.value,
        }


class LongContextTracker:
    """Chunked requests in progress, for /admin/status."""

    def __init__(self) -> None:
        self._active: dict[str, dict[str, Any]] = {}
        self.completed_total = 0

    def update(self, request_id: str, progress: Progress) -> None:
        entry = self._active.setdefault(request_id, {"started_s": time.time()})
        entry.update(progress.to_dict())

    def finish(self, request_id: str) -> None:
        if self._active.pop(request_id, None) is not None:
            self.completed_total += 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "active": [{"request_id": rid, **e} for rid, e in self._active.items()],
            "completed_total": self.completed_total,
        }


LONG_CONTEXT = web.AppKey("long_context", LongContextTracker)


@dataclass(frozen=True)
class LongRequest:
    """How a chat request's long message is cut and what carries into every pass."""

    strategy: Strategy
    messages: tuple[dict[str, str], ...]
    doc_index: int
    doc_ids: tuple[int, ...]
    opening: str
    windows: tuple[Window, ...]
    intermediate_max_tokens: int
    prompt_tokens: int
    other_tokens: int  # the messages that are not cut, in every pass


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


async def plan(
    svc: Services,
    body: dict[str, Any],
    messages: Sequence[dict[str, str]],
    prompt_tokens: int,
    final_max_tokens: int,
    limits: Limits,
) -> LongRequest:
    """Cut the longest message into windows that fit the context with room to answer."""
    cfg = svc.config.long_context
    strategy = strategy_of(body, cfg)
    tok = svc.tokenizer
    contents = [m["content"] for m in messages]
    ids_per_message = await asyncio.to_thread(lambda: [tok.encode(c) for c in contents])
    doc_index = chunking.longest_message([len(ids) for ids in ids_per_message])
    doc_ids = ids_per_message[doc_index]
    others = sum(len(ids) for i, ids in enumerate(ids_per_message) if i != doc_index)
    head = min(cfg.carry_head_tokens, len(doc_ids))
    answer_room = max(cfg.intermediate_max_tokens, final_max_tokens)
    # A pass holds: the other messages, the opening, a part, an answer so far (refine) or
    # every part's answer (reduce, checked when it is built), and room to generate.
    room = limits.max_model_len - others - head - 2 * answer_room - _PROMPT_SLACK_TOKENS
    chunk = min(cfg.chunk_tokens, room)
    if chunk < 2 * max(1, cfg.overlap_tokens) or chunk < 64:
        raise BadRequest(
            f"long_context: no room for a part: the context is {limits.max_model_len} tokens, "
            f"the other messages take {others}, the answers up to {answer_room} each "
            "(max_tokens, long_context.intermediate_max_tokens); shorten them",
            param="long_context",
        )
    wins = chunking.windows(len(doc_ids), chunk, cfg.overlap_tokens)
    opening = tok.decode(doc_ids[:head]) if head else ""
    return LongRequest(
        strategy=strategy,
        messages=tuple(dict(m) for m in messages),
        doc_index=doc_index,
        doc_ids=tuple(doc_ids),
        opening=opening,
        windows=tuple(wins),
        intermediate_max_tokens=min(cfg.intermediate_max_tokens, final_max_tokens),
        prompt_tokens=prompt_tokens,
        other_tokens=others,
    )


def _fit(tok: Any, text: str, max_tokens: int) -> str:
    """text cut to at most max_tokens tokens (its start: an answer leads with its point)."""
    ids = tok.encode(text)
    return text if len(ids) <= max_tokens else tok.decode(ids[:max_tokens])


async def run_chunked(
    svc: Services,
    tracker: LongContextTracker,
    parsed: ParsedRequest,
    long: LongRequest,
    request_id: str,
    outcome: Outcome,
    arrived_s: float,
    limits: Limits,
) -> AsyncIterator[GenerationDelta | Progress]:
    """Every pass in order; yields progress, then the last pass's deltas.

    On the deadline inside an early pass, the answer so far comes back as the answer with
    finish_reason "deadline"; an engine failure ends the request as for any other.
    """
    tok = svc.tokenizer
    n = len(long.windows)
    inter_sampling = dataclasses.replace(parsed.sampling, max_tokens=long.intermediate_max_tokens)
    inter = dataclasses.replace(parsed, sampling=inter_sampling)

    async def prompt_for(content: str, max_tokens: int) -> tuple[int, ...]:
        msgs = [dict(m) for m in long.messages]
        msgs[long.doc_index]["content"] = content
        ids = await asyncio.to_thread(lambda: tok.encode(tok.chat_prompt(msgs)))
        if len(ids) + max_tokens > limits.max_model_len:
            raise BadRequest(
                f"long_context: a pass needs {len(ids)} + {max_tokens} tokens, over the "
                f"context of {limits.max_model_len}; lower long_context.chunk_tokens",
                param="long_context",
            )
        return tuple(ids)

    def part(i: int) -> str:
        w = long.windows[i]
        return tok.decode(long.doc_ids[w.start : w.end])

    async def step(progress: Progress, content: str) -> tuple[str, str | None]:
        """One intermediate pass: its text and finish reason (usage counted)."""
        tracker.update(request_id, progress)
        ids = await prompt_for(content, inter.sampling.max_tokens)
        sub = Outcome()
        req = dataclasses.replace(inter, prompt_token_ids=ids)
        sub_id = f"{request_id}-{progress.stage.value}{progress.part}"
        async for _ in generate(svc, req, sub_id, sub, arrived_s):
            pass
        outcome.extra_prompt_tokens += len(ids)
        outcome.extra_completion_tokens += sub.completion_tokens
        return "".join(sub.text).strip(), sub.finish_reason

    def summary(passes: int) -> dict[str, Any]:
        return {"strategy": long.strategy.value, "parts": n, "passes": passes}

    def stop_early(answer: str, passes: int) -> GenerationDelta:
        # The deadline came during an early pass: what is known so far is the answer.
        outcome.long_context = summary(passes)
        outcome.finish_reason = DEADLINE_FINISH_REASON
        outcome.text.append(answer)
        if outcome.first_token_s is None:
            outcome.first_token_s = outcome.last_token_s = time.monotonic()
        return GenerationDelta(text=answer, new_tokens=0, finish_reason=DEADLINE_FINISH_REASON)

    try:
        if long.strategy is Strategy.REFINE:
            answer = ""
            for i in range(n - 1):
                progress = Progress(Stage.REFINE, i + 1, n, long.strategy)
                yield progress
                content = (
                    chunking.refine_first(long.opening, part(i), n)
                    if i == 0
                    else chunking.refine_next(long.opening, answer, part(i), i + 1, n)
                )
                text, finish = await step(progress, content)
                if finish == DEADLINE_FINISH_REASON:
                    yield stop_early(answer or text, i + 1)
                    return
                answer = _fit(tok, text, long.intermediate_max_tokens)
            last = Progress(Stage.REFINE, n, n, long.strategy)
            final_content = (
                chunking.refine_first(long.opening, part(0), n)
                if n == 1
                else chunking.refine_next(long.opening, answer, part(n - 1), n, n)
            )
        else:
            answers: list[str] = []
            for i in range(n):
                progress = Progress(Stage.MAP, i + 1, n, long.strategy)
                yield progress
                content = chunking.map_part(long.opening, part(i), i + 1, n)
                text, finish = await step(progress, content)
                if finish == DEADLINE_FINISH_REASON:
                    answers.append(text)
                    yield stop_early("\n".join(a for a in answers if a), i + 1)
                    return
                answers.append(text)
            last = Progress(Stage.REDUCE, n, n, long.strategy)
            # Many parts' answers together may not fit one pass: each gets an equal share.
            budget = (
                limits.max_model_len
                - parsed.sampling.max_tokens
                - len(tok.encode(long.opening))
                - _PROMPT_SLACK_TOKENS
                - long.other_tokens
            )
            share = max(8, budget // max(1, n) - 4)
            final_content = chunking.reduce_answers(
                long.opening, [_fit(tok, a, share) for a in answers]
            )
        yield last
        tracker.update(request_id, last)
        ids = await prompt_for(final_content, parsed.sampling.max_tokens)
        final = dataclasses.replace(parsed, prompt_token_ids=ids)
        outcome.extra_prompt_tokens += len(ids)
        outcome.long_context = summary(n + (1 if long.strategy is Strategy.MAP_REDUCE else 0))
        async for delta in generate(svc, final, request_id, outcome, arrived_s):
            yield delta
    finally:
        tracker.finish(request_id)
