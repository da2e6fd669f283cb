"""Real Prometheus and Alertmanager (the Debian binaries) on loopback ports, for pipeline tests.

`fast_rules` writes a test-only copy of the shipped rule files with short `for:` durations
(and, for the SLO rules, compressed range windows); `PromStack` starts Alertmanager (routing
to a webhook receiver in the test's own event loop) and Prometheus (scraping the daemon,
evaluating those rules), waits for /-/ready, and always stops both.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import re
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
import yaml
from aiohttp import web

from bench.servers import free_port

MONITORING = Path(__file__).resolve().parents[1] / "monitoring"
ALERTS = MONITORING / "alerts.yml"
SLO = MONITORING / "slo.yml"  # availability recording rules and burn-rate alerts

T = TypeVar("T")


def shipped_rule_files() -> list[Path]:
    """The rule files Prometheus loads in production (monitoring/prometheus.yml)."""
    return [ALERTS, SLO]


def _tool(*names: str) -> str:
    for name in names:
        if exe := shutil.which(name):
            return exe
    pytest.fail(f"{names[0]} is not installed: `make tools` installs the Debian packages")


# -- test-only rules --------------------------------------------------------------------

_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
# A range selector or subquery `[1h]`, `[30m:1m]`, and an `offset 5m` modifier.
_RANGE = re.compile(r"\[([0-9a-z]+)(?::([0-9a-z]*))?\]")
_OFFSET = re.compile(r"\boffset\s+([0-9a-z]+)")


def duration_s(text: str) -> float:
    """Seconds in a Prometheus duration such as `1h30m`."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(int(n) * _UNIT_S[u] for n, u in parts)


def scale_windows(expr: str, divisor: float) -> str:
    """expr with every range window, subquery step and offset divided by divisor (whole
    seconds, at least 1 s)."""

    def short(d: str) -> str:
        return f"{max(1, round(duration_s(d) / divisor))}s"

    def rng(m: re.Match[str]) -> str:
        step = m.group(2)
        if step is None:
            return f"[{short(m.group(1))}]"
        return f"[{short(m.group(1))}:{short(step) if step else ''}]"

    expr = _RANGE.sub(rng, expr)
    return _OFFSET.sub(lambda m: f"offset {short(m.group(1))}", expr)


def fast_rules(src: Path, dst: Path, *, for_: str = "2s", window_divisor: float = 1) -> Path:
    """Write src's rules to dst with every `for:` set to for_ and windows divided by
    window_divisor; expr thresholds, labels and annotations stay as shipped."""
    doc = yaml.safe_load(src.read_text())
    for group in doc["groups"]:
        group.pop("interval", None)  # the test's global evaluation_interval (1 s) applies
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = for_
            rule.pop("keep_firing_for", None)
            if window_divisor != 1:
                rule["expr"] = scale_windows(str(rule["expr"]), window_divisor)
    dst.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return dst


