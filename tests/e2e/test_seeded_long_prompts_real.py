"""Seeded requests whose prompts the CPU engine prefills in chunks keep the engine alive.

vLLM 0.32 rewinds a seeded request's generator after a partial-prefill step, which a CPU
generator cannot do: before the appliance's vLLM plugin (appliance/adapters/vllm_plugins.py)
three seeded ~1,200-token prompts at once killed the engine core ("CPU Generator does not use
offset") and failed every request in flight. vLLM schedules at most 2,048 tokens a step here,
so the second and third prompts are prefilled in parts.
"""

from __future__ import annotations

import asyncio

import openai
import pytest

from appliance.bench_runner import document_prompt
from tests.conftest import Daemon

pytestmark = pytest.mark.engine


async def test_seeded_chunked_prefills_answer_and_the_engine_lives(daemon: Daemon) -> None:
    before = daemon.status()["engine"]
    client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)

    async def ask(i: int) -> openai.types.chat.ChatCompletion:
        return await client.chat.completions.create(
            model=daemon.model_name,
            messages=[{"role": "user", "content": document_prompt(i, 7, 1100)}],
            max_tokens=8,
            temperature=0.8,
            seed=100 + i,
        )

    answers = await asyncio.gather(*(ask(i) for i in range(3)))
    for a in answers:
        assert a.usage.prompt_tokens > 1100, a.usage  # long enough to need two steps
        assert a.choices[0].finish_reason in ("stop", "length")
        assert a.usage.completion_tokens >= 1
    after = daemon.status()["engine"]
    assert after["restarts_total"] == before["restarts_total"], (before, after)
    assert after["started_at_s"] == before["started_at_s"] and after["state"] == "ready"
    # Still serving: the same seeded request again gives the same answer as long as it is
    # prefilled the same way (alone here, as a whole).
    first = await ask(0)
    again = await ask(0)
    assert first.choices[0].message.content == again.choices[0].message.content
