"""The frame every screen shares: connection banner, title line, body, key footer."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer, Static

from tui.view_state import Model
from tui.widgets.banner import ConnectionBanner

if TYPE_CHECKING:
    from tui.app import ApplianceTui


class ApplianceScreen(Screen[None]):
    """A screen drawn from the app's Model; `show` is called on every update while visible."""

    TITLE_TEXT = ""

    @property
    def tui(self) -> ApplianceTui:
        """The app, typed."""
        return cast("ApplianceTui", self.app)

    def compose(self) -> ComposeResult:
        yield ConnectionBanner("", id="banner")
        yield Static(self.TITLE_TEXT, id="title")
        yield from self.compose_body()
        yield Footer()

    def compose_body(self) -> ComposeResult:
        """The screen's own widgets."""
        yield from ()

    def on_screen_resume(self) -> None:
        self.update_view()

    def update_view(self) -> None:
        """Redraw everything from the app's model."""
        model = self.tui.model
        self.query_one(ConnectionBanner).show(model.connection, self.tui.client.url)
        self.query_one("#title", Static).update(self._title(model))
        self.show(model)

    def _title(self, model: Model) -> str:
        status = model.status or {}
        badge = ""
        if (status.get("telemetry") or {}).get("simulated"):
            badge = " [reverse bold yellow] SIMULATED [/]"
        live = "SSE" if model.connection.events_live else "poll"
        return f"[b]{self.TITLE_TEXT}[/]  {self.tui.client.url}  ({live}){badge}"

    def show(self, model: Model) -> None:
        """Draw the body from the model."""
