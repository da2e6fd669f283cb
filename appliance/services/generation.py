"""One generation in the engine, cut at its deadline, and what it produced."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from appliance.domain.engine_types import GenerationDelta, GenerationRequest
from appliance.domain.parsed_request import ParsedRequest
from appliance.domain.request_scope import DEADLINE_FINISH_REASON, Outcome
from appliance.ports import Engine


async def generate(
    engine: Engine, parsed: ParsedRequest, request_id: str, outcome: Outcome, arrived_s: float
) -> AsyncIterator[GenerationDelta]:
    """Run the request in the engine, cut at its deadline; fills outcome as it goes."""
    gen_req = GenerationRequest(
        request_id, parsed.prompt_token_ids, parsed.sampling, priority=int(parsed.lane)
    )
    stream = engine.generate(gen_req)
    deadline_s = arrived_s + parsed.deadline_ms / 1000 if parsed.deadline_ms else None
    try:
        while True:
            try:
                if deadline_s is None:
                    delta = await anext(stream)
                else:
                    remaining = deadline_s - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError
                    delta = await asyncio.wait_for(anext(stream), timeout=remaining)
            except StopAsyncIteration:
                break
            except TimeoutError:
                outcome.finish_reason = DEADLINE_FINISH_REASON
                break
            outcome.tokens_out(delta.new_tokens, time.monotonic())
            if delta.text:
                outcome.text.append(delta.text)
            if delta.finish_reason:
                outcome.finish_reason = delta.finish_reason
            yield delta
    finally:
        await stream.aclose()  # aborts the engine request when we stopped early
