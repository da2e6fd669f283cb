"""The batch controller on the real engine: a step load makes it climb and settle, an SLO
breach makes it back off and settle.

Where it settles between the bounds depends on how fast this machine is at that moment (a
2-core box shared with other work can be 3x slower than an idle one), so the SLOs here are
set through `PUT /admin/controller` far from the measured latency on either side: one the
engine always meets (the limit must climb to `max` and stay) and one it never meets (the
limit must fall to `min` and stay). Settling on a noisy plateau between the two is covered
by the policy's table and property tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.conftest import Daemon

pytestmark = pytest.mark.engine

LOW, HIGH = 2, 12


async def _put(admin: aiohttp.ClientSession, daemon: Daemon, **body: object) -> dict:
    async with admin.put(daemon.url + "/admin/controller", json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


@contextlib.asynccontextmanager
async def _step_load(daemon: Daemon, clients: int) -> AsyncIterator[list[int]]:
    """`clients` closed-loop chat clients from the moment of entry; yields the counters
    [answered, shed]. Auto mode sheds (429 ttft_unreachable) what would start past the TTFT
    SLO: a shed client waits a moment and asks again; any other answer fails the test."""
    body = {
        "model": daemon.model_name,
        "max_tokens": 12,
        "messages": [{"role": "user", "content": "Say something short."}],
    }
    done = [0, 0]
    stop = asyncio.Event()
    async with aiohttp.ClientSession() as client:

        async def worker() -> None:
            while not stop.is_set():
                async with client.post(daemon.url + "/v1/chat/completions", json=body) as r:
                    if r.status == 429:
                        error = (await r.json())["error"]
                        assert error["code"] == "ttft_unreachable", error
                        assert int(r.headers["Retry-After"]) >= 1
                        done[1] += 1
                        await asyncio.sleep(0.2)
                        continue
                    assert r.status == 200, await r.text()
                    done[0] += 1

        workers = [asyncio.create_task(worker()) for _ in range(clients)]
        try:
            yield done
        finally:
            stop.set()
            await asyncio.gather(*workers)


async def _watch(daemon: Daemon, target: int, timeout_s: float, hold_s: float) -> list[int]:
    """Base limits once a second until `target` has held for `hold_s` (or the timeout)."""
    seen: list[int] = []
    t0 = time.monotonic()
    held_since: float | None = None
    while time.monotonic() - t0 < timeout_s:
        seen.append(daemon.status()["admission"]["base_limit"])
        now = time.monotonic()
        if seen[-1] != target:
            held_since = None
        elif held_since is None:
            held_since = now
        elif now - held_since >= hold_s:
            break
        await asyncio.sleep(1)
    return seen


def _monotone(values: list[int], rising: bool) -> bool:
    pairs = itertools.pairwise(values)
    return all((b >= a) if rising else (b <= a) for a, b in pairs)


async def test_step_load_climbs_and_slo_breach_backs_off(daemon: Daemon):
    async with aiohttp.ClientSession(headers=daemon.admin_headers) as admin:
        # A known start: manual at the low end, then auto with an SLO the engine always meets.
        await _put(admin, daemon, mode="manual", limit=LOW + 2)
        try:
            async with _step_load(daemon, clients=20) as done:
                snap = await _put(
                    admin,
                    daemon,
                    mode="auto",
                    min=LOW,
                    max=HIGH,
                    slo_ttft_p99_s=120.0,
                    slo_tpot_p99_s=60.0,
                )
                assert snap["mode"] == "auto" and snap["slo_ttft_p99_s"] == 120.0
                rise = await _watch(daemon, HIGH, timeout_s=90, hold_s=8)
                done_rise, shed_rise = done[0], done[1]
                # Auto mode rated the real engine's prefill from its first tokens and set a
                # prefill budget from it.
                prefill = daemon.status()["controller"]["prefill"]

                # The same load against an SLO no engine meets: back off to the floor, stay.
                await _put(admin, daemon, slo_ttft_p99_s=0.001, slo_tpot_p99_s=0.001)
                fall = await _watch(daemon, LOW, timeout_s=90, hold_s=8)
            snap = daemon.status()
        finally:
            await _put(
                admin,
                daemon,
                mode="manual",
                limit=8,
                min=1,
                max=32,
                slo_ttft_p99_s=4.0,
                slo_tpot_p99_s=1.0,
            )
    print("controller limits, climb:", rise, "back-off:", fall)
    assert done_rise > 20 and done[0] > done_rise
    # Under an SLO the engine meets nothing is shed; under one it never meets, what would
    # have to queue is turned away at once (the clients still get answers at the floor).
    assert shed_rise == 0 and done[1] > 0, done
    assert snap["controller"]["prefill"]["shed_total"] >= done[1], snap["controller"]["prefill"]
    assert all(LOW <= v <= HIGH for v in rise + fall), (rise, fall)
    # Climbs to the ceiling without a cut on the way, and holds there (settled, no sawtooth).
    assert rise[-1] == HIGH and rise[-8:] == [HIGH] * 8, rise
    assert _monotone(rise, rising=True), rise
    # Backs off multiplicatively (at least one cut bigger than a step), to the floor, holds.
    assert fall[-1] == LOW and fall[-8:] == [LOW] * 8, fall
    assert _monotone(fall, rising=False), fall
    cuts = [a - b for a, b in itertools.pairwise(fall) if b < a]
    assert max(cuts) >= 2, fall
    assert prefill["rate_tok_s"] and prefill["rate_tok_s"] > 0, prefill
    assert isinstance(prefill["budget_tokens"], int) and prefill["budget_tokens"] >= 1, prefill
    decisions = snap["controller"]["decisions"]
    assert decisions and all(d["reason"] for d in decisions)
    reasons = [d["reason"] for d in decisions]
    assert any(d["action"] == "up" and "queued" in d["reason"] for d in decisions), reasons
    # vLLM's stat logger reported the engine's steps, and a probe was sized on those taken
    # since the change before it.
    assert any(
        d["action"] == "up"
        and "engine's" in d["reason"]
        and "steps since the last change" in d["reason"]
        for d in decisions
    ), reasons
    assert any(d["action"] == "down" and "SLO" in d["reason"] for d in decisions), reasons
