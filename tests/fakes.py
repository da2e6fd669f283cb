"""Test doubles for the engine port: fast, and able to fail on demand."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Sequence

from appliance.domain.engine_types import (
    EngineInfo,
    EngineStats,
    GenerationDelta,
    GenerationRequest,
    SamplingSpec,
)
from appliance.domain.step_latency import StepLatency, StepLatencyLog
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
        self._frontend: object | None = None
        # Each fake token is one engine step: its delay is the inter-token gap (the first,
        # from the start of generate, is the TTFT), as vLLM's stat logger reports them.
        self.steps = StepLatencyLog()

    async def start(self) -> EngineInfo:
        await asyncio.sleep(self.start_delay_s)
        if self.fail_start:
            raise EngineStartError("fake engine refused to start")
        from appliance.adapters.vllm_args import build_namespace
        from appliance.adapters.vllm_frontend import VllmFrontend
        from appliance.config import parse_config

        client = FakeVllmClient(self)
        cfg = parse_config({"engine": {"served_model_name": "fake-model"}})
        ns = build_namespace(
            cfg, client.model_config.model, gpu_memory_utilization=None, kv_cache_memory_bytes=None
        )
        self._frontend = await VllmFrontend.build(client, ns)
        return EngineInfo(
            model_dir="/fake",
            max_model_len=self.max_model_len,
            kv_cache_tokens=4096,
            block_size=16,
            num_blocks=256,
        )

    @property
    def frontend(self) -> object:
        assert self._frontend is not None, "not started"
        return self._frontend

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        self.seen.append(request)
        self.running.add(request.request_id)
        finished = False
        try:
            n = request.sampling.max_tokens
            last_s = started_s = time.monotonic()
            for i in range(n):
                await asyncio.sleep(self.token_delay_s)
                if self.dead:
                    raise EngineDead("fake engine died")
                now_s = time.monotonic()
                if i == 0:
                    self.steps.add(now_s, (), (now_s - started_s,))
                else:
                    self.steps.add(now_s, (now_s - last_s,), ())
                last_s = now_s
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

    def step_latency(
        self,
        since_s: float,
        *,
        min_steps: int = 0,
        floor_s: float = -math.inf,
        request_floor_s: float | None = None,
    ) -> StepLatency:
        return self.steps.since(
            since_s, min_steps=min_steps, floor_s=floor_s, request_floor_s=request_floor_s
        )

    def num_unfinished(self) -> int:
        return len(self.running)

    def counters(self) -> dict[str, int]:
        return {"requests_total": len(self.seen)}

    def child_pids(self) -> list[int]:
        return []

    async def shutdown(self) -> None:
        self.shut_down = True


# -- vLLM's serving layer over the fake engine --------------------------------------------
# The OpenAI surface is vLLM's own serving classes (adapters/vllm_frontend.py); over the
# fake engine they run for real on a real vLLM config and tokenizer (the SmolLM2 folder),
# and only the engine's token loop is fake.

_VLLM_CONFIGS: dict[int, object] = {}


def _vllm_config(max_model_len: int) -> object:
    """A real VllmConfig for the default model (no engine started), cached per length."""
    if max_model_len not in _VLLM_CONFIGS:
        from vllm import AsyncEngineArgs

        from tests.conftest import ensure_model

        args = AsyncEngineArgs(
            model=str(ensure_model()),
            served_model_name=["fake-model"],
            max_model_len=max_model_len,
            enforce_eager=True,
            scheduling_policy="priority",  # as the appliance configures it: lanes reach vLLM
        )
        _VLLM_CONFIGS[max_model_len] = args.create_engine_config()
    return _VLLM_CONFIGS[max_model_len]


class FakeVllmClient:
    """vLLM's EngineClient over FakeEngine's token loop: what the serving classes call."""

    def __init__(self, engine: FakeEngine) -> None:
        from vllm.renderers import renderer_from_config
        from vllm.v1.engine.input_processor import InputProcessor

        self._engine = engine
        self.vllm_config = _vllm_config(engine.max_model_len)
        self.model_config = self.vllm_config.model_config  # type: ignore[attr-defined]
        self.renderer = renderer_from_config(self.vllm_config)
        self.input_processor = InputProcessor(self.vllm_config, self.renderer)
        self.io_processor = None
        self.is_running = True
        self.is_stopped = False

    @property
    def errored(self) -> bool:
        return self._engine.dead

    @property
    def dead_error(self) -> BaseException:
        from vllm.v1.engine.exceptions import EngineDeadError

        return EngineDeadError()

    def check_admission(self, n: int = 1, request_id: str | None = None) -> None:
        pass

    async def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    async def is_tracing_enabled(self) -> bool:
        return False

    async def check_health(self) -> None:
        await self._engine.check_health()

    async def abort(self, request_id: object) -> None:
        await self._engine.abort(str(request_id))

    def get_tokenizer(self) -> object:
        return self.renderer.tokenizer

    async def generate(self, prompt, sampling_params, request_id, *args, **kwargs):  # type: ignore[no-untyped-def]
        """FakeEngine's tokens as vLLM's delta outputs, one choice after another."""
        from vllm.outputs import CompletionOutput, RequestOutput
        from vllm.v1.engine.exceptions import EngineDeadError

        ids = list(prompt.get("prompt_token_ids") or []) if isinstance(prompt, dict) else []
        spec = SamplingSpec(max_tokens=sampling_params.max_tokens or 1)
        request = GenerationRequest(request_id, tuple(ids), spec, kwargs.get("priority", 0))
        tokenizer = self.renderer.tokenizer
        for index in range(max(1, sampling_params.n)):
            try:
                async for delta in self._engine.generate(request):
                    yield RequestOutput(
                        request_id=request_id,
                        prompt=None,
                        prompt_token_ids=ids,
                        prompt_logprobs=None,
                        outputs=[
                            CompletionOutput(
                                index=index,
                                text=delta.text,
                                # One token per fake delta, as FakeEngine counts them.
                                token_ids=tokenizer.encode(delta.text, add_special_tokens=False)[
                                    : delta.new_tokens
                                ],
                                cumulative_logprob=None,
                                logprobs=None,
                                finish_reason=delta.finish_reason,
                            )
                        ],
                        finished=delta.finish_reason is not None
                        and index == max(1, sampling_params.n) - 1,
                    )
            except EngineDead as exc:
                raise EngineDeadError() from exc
