"""The console driven through Pilot against the real HTTP app (fake engine) on a real port."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from textual.pilot import Pilot
from textual.widget import Widget
from textual.widgets import Button, DataTable, Input

from appliance.api.keys import SERVICES
from appliance.client import AdminClient, find_daemon, read_token_file
from appliance.config import parse_config
from appliance.daemon.app import build_app as build_daemon
from appliance.domain.api_keys import KeySpec
from appliance.domain.lanes import Lane
from appliance.domain.sweep_analysis import SweepPoint, find_knee, pareto_front, weighted_score
from appliance.services.container import Services
from appliance.services.key_store import KeyStore
from bench.servers import free_port
from tests.fakes import FakeEngine, WordTokenizer
from tui.app import ApplianceTui, build_app
from tui.screens.confirm import ConfirmScreen
from tui.screens.help import HelpScreen
from tui.view_state import Link

MODEL = "fake-model"


def daemon_config(state_dir: Path) -> Any:
    """A small, fast config: fake engine, simulated GPU sampled often."""
    return parse_config(
        {
            "state_dir": str(state_dir),
            "engine": {
                "served_model_name": MODEL,
                "max_model_len": 64,
                "max_tokens_default": 8,
                "drain_timeout_s": 5,
                "health_interval_s": 0.05,
                "restart_backoff_initial_s": 0.01,
                "restart_backoff_max_s": 0.05,
            },
            "admission": {"concurrency_limit": 2, "max_queue_wait_s": 5},
            "telemetry": {"source": "sim", "interval_s": 0.2},
        }
    )


@dataclass
class Live:
    """A running daemon app on a real TCP port."""

    server: TestServer
    url: str
    token_file: Path
    engines: list[FakeEngine]

    @property
    def app(self) -> web.Application:
        return self.server.app

    @property
    def svc(self) -> Services:
        return self.server.app[SERVICES]

    def client(self) -> AdminClient:
        return AdminClient(self.url, read_token_file(self.token_file))


async def start_live(state_dir: Path, port: int | None = None) -> Live:
    """Start the daemon app on 127.0.0.1 and wait until it admits."""
    engines: list[FakeEngine] = []

    def factory() -> FakeEngine:
        engines.append(FakeEngine(token_delay_s=0.005, start_delay_s=0.05, max_model_len=64))
        return engines[-1]

    app = build_daemon(daemon_config(state_dir), factory, WordTokenizer())
    # Open SSE streams would hold a graceful close for 60 s; the TUI must cope with a cut.
    server = TestServer(app, host="127.0.0.1", port=port, shutdown_timeout=0.5)
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    async with aiohttp.ClientSession() as s:
        for _ in range(500):
            async with s.get(url + "/health/ready") as r:
                if r.status == 200:
                    break
            await asyncio.sleep(0.01)
    return Live(server, url, state_dir / "admin.token", engines)


@pytest.fixture
async def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Live]:
    monkeypatch.delenv("APPLIANCE_ADMIN_TOKEN", raising=False)
    running = await start_live(tmp_path)
    yield running
    await running.server.close()


def text(widget: Widget) -> str:
    """What a widget shows, without markup."""
    return str(widget.render())


async def until(pilot: Pilot[Any], cond: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Let the app run until cond() holds. The timeout only bounds a broken run: each wait is
    for something that must happen, and on a loaded 2-core box (the real engine's daemon
    beside it) a few seconds are not always enough."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await pilot.pause(0.05)


def record_notifications(app: ApplianceTui) -> list[str]:
    """Keep every notification's text (and still show it)."""
    seen: list[str] = []
    real = app.notify

    def notify(message: str, **kw: Any) -> None:
        seen.append(f"{kw.get('title', '')}: {message}")
        real(message, **kw)

    app.notify = notify  # type: ignore[method-assign]
    return seen


def tui(client: Any, refresh_s: float = 0.2, **kw: Any) -> ApplianceTui:
    return build_app(client, refresh_s=refresh_s, backoff_initial_s=0.1, backoff_max_s=0.3, **kw)