def alerting_rules(path: Path) -> list[dict[str, Any]]:
    """The alerting rules (not recording rules) of a rule file."""
    doc = yaml.safe_load(path.read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def rule(path: Path, alert: str) -> dict[str, Any]:
    """One alerting rule by name."""
    found = [r for r in alerting_rules(path) if r["alert"] == alert]
    assert found, f"{path.name} has no alert {alert}"
    return found[0]


# -- the stack --------------------------------------------------------------------------


class Webhook:
    """Alertmanager's receiver: a webhook endpoint that keeps every notification."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        self.port = free_port()
        app = web.Application()
        app.router.add_post("/", self._post)
        self._runner = web.AppRunner(app)

    async def _post(self, request: web.Request) -> web.Response:
        self.notifications.append(await request.json())
        return web.Response()

    async def start(self) -> None:
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        await self._runner.cleanup()

    def seen(self, alertname: str, status: str) -> list[dict[str, Any]]:
        """Alerts named alertname delivered with status (firing or resolved)."""
        return [
            a
            for n in self.notifications
            for a in n.get("alerts", [])
            if a["labels"].get("alertname") == alertname and a["status"] == status
        ]


class PromStack:
    """Alertmanager and Prometheus on 127.0.0.1, Prometheus scraping `target` as
    job="appliance" and evaluating `rule_files`."""

    def __init__(self, workdir: Path, target: str, rule_files: list[Path]) -> None:
        self.workdir = workdir
        self.target = target  # host:port of the daemon
        self.rule_files = rule_files
        self.am_url = f"http://127.0.0.1:{free_port()}"
        self.prom_url = f"http://127.0.0.1:{free_port()}"
        self.webhook = Webhook()
        self._procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        self._session: aiohttp.ClientSession | None = None

    # -- configs

    def _am_config(self) -> Path:
        cfg = {
            # Prometheus re-sends firing alerts with endsAt ahead; resolve_timeout only
            # matters for alerts without one, kept short so nothing lingers here.
            "global": {"resolve_timeout": "10s"},
            "route": {
                "receiver": "webhook",
                "group_by": ["alertname", "instance", "gpu"],
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [
                {
                    "name": "webhook",
                    "webhook_configs": [
                        {"url": f"http://127.0.0.1:{self.webhook.port}/", "send_resolved": True}
                    ],
                }
            ],
        }
        path = self.workdir / "alertmanager.yml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    def _prom_config(self) -> Path:
        cfg = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(p) for p in self.rule_files],
            "alerting": {
                "alertmanagers": [
                    {"static_configs": [{"targets": [self.am_url[len("http://") :]]}]}
                ]
            },
            "scrape_configs": [
                {
                    "job_name": "appliance",
                    "static_configs": [{"targets": [self.target]}],
                    # The shipped GPU rules leave simulated GPUs alone (no page from a box
                    # without GPUs). The test's GPU is the simulator, so the scrape presents it
                    # as a real one: the rules themselves run as shipped.
                    "metric_relabel_configs": [
                        {
                            "source_labels": ["simulated"],
                            "regex": "true",
                            "target_label": "simulated",
                            "replacement": "false",
                        }
                    ],
                }
            ],
        }
        path = self.workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    # -- lifecycle

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = self.workdir / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir)
        self._procs[name] = (proc, log)

    async def start(self) -> None:
        """Start the webhook, Alertmanager and Prometheus; return when both answer /-/ready."""
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        await self.webhook.start()
        am_port = self.am_url.rsplit(":", 1)[1]
        prom_port = self.prom_url.rsplit(":", 1)[1]
        (self.workdir / "am-data").mkdir(parents=True)
        (self.workdir / "prom-data").mkdir()
        self._spawn(
            "alertmanager",
            [
                _tool("prometheus-alertmanager", "alertmanager"),
                f"--config.file={self._am_config()}",
                f"--storage.path={self.workdir / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{am_port}",
                "--cluster.listen-address=",  # no gossip: a single instance, no extra port
            ],
        )
        self._spawn(
            "prometheus",
            [
                _tool("prometheus"),
                f"--config.file={self._prom_config()}",
                f"--storage.tsdb.path={self.workdir / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
        )
        for name, url in (("alertmanager", self.am_url), ("prometheus", self.prom_url)):
            await self.wait_for(lambda u=url, n=name: self._ready(u, n), f"{name} ready", 30)

    async def _ready(self, url: str, name: str) -> bool:
        proc, _ = self._procs[name]
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited with {proc.returncode}\n{self.logs()}")
        try:
            return (await self.http.get(url + "/-/ready")).status == 200
        except aiohttp.ClientError:
            return False

    async def stop(self) -> None:
        """Stop both binaries (terminate, then kill), the webhook and the HTTP session."""
        for proc, _ in self._procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc, _ in self._procs.values():
            try:
                await asyncio.to_thread(proc.wait, 10)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait)
        await self.webhook.stop()
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> PromStack:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def logs(self, tail: int = 4000) -> str:
        """The last lines of both binaries' logs, for a failure message."""
        out = []
        for name, (_, log) in self._procs.items():
            text = log.read_text(errors="replace") if log.exists() else ""
            out.append(f"--- {name} log (last {tail} chars) ---\n{text[-tail:]}")
        return "\n".join(out)

    # -- queries

    @property
    def http(self) -> aiohttp.ClientSession:
        assert self._session is not None, "not started"
        return self._session

    async def am_alerts(self, alertname: str) -> list[dict[str, Any]]:
        """Alertmanager's active (unresolved) alerts named alertname (API v2)."""
        params = {"filter": f'alertname="{alertname}"', "active": "true"}
        async with self.http.get(self.am_url + "/api/v2/alerts", params=params) as r:
            assert r.status == 200, f"GET /api/v2/alerts: {r.status} {await r.text()}"
            return list(await r.json())

    async def prom_alerts(self) -> list[dict[str, Any]]:
        """Prometheus's own view of its alerts (pending and firing), for failure messages."""
        try:
            async with self.http.get(self.prom_url + "/api/v1/alerts") as r:
                return list((await r.json())["data"]["alerts"])
        except (aiohttp.ClientError, KeyError, ValueError) as exc:
            return [{"error": repr(exc)}]

    async def wait_for(
        self, probe: Callable[[], T | Awaitable[T]], what: str, timeout_s: float = 60
    ) -> T:
        """Poll probe (plain or async) until it gives something truthy. The bound only catches
        a broken run (each wait is for something that must happen), not a timing assertion."""
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(TimeoutError, aiohttp.ClientError):
                result = probe()
                if inspect.isawaitable(result):
                    result = await result
                if result:
                    return result  # type: ignore[return-value]
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{what}: not within {timeout_s} s\n"
                    f"Prometheus alerts: {await self.prom_alerts()}\n"
                    f"webhook notifications: {self.webhook.notifications}\n{self.logs()}"
                )
            await asyncio.sleep(0.25)
