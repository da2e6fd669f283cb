"""vLLM's engine client with the appliance underneath: lane, deadline and accounting.

vLLM's serving classes (chat, completions, responses, ...) take an `EngineClient` and call
its `generate`. This wrapper is that client: every attribute is the real engine's, and
`generate` adds what each request's `RequestScope` asks for:

- the lane becomes vLLM's scheduling priority (realtime runs first inside the engine too);
- the engine always streams deltas to us, so the first token's time and the token count
  are known for every request (the controller's TTFT), and are reassembled into what the
  serving class asked for (deltas, cumulative, or the final output only);
- at the deadline the engine request is aborted and the answer so far comes back as the
  final output with finish_reason "deadline": the serving class turns it into the usual
  response, JSON or stream, tool and structured-output handling included;
- an engine that dies under a request becomes the appliance's EngineDead.

Admission (429/408/503) happens before the serving class is called, in the HTTP layer,
so those answers keep their status codes even for streams.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncGenerator
from typing import Any

from appliance.domain.request_scope import CURRENT_SCOPE, DEADLINE_FINISH_REASON, RequestScope
from appliance.errors import EngineDead


class QosEngineClient:
    """An EngineClient: the real one, with each generate under its request's scope."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        # vLLM refuses a non-zero priority unless its scheduler orders by priority.
        scheduler = getattr(getattr(inner, "vllm_config", None), "scheduler_config", None)
        self._by_priority = getattr(scheduler, "policy", "fcfs") == "priority"

    def __getattr__(self, name: str) -> Any:
        # Everything but generate is the engine's own (model_config, renderer, abort, ...).
        return getattr(self._inner, name)

    async def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, *args: Any, **kwargs: Any
    ) -> AsyncGenerator[Any, None]:
        """vLLM's generate, under the current request's lane, deadline and accounting."""
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        scope = CURRENT_SCOPE.get()
        if scope is None or not isinstance(sampling_params, SamplingParams):
            # Outside an HTTP request (warm-up) or a pooling call: vLLM's path as it is.
            async for out in self._inner.generate(
                prompt, sampling_params, request_id, *args, **kwargs
            ):
                yield out
            return
        if self._by_priority:
            kwargs["priority"] = scope.priority
        wanted = sampling_params.output_kind
        sampling_params.output_kind = RequestOutputKind.DELTA
        inner = self._inner.generate(prompt, sampling_params, request_id, *args, **kwargs)
        assembled: Any = None
        done: set[int] = set()
        seen = False
        try:
            async for delta in _until_deadline(inner, scope):
                _account(scope, delta, first=not seen)
                seen = True
                done.update(c.index for c in delta.outputs if c.finish_reason is not None)
                if wanted == RequestOutputKind.DELTA:
                    yield delta
                    continue
                assembled = _merge(assembled, delta)
                if wanted == RequestOutputKind.CUMULATIVE or delta.finished:
                    yield _snapshot(assembled)
            if scope.outcome.finish_reason == DEADLINE_FINISH_REASON:
                open_choices = [i for i in range(max(1, sampling_params.n)) if i not in done]
                yield _deadline_output(assembled, wanted, open_choices, request_id, prompt)
        except Exception as exc:
            raise self._engine_failure(exc) from exc
        finally:
            await inner.aclose()  # aborts the engine request when we stopped early

    def _engine_failure(self, exc: Exception) -> Exception:
        from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

        scope = CURRENT_SCOPE.get()
        dead = isinstance(exc, EngineDeadError) or (
            isinstance(exc, EngineGenerateError) and bool(self._inner.errored)
        )
        if not dead:
            return exc
        err = EngineDead("the engine died while serving this request")
        if scope is not None:
            scope.outcome.error = err
        return err


async def _until_deadline(inner: AsyncGenerator[Any, None], scope: RequestScope) -> Any:
    """The engine's outputs until it finishes or the deadline passes (outcome says which)."""
    if scope.deadline_s is None:
        async for out in inner:
            yield out
        return
    while True:
        remaining = scope.deadline_s - time.monotonic()
        try:
            if remaining <= 0:
                raise TimeoutError
            out = await asyncio.wait_for(anext(inner), timeout=remaining)
        except StopAsyncIteration:
            return
        except TimeoutError:
            scope.outcome.finish_reason = DEADLINE_FINISH_REASON
            return
        yield out


def _account(scope: RequestScope, delta: Any, *, first: bool) -> None:
    outcome = scope.outcome
    if first:  # once per engine request: batched prompts add up
        outcome.prompt_tokens += len(delta.prompt_token_ids or ())
    outcome.tokens_out(sum(len(c.token_ids) for c in delta.outputs), time.monotonic())
    for c in delta.outputs:
        outcome.add_text(delta.request_id, c.index, c.text or "")
        if c.finish_reason is not None:
            outcome.finish_reason = c.finish_reason


def _merge(assembled: Any, delta: Any) -> Any:
    """Deltas added up into one output, as the engine would give it cumulatively."""
    if assembled is None:
        first = copy.copy(delta)
        first.outputs = [copy.copy(c) for c in delta.outputs]
        for c in first.outputs:
            c.token_ids = list(c.token_ids)
            if c.logprobs is not None:
                c.logprobs = copy.copy(c.logprobs)
        return first
    assembled.add(delta, aggregate=True)
    assembled.outputs.sort(key=lambda c: c.index)
    return assembled


def _snapshot(assembled: Any) -> Any:
    out = copy.copy(assembled)
    out.outputs = [copy.copy(c) for c in assembled.outputs]
    return out


def _deadline_output(
    assembled: Any, wanted: Any, open_choices: list[int], request_id: str, prompt: Any
) -> Any:
    """The last output of an answer cut at its deadline: what came so far, every open
    choice marked "deadline" (deltas: an empty last delta per open choice)."""
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.sampling_params import RequestOutputKind

    def empty(index: int) -> Any:
        return CompletionOutput(
            index=index,
            text="",
            token_ids=[],
            cumulative_logprob=None,
            logprobs=None,
            finish_reason=DEADLINE_FINISH_REASON,
        )

    if assembled is None:
        ids = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else None
        assembled = RequestOutput(
            request_id=request_id,
            prompt=None,
            prompt_token_ids=list(ids) if ids is not None else [],
            prompt_logprobs=None,
            outputs=[],
            finished=False,
        )
    final = _snapshot(assembled)
    if wanted == RequestOutputKind.DELTA:
        final.outputs = [empty(i) for i in open_choices]
    else:
        have = {c.index for c in final.outputs}
        final.outputs += [empty(i) for i in open_choices if i not in have]
        for c in final.outputs:
            if c.index in open_choices:
                c.finish_reason = DEADLINE_FINISH_REASON
        final.outputs.sort(key=lambda c: c.index)
    final.finished = True
    return final