async def chat(live: Live, n: int = 3) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(n):
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 6,
            }
            async with s.post(live.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200, await r.text()


async def test_dashboard_shows_the_live_daemon(live: Live) -> None:
    app = tui(live.client())
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.model.connection.link is Link.UP)
        await until(pilot, lambda: bool(app.screen.query("GpuPanel")))
        screen = app.screen
        assert not screen.query_one("#banner").display
        title = text(screen.query_one("#title"))
        assert "SIMULATED" in title and live.url in title
        assert "READY" in text(screen.query_one("#engine-state"))
        queues = text(screen.query_one("#queues"))
        assert "realtime" in queues and "batch" in queues
        assert "limit 2" in text(screen.query_one("#controller"))
        await until(pilot, lambda: "°C/90°C" in text(screen.query_one("#core .spark-value")))
        # Tokens/s and TTFT come from successive /metrics scrapes.
        await chat(live)
        await until(pilot, lambda: any(v > 0 for v in app.model.tokens_per_s))
        await until(pilot, lambda: "n/a" not in text(screen.query_one("#ttft .spark-value")))
        assert len(app.model.gpus[0].core_c) >= 2


async def test_events_stream_live_and_filter(live: Live) -> None:
    app = tui(live.client(), refresh_s=30)  # slow polls: what arrives comes over SSE
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("e")
        await until(pilot, lambda: app.model.connection.events_live)
        table = app.screen.query_one("#events")
        await until(pilot, lambda: table.row_count >= 3)
        live.svc.events.emit("thermal", "gpu0 core 91 °C vs derate 85 °C: derate", level="derate")
        await until(pilot, lambda: any(e["kind"] == "thermal" for e in app.model.events))
        await until(pilot, lambda: table.row_count == len(app.model.events))
        await pilot.press("slash", *"thermal")
        await until(pilot, lambda: table.row_count == 1)
        assert "derate" in str(table.get_row_at(0)[3])
        await pilot.press(*" nothing-like-this")
        await until(pilot, lambda: table.row_count == 0)
        await pilot.press("escape", "d")  # out of the filter, the keys drive the app again
        await until(pilot, lambda: app.screen.query("#engine-state"))


async def test_pause_and_resume_with_feedback(live: Live) -> None:
    app = tui(live.client())
    async with app.run_test(size=(80, 24)) as pilot:
        seen = record_notifications(app)
        await until(pilot, lambda: app.model.connection.link is Link.UP)
        await pilot.press("c")
        await pilot.click("#pause")
        await until(pilot, lambda: live.svc.supervisor.state.value == "paused")
        await until(pilot, lambda: any("paused" in s for s in seen))
        await until(pilot, lambda: "paused" in text(app.screen.query_one("#control-state")))
        await pilot.press("r")
        await until(pilot, lambda: live.svc.supervisor.state.value == "ready")
        await until(pilot, lambda: any("resumed" in s for s in seen))
        # Resuming a ready engine is refused by the daemon: the refusal is a notification.
        await pilot.press("r")
        await pilot.press("r")
        await until(pilot, lambda: len(seen) >= 3)
        assert app.is_running


async def test_restart_asks_first_and_restarts_gracefully(live: Live) -> None:
    app = tui(live.client())
    async with app.run_test(size=(80, 24)) as pilot:
        seen = record_notifications(app)
        await until(pilot, lambda: app.model.connection.link is Link.UP)
        await pilot.press("R")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        await pilot.pause(0.3)
        assert len(live.engines) == 1
        assert any("cancelled" in s for s in seen)
        await pilot.press("R")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.click("#yes")
        await until(pilot, lambda: len(live.engines) == 2)
        await until(pilot, lambda: any("graceful restart started" in s for s in seen))
        await until(
            pilot,
            lambda: any(
                e["kind"] == "engine_state" and e["data"].get("state") == "restarting"
                for e in app.model.events
            ),
        )
        await until(pilot, lambda: live.svc.supervisor.state.value == "ready")


