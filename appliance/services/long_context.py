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

from appliance.config import LongContextConfig
from appliance.domain import chunking
from appliance.domain.chunking import Stage, Strategy, Window
from appliance.domain.engine_types import GenerationDelta
from appliance.domain.parsed_request import Limits, ParsedRequest
from appliance.domain.request_scope import DEADLINE_FINISH_REASON, Outcome
from appliance.errors import BadRequest
from appliance.ports import Tokenizer
from appliance.services.generation import generate
from appliance.services.supervisor import EngineSupervisor

# Tokens kept free in every pass for the chat template and the instructions around a part.
PROMPT_SLACK_TOKENS = 160


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


@dataclass(frozen=True)
class ChunkedCall:
    """One chunked request: what was asked, how it is cut, and where its results go."""

    parsed: ParsedRequest
    long: LongRequest
    request_id: str
    outcome: Outcome
    arrived_s: float
    limits: Limits


def _fit(tok: Tokenizer, text: str, max_tokens: int) -> str:
    """text cut to at most max_tokens tokens (its start: an answer leads with its point)."""
    ids = tok.encode(text)
    return text if len(ids) <= max_tokens else tok.decode(ids[:max_tokens])


class LongContextRunner:
    """Plans and runs documents read in parts, on the engine the supervisor holds."""

    def __init__(
        self, cfg: LongContextConfig, tokenizer: Tokenizer, supervisor: EngineSupervisor
    ) -> None:
        self.cfg = cfg
        self._tok = tokenizer
        self._supervisor = supervisor
        self.tracker = LongContextTracker()

    async def plan(
        self,
        strategy: Strategy,
        messages: Sequence[dict[str, str]],
        prompt_tokens: int,
        final_max_tokens: int,
        limits: Limits,
    ) -> LongRequest:
        """Cut the longest message into windows that fit the context with room to answer."""
        cfg, tok = self.cfg, self._tok
        contents = [m["content"] for m in messages]
        ids_per_message = await asyncio.to_thread(lambda: [tok.encode(c) for c in contents])
        doc_index = chunking.longest_message([len(ids) for ids in ids_per_message])
        doc_ids = ids_per_message[doc_index]
        others = sum(len(ids) for i, ids in enumerate(ids_per_message) if i != doc_index)
        head = min(cfg.carry_head_tokens, len(doc_ids))
        answer_room = max(cfg.intermediate_max_tokens, final_max_tokens)
        # A pass holds: the other messages, the opening, a part, an answer so far (refine) or
        # every part's answer (reduce, checked when it is built), and room to generate.
        room = limits.max_model_len - others - head - 2 * answer_room - PROMPT_SLACK_TOKENS
        chunk = min(cfg.chunk_tokens, room)
        if chunk < 2 * max(1, cfg.overlap_tokens) or chunk < 64:
            raise BadRequest(
                f"long_context: no room for a part: the context is {limits.max_model_len} "
                f"tokens, the other messages take {others}, the answers up to {answer_room} "
                "each (max_tokens, long_context.intermediate_max_tokens); shorten them",
                param="long_context",
            )
        return LongRequest(
            strategy=strategy,
            messages=tuple(dict(m) for m in messages),
            doc_index=doc_index,
            doc_ids=tuple(doc_ids),
            opening=tok.decode(doc_ids[:head]) if head else "",
            windows=tuple(chunking.windows(len(doc_ids), chunk, cfg.overlap_tokens)),
            intermediate_max_tokens=min(cfg.intermediate_max_tokens, final_max_tokens),
            prompt_tokens=prompt_tokens,
            other_tokens=others,
        )

    def run(self, call: ChunkedCall) -> AsyncIterator[GenerationDelta | Progress]:
        """Every pass in order; yields progress, then the last pass's deltas.

        On the deadline inside an early pass, the answer so far comes back as the answer
        with finish_reason "deadline"; an engine failure ends the request as for any other.
        """
        return _ChunkedRun(self._tok, self._supervisor, self.tracker, call).passes()


