"""The operator console: one Textual app built around an admin-API client it is given."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar

from textual.app import App
from textual.binding import Binding

from appliance.client import AdminError, DaemonDown, NotAvailable, Unauthorized
from tui.daemon_api import AdminApi
from tui.screens.base import ApplianceScreen
from tui.screens.benchmarks import BenchmarksScreen
from tui.screens.confirm import ConfirmScreen
from tui.screens.controls import ControlsScreen
from tui.screens.dashboard import DashboardScreen
from tui.screens.events import EventsScreen
from tui.screens.help import HelpScreen
from tui.screens.maintenance import MaintenanceScreen
from tui.screens.usage import UsageScreen
from tui.view_state import Link, Model

DEFAULT_REFRESH_S = 2.0
EVENT_HISTORY = 100


class ApplianceTui(App[int]):
    """Polls /admin/status, follows /admin/events, and sends the operator's commands."""

    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "appliance"
    MODES: ClassVar[dict[str, Any]] = {
        "dashboard": DashboardScreen,
        "events": EventsScreen,
        "controls": ControlsScreen,
        "maintenance": MaintenanceScreen,
        "benchmarks": BenchmarksScreen,
        "usage": UsageScreen,
    }
    DEFAULT_MODE = "dashboard"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[Binding]] = [
        Binding("d", "switch_mode('dashboard')", "Dash"),
        Binding("e", "switch_mode('events')", "Events"),
        Binding("c", "switch_mode('controls')", "Ctrl"),
        Binding("j", "switch_mode('maintenance')", "Jobs"),
        Binding("b", "switch_mode('benchmarks')", "Bench"),
        Binding("u", "switch_mode('usage')", "Usage"),
        # Shown on the Controls screen and in help; the footer has to fit 80 columns.
        Binding("p", "engine('pause')", "Pause", show=False),
        Binding("r", "engine('resume')", "Resume", show=False),
        Binding("R", "restart", "Restart"),
        Binding("g", "poll_now", "Refresh", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        client: AdminApi,
        refresh_s: float = DEFAULT_REFRESH_S,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 15.0,
    ) -> None:
        super().__init__()
        self.client = client
        self.refresh_s = refresh_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.model = Model()
        self._poke = asyncio.Event()

    # -- lifecycle -------------------------------------------------------------------

    def on_mount(self) -> None:
        self.run_worker(self._poll_loop(), name="poll", group="poll", exit_on_error=False)
        self.run_worker(self._events_loop(), name="events", group="events", exit_on_error=False)

    async def on_unmount(self) -> None:
        await self.client.close()

    def refresh_view(self) -> None:
        """Redraw the visible screen (a modal on top is left alone)."""
        if isinstance(self.screen, ApplianceScreen):
            self.screen.update_view()

    def _backoff(self, failures: int) -> float:
        return min(self.backoff_max_s, self.backoff_initial_s * 2 ** max(0, failures - 1))

    async def _sleep_or_poke(self, delay_s: float) -> None:
        # Waits on an event, not a spin: an SSE event or a keypress wakes the poller early.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._poke.wait(), timeout=delay_s)
        self._poke.clear()

    async def _poll_loop(self) -> None:
        failures = 0
        while True:
            ok = await self.poll_once()
            failures = 0 if ok else failures + 1
            delay = self.refresh_s if ok else self._backoff(failures)
            if not ok:
                self.model.connection.retry_in_s = delay
                self.refresh_view()
            await self._sleep_or_poke(delay)

    async def poll_once(self) -> bool:
        """Fetch status and metrics once; True when the daemon answered."""
        conn = self.model.connection
        was = conn.link
        try:
            status = await self.client.status()
            metrics = await self.client.metrics_text()
        except Unauthorized as exc:
            conn.link, conn.message = Link.UNAUTHORIZED, exc.message
            return False
        except DaemonDown as exc:
            conn.link, conn.message = Link.DOWN, exc.message
            conn.events_live = False
            return False
        except AdminError as exc:
            conn.link, conn.message = Link.DOWN, exc.message
            return False
        self.model.ingest_status(status)
        self.model.ingest_metrics(metrics, time.monotonic())
        conn.link, conn.message, conn.retry_in_s = Link.UP, "", None
        if was in (Link.DOWN, Link.UNAUTHORIZED):
            self.notify(f"reconnected to {self.client.url}", title="daemon")
            self._poke.set()  # wake the event stream's retry as well
        self.refresh_view()
        return True

    async def _events_loop(self) -> None:
        failures = 0
        while True:
            try:
                async for event in self.client.events(history=EVENT_HISTORY):
                    failures = 0
                    if not self.model.connection.events_live:
                        self.model.connection.events_live = True
                    if self.model.add_event(event):
                        self._poke.set()  # a state change: fetch the new status now
                        if isinstance(self.screen, EventsScreen):
                            self.screen.update_view()
            except AdminError:
                pass  # the poller owns the banner; here we only retry
            self.model.connection.events_live = False
            failures += 1
            await asyncio.sleep(max(self.refresh_s, self._backoff(failures)))

    # -- commands --------------------------------------------------------------------

    def _run(
        self,
        what: str,
        call: Callable[[], Awaitable[Any]],
        done: str | Callable[[Any], str],
    ) -> None:
        async def go() -> None:
            try:
                answer = await call()
            except NotAvailable as exc:
                self.notify(exc.message, title=what, severity="warning")
                return
            except Unauthorized as exc:
                self.notify(exc.message, title=what, severity="error", timeout=10)
                return
            except AdminError as exc:
                self.notify(exc.message, title=what, severity="error", timeout=8)
                return
            except Exception as exc:  # an operator sees a message, never a traceback
                self.notify(f"{type(exc).__name__}: {exc}", title=what, severity="error")
                return
            self.notify(done if isinstance(done, str) else done(answer), title=what)
            self._poke.set()

        self.run_worker(go(), group="commands", exit_on_error=False)

    def action_engine(self, action: str) -> None:
        """Pause or resume admission."""
        verb = {"pause": "paused: new requests wait in the queue", "resume": "resumed"}
        self._run(f"engine {action}", lambda: self.client.engine(action), verb.get(action, action))

    def confirm(
        self,
        question: str,
        what: str,
        call: Callable[[], Awaitable[Any]],
        done: str | Callable[[Any], str],
    ) -> None:
        """Ask; on an explicit yes run the call, on anything else change nothing and say so."""

        def answered(yes: bool | None) -> None:
            if yes:
                self._run(what, call, done)
            else:
                self.notify(f"{what} cancelled", title=what)

        self.push_screen(ConfirmScreen(question), answered)

    def action_restart(self) -> None:
        """Ask, then start a graceful engine restart."""
        self.confirm(
            "Gracefully restart the engine?\nRunning requests finish, new ones wait.",
            "engine restart",
            lambda: self.client.engine("restart"),
            "graceful restart started; progress shows as events",
        )

    def set_controller(self, **fields: Any) -> None:
        """PUT /admin/controller with the given fields."""
        desc = ", ".join(f"{k} {v}" for k, v in fields.items())
        self._run("controller", lambda: self.client.set_controller(**fields), f"set {desc}")

    def confirm_controller(self, **fields: Any) -> None:
        """Ask, then PUT /admin/controller (the SLO and bounds the controller steers by)."""
        desc = ", ".join(f"{k} {v}" for k, v in fields.items())
        self.confirm(
            f"Change what the controller steers by?\n{desc}",
            "controller",
            lambda: self.client.set_controller(**fields),
            f"set {desc}",
        )

    def confirm_apply_benchmark(self, bench_id: int, objective: dict[str, Any]) -> None:
        """Ask, then make the run's objective (knee, score or a level) the ceiling."""
        chosen = objective.get("level") or objective.get("objective", "knee")
        what = "apply benchmark"

        async def call() -> dict[str, Any]:
            answer = await self.client.apply_benchmark(bench_id, objective)
            await self._load_benchmarks()
            return answer

        def done(answer: Any) -> str:
            ceiling = answer.get("ceiling") if isinstance(answer, dict) else None
            reason = answer.get("reason", "") if isinstance(answer, dict) else ""
            return f"ceiling now {'none' if ceiling is None else ceiling}: {reason}"[:200]

        self.confirm(
            f"Make run {bench_id}'s {chosen} the controller's ceiling?",
            what,
            call,
            done,
        )

    def confirm_rollback_thresholds(self) -> None:
        """Ask, then put the threshold set before the active one back in force."""

        async def call() -> dict[str, Any]:
            answer = await self.client.rollback_thresholds()
            await self._load_thresholds()
            return answer

        self.confirm(
            "Roll the thresholds back to the set before the active one?",
            "thresholds rollback",
            call,
            lambda answer: f"rolled back to set {(answer.get('restored') or {}).get('id')} "
            f"({(answer.get('restored') or {}).get('source', '')})",
        )

    def confirm_run_job(self, name: str) -> None:
        """Ask, then run a maintenance job now."""
        self.confirm(
            f"Run maintenance job '{name}' now?",
            f"job {name}",
            lambda: self._run_job(name),
            f"job {name} started",
        )

    async def _run_job(self, name: str) -> None:
        await self.client.run_job(name)
        await self._load_jobs()

    def load_jobs(self) -> None:
        """Fetch /admin/jobs in a worker and redraw."""
        self.run_worker(self._load_jobs, group="jobs", exclusive=True, exit_on_error=False)

    async def _load_jobs(self) -> None:
        try:
            self.model.jobs, self.model.jobs_error = await self.client.jobs(), None
        except AdminError as exc:
            self.model.jobs, self.model.jobs_error = None, exc.message
        self.refresh_view()

    def load_benchmarks(self) -> None:
        """Fetch /admin/benchmarks in a worker and redraw."""
        self.run_worker(self._load_benchmarks, group="bench", exclusive=True, exit_on_error=False)

    async def _load_benchmarks(self) -> None:
        try:
            found = await self.client.benchmarks()
            self.model.benchmarks, self.model.benchmarks_error = found, None
        except AdminError as exc:
            self.model.benchmarks, self.model.benchmarks_error = None, exc.message
        self.refresh_view()

    def load_thresholds(self) -> None:
        """Fetch /admin/thresholds in a worker and redraw."""
        self.run_worker(self._load_thresholds, group="thr", exclusive=True, exit_on_error=False)

    async def _load_thresholds(self) -> None:
        try:
            found = await self.client.thresholds()
            self.model.thresholds, self.model.thresholds_error = found, None
        except AdminError as exc:
            self.model.thresholds, self.model.thresholds_error = None, exc.message
        self.refresh_view()

    def load_usage(self) -> None:
        """Fetch /admin/keys and /admin/usage in a worker and redraw."""
        self.run_worker(self._load_usage, group="usage", exclusive=True, exit_on_error=False)

    async def _load_usage(self) -> None:
        try:
            self.model.keys = await self.client.keys()
            self.model.usage, self.model.usage_error = await self.client.usage(), None
        except AdminError as exc:
            self.model.usage_error = exc.message
        self.refresh_view()

    def action_poll_now(self) -> None:
        """Refresh at once instead of at the next tick."""
        self._poke.set()

    def action_help(self) -> None:
        """Show the key map."""
        self.push_screen(HelpScreen())


def build_app(
    client: AdminApi, refresh_s: float = DEFAULT_REFRESH_S, **kwargs: Any
) -> ApplianceTui:
    """The console, talking to the daemon through `client`."""
    return ApplianceTui(client, refresh_s=refresh_s, **kwargs)