async def test_controller_controls(live: Live) -> None:
    app = tui(live.client())
    async with app.run_test(size=(80, 24)) as pilot:
        seen = record_notifications(app)
        await until(pilot, lambda: app.model.connection.link is Link.UP)
        await pilot.press("c")
        await pilot.click("#limit")
        await pilot.press("0", "enter")
        await until(pilot, lambda: any("must be >= 1" in s for s in seen))
        await pilot.press("backspace", "3", "enter")
        await until(pilot, lambda: any("set mode manual, limit 3" in s for s in seen))
        await until(pilot, lambda: live.svc.admission.snapshot().base_limit == 3)
        await pilot.click("#mode-auto")
        await until(pilot, lambda: len(seen) >= 3)
        assert app.is_running


async def test_maintenance_and_benchmarks_screens(live: Live) -> None:
    app = tui(live.client())
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.model.connection.link is Link.UP)
        await pilot.press("j")
        await until(pilot, lambda: app.model.jobs is not None)
        await pilot.press("b")
        await until(pilot, lambda: app.model.benchmarks is not None)
        await pilot.press("d")
        assert "READY" in text(app.screen.query_one("#engine-state"))


async def test_usage_screen_shows_each_key_live(live: Live) -> None:
    store = KeyStore(live.svc.store.path)
    secret = store.add(KeySpec("team-a", Lane.INTERACTIVE, requests_per_min=60))
    store.close()
    app = tui(live.client())
    async with app.run_test(size=(100, 24)) as pilot:
        await until(pilot, lambda: app.model.connection.link is Link.UP)
        await pilot.press("u")
        await until(pilot, lambda: app.model.keys is not None and app.model.keys["keys"])
        async with aiohttp.ClientSession() as s:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            headers = {"Authorization": f"Bearer {secret}"}
            for _ in range(2):
                async with s.post(
                    live.url + "/v1/chat/completions", json=body, headers=headers
                ) as r:
                    assert r.status == 200, await r.text()
            async with s.post(live.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 401
        table = app.screen.query_one("#usage-table", DataTable)

        def row_of(key: str) -> list[str]:
            for i in range(table.row_count):
                row = [str(c) for c in table.get_row_at(i)]
                if row[0] == key:
                    return row
            return []

        # The screen refetches while it shows: the two answered and the refused call appear.
        await until(pilot, lambda: row_of("team-a")[5:7] == ["2", "0"])
        assert row_of("team-a")[1:3] == ["interactive", "60 rpm"]
        await until(pilot, lambda: row_of("-")[5:7] == ["1", "1"])
        assert "team-a" in text(app.screen.query_one("#usage-bars"))


async def test_run_a_job_now_through_the_confirmation(live: Live) -> None:
    app = tui(live.client())
    async with app.run_test(size=(80, 24)) as pilot:
        seen = record_notifications(app)
        await until(pilot, lambda: app.model.connection.link is Link.UP)
        await pilot.press("j")
        table = app.screen.query_one("#jobs", DataTable)
        await until(pilot, lambda: table.row_count >= 1)
        names = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        table.move_cursor(row=names.index("restart"))
        table.focus()
        # No: nothing runs.
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert "restart" in text(app.screen.query_one("#question"))
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        await pilot.pause(0.5)
        assert live.svc.store.job_runs("restart") == []
        assert len(live.engines) == 1
        # Yes: the daemon records a run (a restart job restarts the engine), and the table
        # follows the job's events to the outcome.
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(pilot, lambda: any("job restart started" in s for s in seen))
        await until(
            pilot, lambda: [r.outcome for r in live.svc.store.job_runs("restart")] == ["ok"], 10
        )
        runs = live.svc.store.job_runs("restart")
        assert runs[0].trigger == "manual"
        assert len(live.engines) == 2
        row = names.index("restart")
        await until(pilot, lambda: table.get_row_at(row)[4] == "ok")
        assert "manual" in text(app.screen.query_one("#job-history"))


def _sweep() -> list[SweepPoint]:
    def point(c: int, tok: float, p99: float) -> SweepPoint:
        return SweepPoint(c, tok, c / 2, p99 / 2, p99, 0.02, 0.04, p99 + 1)

    # 32 is slower and later than 16: off the Pareto front.
    return [
        point(1, 40, 0.1),
        point(2, 75, 0.12),
        point(4, 130, 0.2),
        point(8, 190, 0.5),
        point(16, 200, 1.9),
        point(32, 195, 3.0),
    ]


async def test_benchmarks_mark_the_knee_and_the_pareto_front(live: Live) -> None:
    points = _sweep()
    knee = find_knee(points)
    front = {p.concurrency for p in pareto_front(points)}
    assert 0 < len(front) < len(points)
    # Stored the way the re-benchmark job stores a sweep (BenchReport.to_dict's shape).
    result = {
        "levels": [{"concurrency": p.concurrency, "point": dataclasses.asdict(p)} for p in points],
        "knee": knee.to_dict(),
        "knee_limit": knee.concurrency,
        "pareto": sorted(front),
        "scores": weighted_score(points).to_dict(),
    }
    live.svc.store.add_benchmark("maintenance", result)
    app = tui(live.client())
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.model.connection.link is Link.UP)
        await pilot.press("b")
        table = app.screen.query_one("#runs", DataTable)
        await until(pilot, lambda: table.row_count == 1)
        assert table.get_row_at(0)[1:3] == ["maintenance", str(knee.concurrency)]
        shown = text(app.screen.query_one("#curve"))
        lines = {int(line[1:5]): line for line in shown.splitlines() if line[1:5].strip().isdigit()}
        assert sorted(lines) == [p.concurrency for p in points]
        for conc, line in lines.items():
            mark = "◆" if conc == knee.concurrency else ("·" if conc in front else " ")
            assert line[0] == mark, line
        assert f"◆ knee at {knee.concurrency}" in shown and "Pareto front" in shown