class _ChunkedRun:
    """The passes of one chunked request: the early ones, then the one that answers."""

    def __init__(
        self,
        tok: Tokenizer,
        supervisor: EngineSupervisor,
        tracker: LongContextTracker,
        call: ChunkedCall,
    ) -> None:
        self._tok = tok
        self._supervisor = supervisor
        self._tracker = tracker
        self._call = call
        long = call.long
        self._n = len(long.windows)
        inter_sampling = dataclasses.replace(
            call.parsed.sampling, max_tokens=long.intermediate_max_tokens
        )
        self._inter = dataclasses.replace(call.parsed, sampling=inter_sampling)
        # Set by the early passes: the last pass's content, or that the deadline stopped them.
        self._final_content = ""
        self._stopped = False

    async def passes(self) -> AsyncIterator[GenerationDelta | Progress]:
        call = self._call
        refine = call.long.strategy is Strategy.REFINE
        try:
            async for item in self._refine() if refine else self._map():
                yield item
            if self._stopped:
                return
            last = Progress(Stage.REFINE if refine else Stage.REDUCE, self._n, self._n,
                            call.long.strategy)
            yield last
            self._tracker.update(call.request_id, last)
            async for delta in self._final_pass(refine):
                yield delta
        finally:
            self._tracker.finish(call.request_id)

    async def _refine(self) -> AsyncIterator[GenerationDelta | Progress]:
        long, n = self._call.long, self._n
        answer = ""
        for i in range(n - 1):
            progress = Progress(Stage.REFINE, i + 1, n, long.strategy)
            yield progress
            content = (
                chunking.refine_first(long.opening, self._part(i), n)
                if i == 0
                else chunking.refine_next(long.opening, answer, self._part(i), i + 1, n)
            )
            text, finish = await self._step(progress, content)
            if finish == DEADLINE_FINISH_REASON:
                yield self._stop_early(answer or text, i + 1)
                return
            answer = _fit(self._tok, text, long.intermediate_max_tokens)
        self._final_content = (
            chunking.refine_first(long.opening, self._part(0), n)
            if n == 1
            else chunking.refine_next(long.opening, answer, self._part(n - 1), n, n)
        )

    async def _map(self) -> AsyncIterator[GenerationDelta | Progress]:
        long, n = self._call.long, self._n
        answers: list[str] = []
        for i in range(n):
            progress = Progress(Stage.MAP, i + 1, n, long.strategy)
            yield progress
            content = chunking.map_part(long.opening, self._part(i), i + 1, n)
            text, finish = await self._step(progress, content)
            answers.append(text)
            if finish == DEADLINE_FINISH_REASON:
                yield self._stop_early("\n".join(a for a in answers if a), i + 1)
                return
        self._final_content = chunking.reduce_answers(
            long.opening, [_fit(self._tok, a, self._reduce_share()) for a in answers]
        )

    def _reduce_share(self) -> int:
        """Many parts' answers together may not fit one pass: each gets an equal share."""
        call = self._call
        budget = (
            call.limits.max_model_len
            - call.parsed.sampling.max_tokens
            - len(self._tok.encode(call.long.opening))
            - PROMPT_SLACK_TOKENS
            - call.long.other_tokens
        )
        return max(8, budget // max(1, self._n) - 4)

    async def _final_pass(self, refine: bool) -> AsyncIterator[GenerationDelta]:
        call = self._call
        ids = await self._prompt_for(self._final_content, call.parsed.sampling.max_tokens)
        final = dataclasses.replace(call.parsed, prompt_token_ids=ids)
        call.outcome.extra_prompt_tokens += len(ids)
        call.outcome.long_context = self._summary(self._n + (0 if refine else 1))
        async for delta in generate(
            self._supervisor.engine, final, call.request_id, call.outcome, call.arrived_s
        ):
            yield delta

    def _part(self, i: int) -> str:
        w = self._call.long.windows[i]
        return self._tok.decode(self._call.long.doc_ids[w.start : w.end])

    async def _prompt_for(self, content: str, max_tokens: int) -> tuple[int, ...]:
        long, limits, tok = self._call.long, self._call.limits, self._tok
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

    async def _step(self, progress: Progress, content: str) -> tuple[str, str | None]:
        """One intermediate pass: its text and finish reason (usage counted)."""
        call = self._call
        self._tracker.update(call.request_id, progress)
        ids = await self._prompt_for(content, self._inter.sampling.max_tokens)
        sub = Outcome()
        req = dataclasses.replace(self._inter, prompt_token_ids=ids)
        sub_id = f"{call.request_id}-{progress.stage.value}{progress.part}"
        async for _ in generate(self._supervisor.engine, req, sub_id, sub, call.arrived_s):
            pass
        call.outcome.extra_prompt_tokens += len(ids)
        call.outcome.extra_completion_tokens += sub.completion_tokens
        return "".join(sub.text).strip(), sub.finish_reason

    def _summary(self, passes: int) -> dict[str, Any]:
        return {"strategy": self._call.long.strategy.value, "parts": self._n, "passes": passes}

    def _stop_early(self, answer: str, passes: int) -> GenerationDelta:
        # The deadline came during an early pass: what is known so far is the answer.
        self._stopped = True
        outcome = self._call.outcome
        outcome.long_context = self._summary(passes)
        outcome.finish_reason = DEADLINE_FINISH_REASON
        outcome.text.append(answer)
        if outcome.first_token_s is None:
            outcome.first_token_s = outcome.last_token_s = time.monotonic()
        return GenerationDelta(text=answer, new_tokens=0, finish_reason=DEADLINE_FINISH_REASON)
