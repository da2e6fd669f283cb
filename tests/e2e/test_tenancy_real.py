"""Keys on the real engine: lane entitlement, a key's rate limit, fairness between two keys
in one lane, usage and the audit log one to one with what was sent, and a revoke.

The keys are made with `appliance keys add` against the shared daemon's own config, as an
operator would; at the end they are revoked and purged, which opens /v1 again for the
other tests (the operator's way back to open mode).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from appliance.services.key_store import KeyStore
from tests.conftest import Daemon

pytestmark = pytest.mark.engine

KEYS = {
    "flood": ["--lanes", "interactive"],
    "quiet": ["--lanes", "interactive"],
    "batch-only": ["--lanes", "batch"],
    "limited": ["--lanes", "interactive", "--rpm", "2"],
}


def appliance(daemon: Daemon, *argv: str) -> subprocess.CompletedProcess[str]:
    """The `appliance` command against the shared daemon's config."""
    cmd = [
        sys.executable,
        "-m",
        "appliance",
        *argv,
        "--config",
        str(daemon.state_dir / "config.yaml"),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


class Tenants:
    def __init__(self, daemon: Daemon, secrets: dict[str, str]) -> None:
        self.daemon = daemon
        self.secrets = secrets
        self.sent: Counter[tuple[str, str]] = Counter()  # (key, status) of every call made

    def headers(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secrets[key]}"}

    async def chat(
        self, s: aiohttp.ClientSession, key: str, status: str, **kw: Any
    ) -> tuple[int, dict[str, Any], Any]:
        """POST a chat as key; counts it under the status the ledger should give it."""
        body = {
            "model": self.daemon.model_name,
            "messages": [{"role": "user", "content": "Say something about the sea."}],
            "max_tokens": 8,
            **kw,
        }
        async with s.post(
            self.daemon.url + "/v1/chat/completions", json=body, headers=self.headers(key)
        ) as r:
            doc = await r.json()
            self.sent[(key, status)] += 1
            return r.status, doc, r.headers


async def _open_again(daemon: Daemon) -> bool:
    async with (
        aiohttp.ClientSession(headers=daemon.admin_headers) as s,
        s.get(daemon.url + "/admin/keys") as r,
    ):
        return bool((await r.json())["open"])


@pytest.fixture(scope="module")
def tenants(daemon: Daemon) -> Iterator[Tenants]:
    secrets = {}
    for name, flags in KEYS.items():
        done = appliance(daemon, "keys", "add", name, *flags)
        assert done.returncode == 0, done.stderr
        secrets[name] = done.stdout.strip()
    yield Tenants(daemon, secrets)
    store = KeyStore(daemon.state_dir / "appliance.db")
    for name in KEYS:
        store.revoke(name)
    store.purge_revoked()
    store.close()
    deadline = time.monotonic() + 5
    while not asyncio.run(_open_again(daemon)):
        assert time.monotonic() < deadline, "the daemon did not open /v1 after the purge"
        time.sleep(0.1)
    daemon.admin.put("/admin/controller", {"mode": "manual", "limit": 8})


async def test_a_key_without_the_lane_gets_403_and_its_ceiling_without_asking(tenants: Tenants):
    async with aiohttp.ClientSession() as s:
        status, doc, _ = await tenants.chat(s, "batch-only", "forbidden", priority="interactive")
        assert status == 403 and doc["error"]["param"] == "priority"
        assert "ceiling is batch" in doc["error"]["message"]
        status, doc, _ = await tenants.chat(s, "batch-only", "ok")
        assert status == 200 and doc["choices"][0]["message"]["content"]
        async with s.post(
            tenants.daemon.url + "/v1/chat/completions",
            json={
                "model": tenants.daemon.model_name,
                "messages": [{"role": "user", "content": "hi"}],
            },
        ) as r:
            assert r.status == 401  # keys exist now: no key, no answer
            tenants.sent[("-", "unauthorized")] += 1


async def test_a_keys_rate_limit_is_429_with_openai_headers(tenants: Tenants):
    async with aiohttp.ClientSession() as s:
        for left in ("1", "0"):
            status, _, headers = await tenants.chat(s, "limited", "ok")
            assert status == 200 and headers["x-ratelimit-remaining-requests"] == left
        status, doc, headers = await tenants.chat(s, "limited", "rate_limited")
        assert status == 429 and doc["error"]["code"] == "rate_limit_exceeded"
        assert "2 requests per minute" in doc["error"]["message"]
        assert int(headers["Retry-After"]) >= 1
        assert headers["x-ratelimit-limit-requests"] == "2"
        assert headers["x-ratelimit-remaining-requests"] == "0"


async def test_a_flood_from_one_key_does_not_starve_another_in_the_same_lane(
    tenants: Tenants,
):
    daemon = tenants.daemon
    daemon.admin.put("/admin/controller", {"mode": "manual", "limit": 1})
    done: list[str] = []

    async def one(s: aiohttp.ClientSession, key: str) -> None:
        status, _, _ = await tenants.chat(s, key, "ok", max_tokens=12, ignore_eos=True)
        assert status == 200
        done.append(key)

    async with aiohttp.ClientSession() as s:
        flood = [asyncio.create_task(one(s, "flood")) for _ in range(8)]
        # The flood's first request runs and the other seven queue before the quiet key asks.
        await _until(lambda: _queued(daemon) >= 7)
        quiet = [asyncio.create_task(one(s, "quiet")) for _ in range(2)]
        await asyncio.gather(*flood, *quiet)
    daemon.admin.put("/admin/controller", {"mode": "manual", "limit": 8})
    # First come, first served would finish the quiet key's two last (9th and 10th); fair
    # turns between the keys let each in after at most one more of the flood's.
    positions = [i + 1 for i, key in enumerate(done) if key == "quiet"]
    print(f"\ncompletion order at limit 1: {done}; the quiet key finished {positions}")
    assert positions[-1] <= 5, done


async def test_usage_and_audit_match_the_calls_one_to_one(tenants: Tenants):
    daemon = tenants.daemon
    daemon.admin.put("/admin/controller", {"mode": "manual", "limit": 1})
    async with aiohttp.ClientSession() as s:
        # Cut at its deadline: the answer so far, audited as a deadline.
        status, doc, _ = await tenants.chat(
            s, "quiet", "deadline", max_tokens=1500, ignore_eos=True, deadline_ms=800
        )
        assert status == 200 and doc["choices"][0]["finish_reason"] == "deadline"
        # The batch lane holds 2 waiting (the shared daemon's config) behind 1 running: a
        # burst of 5 from the batch key overflows it with 429s.
        burst = await asyncio.gather(
            *(
                s.post(
                    daemon.url + "/v1/chat/completions",
                    json={
                        "model": daemon.model_name,
                        "messages": [{"role": "user", "content": "Count to twenty."}],
                        "max_tokens": 24,
                        "ignore_eos": True,
                    },
                    headers=tenants.headers("batch-only"),
                )
                for _ in range(5)
            )
        )
        statuses = Counter(r.status for r in burst)
        for r in burst:
            r.release()
    daemon.admin.put("/admin/controller", {"mode": "manual", "limit": 8})
    assert statuses[429] >= 1 and statuses[200] >= 1, statuses
    tenants.sent[("batch-only", "ok")] += statuses[200]
    tenants.sent[("batch-only", "rejected")] += statuses[429]

    mine = {key for key, _ in tenants.sent}
    usage = daemon.admin.get("/admin/usage")
    counted = Counter(
        {
            (k["key"], status): n
            for k in usage["keys"]
            if k["key"] in mine
            for status, n in k["by_status"].items()
        }
    )
    assert counted == tenants.sent
    # The audit log, read with the operator's own command; its writer flushes every 0.5 s.
    deadline = time.monotonic() + 10
    while True:
        out = appliance(daemon, "audit", "export")
        assert out.returncode == 0, out.stderr
        records = [json.loads(line) for line in out.stdout.splitlines()]
        audited = Counter((r["key_name"], r["status"]) for r in records if r["key_name"] in mine)
        if audited == tenants.sent or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert audited == tenants.sent
    cut = [r for r in records if r["key_name"] == "quiet" and r["status"] == "deadline"]
    assert cut[0]["finish_reason"] == "deadline" and cut[0]["completion_tokens"] > 0
    assert cut[0]["answer_sha256"] and cut[0]["answer_text"] is None  # hashes, no text
    refused = [r for r in records if r["status"] in ("rejected", "rate_limited")]
    assert {r["http_status"] for r in refused} == {429}


async def test_a_revoked_key_gets_401_within_a_second(tenants: Tenants):
    async with aiohttp.ClientSession() as s:
        status, _, _ = await tenants.chat(s, "flood", "ok", max_tokens=1)
        assert status == 200
        done = appliance(tenants.daemon, "keys", "revoke", "flood")
        assert done.returncode == 0, done.stderr
        revoked_at = time.monotonic()
        while True:
            status, _, _ = await tenants.chat(s, "flood", "unauthorized", max_tokens=1)
            if status == 401:
                break
            tenants.sent[("flood", "unauthorized")] -= 1
            tenants.sent[("flood", "ok")] += 1
            assert time.monotonic() - revoked_at < 1.0, "served a second after the revoke"


def _queued(daemon: Daemon) -> int:
    return sum(daemon.status()["admission"]["queued"].values())


async def _until(cond: Any, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(cond):
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)