async def test_help_screen(live: Live) -> None:
    app = tui(live.client())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        assert "graceful restart" in text(app.screen.query_one("#help Static"))
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen))


async def test_daemon_down_banner_then_reconnect(tmp_path: Path) -> None:
    port = free_port()
    token = tmp_path / "admin.token"
    token.write_text("will-be-replaced")
    client = AdminClient(f"http://127.0.0.1:{port}", read_token_file(token))
    app = tui(client)
    async with app.run_test(size=(80, 24)) as pilot:
        seen = record_notifications(app)
        banner = app.screen.query_one("#banner")
        await until(pilot, lambda: "DAEMON DOWN" in text(banner))
        assert banner.display and "retrying in" in text(banner)
        assert f"127.0.0.1:{port}" in text(banner)
        # The daemon comes up on that port and writes a new token: the client's first 401
        # makes it read the file again.
        token.unlink()
        live = await start_live(tmp_path, port=port)
        try:
            await until(pilot, lambda: app.model.connection.link is Link.UP)
            await until(pilot, lambda: not banner.display)
            assert any("reconnected" in s for s in seen)
            # The daemon's engine starts after it listens: STARTING, then READY.
            await until(pilot, lambda: "READY" in text(app.screen.query_one("#engine-state")))
        finally:
            await live.server.close()
        await until(pilot, lambda: banner.display and "DAEMON DOWN" in text(banner))


