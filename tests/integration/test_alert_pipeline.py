"""The alert pipeline for real: the daemon's /metrics -> Prometheus (the shipped rules) ->
Alertmanager -> a webhook, all on loopback ports.

The daemon is the aiohttp app with the fake engine and a fast simulated GPU; Prometheus and
Alertmanager are the Debian binaries (`make tools`). The rules are the shipped files with
short `for:` durations (tests/prom_stack.py: fast_rules), so what fires is the shipped logic.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import TestServer

from appliance.client import AdminClient, read_token_file
from appliance.daemon.app import build_app as build_daemon
from tests.fakes import FakeEngine, WordTokenizer
from tests.integration.test_app_fake_engine import MODEL, _cfg
from tests.prom_stack import (
    ALERTS,
    SLO,
    PromStack,
    alerting_rules,
    duration_s,
    fast_rules,
    rule,
    shipped_rule_files,
)

GPU_ALERT = "ApplianceGpuHot"
# Range windows of the SLO rules are divided by this in the test-only copy: see
# test_page_burn_rate_alert_fires_on_engine_kills_and_resolves.
SLO_WINDOW_DIVISOR = 60

# A bound for a broken run only. Each test takes about 15 s once vLLM's config is loaded (the
# fake engine's serving layer is vLLM's; the first start in a session adds 10-20 s), 5 s of it
# Prometheus's own wait before it hands its first targets to the scraper.
pytestmark = pytest.mark.timeout(240)


@dataclass
class Live:
    """The daemon on a real loopback port, and the fake engines it started."""

    server: TestServer
    url: str
    hostport: str
    admin: AdminClient
    engines: list[FakeEngine]


@contextlib.asynccontextmanager
async def live_daemon(state_dir: Path) -> AsyncIterator[Live]:
    """The daemon app (fake engine, simulated GPU) on 127.0.0.1, ready to admit."""
    state_dir.mkdir()
    cfg = _cfg(
        state_dir,
        admission={"concurrency_limit": 4},
        # Idle the simulated GPU sits near 31 °C; a hot room (+60 °C) takes it past the
        # 85 °C alert line within about 2 s with this time constant, and back under it
        # as fast once cleared.
        telemetry={"source": "sim", "interval_s": 0.2, "sim": {"time_constant_s": 0.5}},
    )
    engines: list[FakeEngine] = []

    def factory() -> FakeEngine:
        engines.append(FakeEngine(token_delay_s=0.005, start_delay_s=0.05, max_model_len=64))
        return engines[-1]

    server = TestServer(
        build_daemon(cfg, factory, WordTokenizer()), host="127.0.0.1", shutdown_timeout=0.5
    )
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    admin = AdminClient(url, read_token_file(state_dir / "admin.token"))
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(3000):
                with contextlib.suppress(aiohttp.ClientError):
                    async with s.get(url + "/health/ready") as r:
                        if r.status == 200:
                            break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the daemon did not become ready within 30 s")
        yield Live(server, url, f"127.0.0.1:{server.port}", admin, engines)
    finally:
        await admin.close()
        await server.close()


def fast_rule_files(tmp_path: Path) -> list[Path]:
    """The shipped rule files, rewritten for the test: `for:` 2 s everywhere; the SLO rules'
    windows compressed as well (the GPU rules need no window: they compare a gauge)."""
    out = tmp_path / "rules"
    out.mkdir()
    return [
        fast_rules(p, out / p.name, window_divisor=SLO_WINDOW_DIVISOR if p == SLO else 1)
        for p in shipped_rule_files()
    ]


@pytest.fixture(autouse=True)
def _no_env_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("APPLIANCE_ADMIN_TOKEN", raising=False)


async def _scraped(stack: PromStack) -> bool:
    """Prometheus has scraped the daemon at least once, successfully."""
    async with stack.http.get(
        stack.prom_url + "/api/v1/query", params={"query": 'up{job="appliance"} == 1'}
    ) as r:
        return bool((await r.json())["data"]["result"])


def _check_labels(alert: dict[str, Any], expected: dict[str, str], stack: PromStack) -> None:
    labels = alert["labels"]
    wrong = {k: (labels.get(k), v) for k, v in expected.items() if labels.get(k) != v}
    assert not wrong, f"labels (got, want): {wrong}; all labels {labels}\n{stack.logs()}"


async def test_gpu_hot_alert_fires_on_hot_room_and_resolves(tmp_path: Path) -> None:
    shipped = rule(ALERTS, GPU_ALERT)
    async with (
        live_daemon(tmp_path / "state") as d,
        PromStack(tmp_path / "prom", d.hostport, fast_rule_files(tmp_path)) as stack,
    ):
        await stack.wait_for(lambda: _scraped(stack), "Prometheus scrapes the daemon")
        assert not await stack.am_alerts(GPU_ALERT), "hot before any fault"

        await d.admin.inject_fault({"name": "hot_room", "delta_c": 60})
        firing = await stack.wait_for(
            lambda: stack.am_alerts(GPU_ALERT), f"{GPU_ALERT} active in Alertmanager"
        )
        assert len(firing) == 1, firing  # one simulated GPU, one alert
        assert firing[0]["status"]["state"] == "active", firing
        # The labels the rule gives (severity) and those of the series (gpu, instance, job).
        _check_labels(
            firing[0],
            {
                "alertname": GPU_ALERT,
                **{k: str(v) for k, v in shipped["labels"].items()},
                "gpu": "0",
                "instance": d.hostport,
                "job": "appliance",
            },
            stack,
        )
        assert "°C" in firing[0]["annotations"]["summary"], firing[0]["annotations"]
        await stack.wait_for(
            lambda: stack.webhook.seen(GPU_ALERT, "firing"),
            "the firing notification reaches the receiver",
        )

        await d.admin.clear_faults()
        await stack.wait_for(
            lambda: _gone(stack, GPU_ALERT), f"{GPU_ALERT} resolved in Alertmanager"
        )
        await stack.wait_for(
            lambda: stack.webhook.seen(GPU_ALERT, "resolved"),
            "the resolved notification reaches the receiver",
        )


async def _gone(stack: PromStack, alertname: str) -> bool:
    return not await stack.am_alerts(alertname)


# -- availability: a page-level burn-rate alert ------------------------------------------

_RANGE = re.compile(r"\[([0-9a-z]+)(?::[0-9a-z]*)?\]")


def page_burn_alert(path: Path) -> dict[str, Any]:
    """The fast page-level burn-rate alert of an SLO rule file: of its critical (paging)
    alerts, the one whose longest window (its own and those of the recording rules it reads)
    is the shortest, e.g. the 1 h / 5 min pair of the SRE workbook's 14.4x rule."""
    rules = [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]
    recorded = {r["record"]: str(r["expr"]) for r in rules if "record" in r}

    def windows(expr: str, seen: tuple[str, ...] = ()) -> list[float]:
        found = [duration_s(w) for w in _RANGE.findall(expr)]
        for name, sub in recorded.items():
            if name not in seen and re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", expr):
                found += windows(sub, (*seen, name))
        return found

    pages = [r for r in alerting_rules(path) if r.get("labels", {}).get("severity") == "critical"]
    assert pages, f"{path.name} has no critical (page-level) alert"
    return min(pages, key=lambda r: max(windows(str(r["expr"])), default=0.0))