async def test_bad_token_says_where_the_token_lives(live: Live, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.token"
    wrong.write_text("not-the-token")
    app = tui(AdminClient(live.url, read_token_file(wrong, f"--token-file {wrong}")))
    async with app.run_test(size=(80, 24)) as pilot:
        banner = app.screen.query_one("#banner")
        await until(pilot, lambda: "BAD ADMIN TOKEN" in text(banner))
        shown = text(banner)
        assert str(wrong) in shown
        assert "$APPLIANCE_ADMIN_TOKEN" in shown and "admin.token" in shown
        assert "--token-file" in shown
        assert app.model.connection.link is Link.UNAUTHORIZED


async def test_missing_token_names_the_file_the_config_points_at(
    live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("APPLIANCE_URL", "APPLIANCE_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    # The daemon's config names a state directory where no token was ever written.
    empty = tmp_path / "other-state"
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"state_dir: {empty}\nserver: {{port: {urlsplit(live.url).port}}}\n")
    address = find_daemon(config=cfg)
    assert address.url == live.url and address.token.value is None
    app = tui(AdminClient.at(address))
    async with app.run_test(size=(80, 24)) as pilot:
        banner = app.screen.query_one("#banner")
        await until(pilot, lambda: "no admin token found" in text(banner))
        assert str(empty / "admin.token") in text(banner)
        assert app.model.connection.link is Link.UNAUTHORIZED


@pytest.mark.engine
async def test_dashboard_against_the_real_engine(daemon: Any) -> None:
    token_file = daemon.state_dir / "admin.token"
    client = AdminClient.at(find_daemon(url=daemon.url, token_file=token_file))
    app = tui(client, refresh_s=0.5)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.model.connection.link is Link.UP, 20)
        await until(pilot, lambda: "READY" in text(app.screen.query_one("#engine-state")), 20)
        assert daemon.model_name in text(app.screen.query_one("#engine-state"))
        await pilot.press("e")
        await until(pilot, lambda: app.model.connection.events_live, 20)
        await until(pilot, lambda: app.screen.query_one("#events").row_count > 0, 10)


async def press(pilot: Pilot[Any], app: ApplianceTui, button: str) -> None:
    """Press a button by id (a click could land on a notification toast covering it)."""
    app.screen.query_one(button, Button).press()
    await pilot.pause()


async def _answer(pilot: Pilot[Any], app: ApplianceTui, key: str) -> str:
    """Wait for the confirmation, note its question, answer it with key."""
    await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
    question = text(app.screen.query_one("#question"))
    await pilot.press(key)
    await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
    return question


async def test_slo_and_bounds_are_set_through_the_confirmation(live: Live) -> None:
    ctl = live.svc.controller
    before = (ctl.cfg.slo_ttft_p99_s, ctl.cfg.max_limit)
    app = tui(live.client())
    async with app.run_test(size=(80, 24)) as pilot:
        seen = record_notifications(app)
        await until(pilot, lambda: app.model.connection.link is Link.UP)
        await pilot.press("c")
        for widget, value in (("#slo-ttft", "2.5"), ("#max", "6"), ("#min", "9")):
            app.screen.query_one(widget, Input).value = value
        await press(pilot, app, "#apply-objectives")
        await until(pilot, lambda: any("min: must be <= max, got 9 > 6" in s for s in seen))
        assert not isinstance(app.screen, ConfirmScreen)
        app.screen.query_one("#min", Input).value = ""
        # No: nothing changes.
        await press(pilot, app, "#apply-objectives")
        question = await _answer(pilot, app, "n")
        assert "slo_ttft_p99_s 2.5, max 6" in question
        await until(pilot, lambda: any("controller cancelled" in s for s in seen))
        assert (ctl.cfg.slo_ttft_p99_s, ctl.cfg.max_limit) == before
        # Yes: the controller steers by them, and says who asked.
        await press(pilot, app, "#apply-objectives")
        await _answer(pilot, app, "y")
        await until(pilot, lambda: (ctl.cfg.slo_ttft_p99_s, ctl.cfg.max_limit) == (2.5, 6))
        ev = [e for e in live.svc.events.recent(100) if e.kind == "controller_config"][-1]
        assert ev.data["slo_ttft_p99_s"] == 2.5 and ev.data["max"] == 6
        await until(pilot, lambda: "TTFT 2.50 s" in text(app.screen.query_one("#control-state")))


def _stored_sweep(live: Live) -> tuple[int, list[SweepPoint]]:
    points = _sweep()
    knee = find_knee(points)
    result = {
        "levels": [{"concurrency": p.concurrency, "point": dataclasses.asdict(p)} for p in points],
        "knee": knee.to_dict(),
        "knee_limit": knee.concurrency,
        "pareto": [p.concurrency for p in pareto_front(points)],
        "capped_by_daemon_limit": None,
    }
    return live.svc.store.add_benchmark("maintenance", result), points


async def test_a_benchmark_objective_becomes_the_ceiling_through_the_confirmation(
    live: Live,
) -> None:
    bench_id, points = _stored_sweep(live)
    knee = find_knee(points).concurrency
    ctl = live.svc.controller
    app = tui(live.client())
    async with app.run_test(size=(100, 30)) as pilot:
        seen = record_notifications(app)
        await until(pilot, lambda: app.model.connection.link is Link.UP)
        await pilot.press("b")
        table = app.screen.query_one("#runs", DataTable)
        await until(pilot, lambda: table.row_count == 1)
        await press(pilot, app, "#apply-knee")
        assert f"run {bench_id}'s knee" in await _answer(pilot, app, "n")
        await pilot.pause(0.3)
        assert ctl.ceiling is None
        await press(pilot, app, "#apply-knee")
        await _answer(pilot, app, "y")
        await until(pilot, lambda: ctl.ceiling == knee)
        await until(pilot, lambda: any(f"ceiling now {knee}: the knee at" in s for s in seen))
        # A Pareto level chosen by eye; one off the front is refused by the daemon.
        app.screen.query_one("#pareto-level", Input).value = "32"
        await press(pilot, app, "#apply-level")
        await _answer(pilot, app, "y")
        await until(pilot, lambda: any("level: 32 is not on this run's Pareto" in s for s in seen))
        assert ctl.ceiling == knee
        app.screen.query_one("#pareto-level", Input).value = "4"
        await press(pilot, app, "#apply-level")
        assert "run 1's 4" in await _answer(pilot, app, "y")
        await until(pilot, lambda: ctl.ceiling == 4)
        await press(pilot, app, "#apply-score")
        await _answer(pilot, app, "y")
        best = weighted_score(points, live.svc.config.bench.weights.to_policy()).best_concurrency
        await until(pilot, lambda: ctl.ceiling == best and any("weighted score" in s for s in seen))
    # The ceiling and who set it are kept for the next start.
    assert live.svc.store.kept_ceiling() == (best, ctl_source(live))


def ctl_source(live: Live) -> str:
    (ev,) = [e for e in live.svc.events.recent(200) if e.kind == "ceiling"][-1:]
    return ev.reason.removeprefix(f"concurrency ceiling set to {ev.data['ceiling']} from ")


async def test_thresholds_roll_back_through_the_confirmation(live: Live) -> None:
    svc = live.svc
    configured = svc.thresholds.current().derate_core_c
    now = time.time()
    for i in range(40):  # a quarter at a steady 70 °C: recalibration derates at 73 °C
        svc.store.add_metric_sample(now - 1000 + i, 0, {"core_temp_c_max": 70.0})
    app = tui(live.client())
    async with app.run_test(size=(100, 30)) as pilot:
        seen = record_notifications(app)
        await until(pilot, lambda: app.model.connection.link is Link.UP)
        async with aiohttp.ClientSession() as s:
            headers = {"Authorization": f"Bearer {read_token_file(live.token_file).value}"}
            async with s.post(live.url + "/admin/jobs/recalibrate/run?force=1", headers=headers):
                pass
        await until(pilot, lambda: svc.thresholds.current().derate_core_c == 73.0)
        await pilot.press("j")
        shown = app.screen.query_one("#thresholds")
        await until(pilot, lambda: "set 2 from recalibration: derate at 73.0" in text(shown))
        await press(pilot, app, "#rollback")
        assert "Roll the thresholds back" in await _answer(pilot, app, "n")
        await pilot.pause(0.3)
        assert svc.thresholds.current().derate_core_c == 73.0
        await press(pilot, app, "#rollback")
        await _answer(pilot, app, "y")
        await until(pilot, lambda: svc.thresholds.current().derate_core_c == configured)
        await until(pilot, lambda: any("rolled back to set" in s for s in seen))
        await until(pilot, lambda: "in force: set 1 from config" in text(shown))