async def _traffic(url: str, stop: asyncio.Event, statuses: collections.Counter[Any]) -> None:
    """One client sending small chat requests until stop is set; counts the answers."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_completion_tokens": 4,
    }
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        while not stop.is_set():
            try:
                async with s.post(url + "/v1/chat/completions", json=body) as r:
                    await r.read()
                    statuses[r.status] += 1
            except (TimeoutError, aiohttp.ClientError) as exc:
                statuses[type(exc).__name__] += 1
            await asyncio.sleep(0.02)


async def _kill_engine_repeatedly(d: Live, stop: asyncio.Event) -> int:
    """Kill the engine core every 0.5 s (the supervisor restarts it each time) until stop."""
    kills = 0
    while not stop.is_set():
        d.engines[-1].dead = True
        kills += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
    return kills


async def test_page_burn_rate_alert_fires_on_engine_kills_and_resolves(tmp_path: Path) -> None:
    # The test-only copy divides every range window of slo.yml by SLO_WINDOW_DIVISOR (1 h ->
    # 60 s, 5 min -> 5 s; `for:` 2 s). What the alert decides is unchanged: the error ratio
    # over a long and a short window, both above the same multiple of the 0.1 % budget, from
    # the same recording rules and the daemon's real counters. Only how far back each window
    # looks shrinks, in the same proportion for all, so a burst of crashes trips the pair in
    # seconds and a healthy engine clears the short window in seconds, as it would in minutes.
    page = page_burn_alert(SLO)
    name = page["alert"]
    async with (
        live_daemon(tmp_path / "state") as d,
        PromStack(tmp_path / "prom", d.hostport, fast_rule_files(tmp_path)) as stack,
    ):
        await stack.wait_for(lambda: _scraped(stack), "Prometheus scrapes the daemon")
        assert not await stack.am_alerts(name), f"{name} active before any crash"
        statuses: collections.Counter[Any] = collections.Counter()
        stop_traffic, stop_kills = asyncio.Event(), asyncio.Event()
        clients = [asyncio.create_task(_traffic(d.url, stop_traffic, statuses)) for _ in range(3)]
        killer = asyncio.create_task(_kill_engine_repeatedly(d, stop_kills))
        try:
            firing = await stack.wait_for(
                lambda: stack.am_alerts(name), f"{name} active in Alertmanager while crashing"
            )
            stop_kills.set()
            kills = await killer
            assert firing[0]["status"]["state"] == "active", firing
            expected = {"alertname": name, **{k: str(v) for k, v in page["labels"].items()}}
            if "instance" in firing[0]["labels"]:
                expected["instance"] = d.hostport
            _check_labels(firing[0], expected, stack)
            await stack.wait_for(
                lambda: stack.webhook.seen(name, "firing"),
                "the firing notification reaches the receiver",
            )
            # Requests keep flowing on a healthy engine: the short window clears.
            await stack.wait_for(lambda: _gone(stack, name), f"{name} resolved in Alertmanager")
            await stack.wait_for(
                lambda: stack.webhook.seen(name, "resolved"),
                "the resolved notification reaches the receiver",
            )
        finally:
            stop_kills.set()
            stop_traffic.set()
            await asyncio.gather(killer, *clients, return_exceptions=True)
        failed = sum(n for k, n in statuses.items() if isinstance(k, int) and k >= 500)
        assert kills >= 1 and statuses[200] > 0 and failed > 0, (kills, statuses)
