"""Controls: pause/resume admission, graceful restart, controller mode and manual limit."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Label, Static

from tui import fmt
from tui.screens.base import ApplianceScreen
from tui.view_state import Model


class ControlsScreen(ApplianceScreen):
    """Buttons for what an operator may change; every outcome is a notification."""

    TITLE_TEXT = "Controls"

    def compose_body(self) -> ComposeResult:
        with Vertical(id="controls"):
            yield Static("", id="control-state")
            yield Label("Engine")
            with Horizontal(classes="button-row"):
                yield Button("Pause (p)", id="pause", variant="warning")
                yield Button("Resume (r)", id="resume", variant="success")
                yield Button("Restart (R)", id="restart", variant="error")
            yield Label("Controller")
            with Horizontal(classes="button-row"):
                yield Button("Auto", id="mode-auto")
                yield Button("Manual", id="mode-manual")
                yield Input(placeholder="limit", id="limit", type="integer")
                yield Button("Set limit", id="set-limit", variant="primary")

    def show(self, model: Model) -> None:
        status = model.status or {}
        ctl = status.get("controller") or {}
        self.query_one("#control-state", Static).update(
            f"engine [b]{fmt.get(status, 'engine', 'state') or fmt.NA}[/]   "
            f"limit {fmt.num(fmt.get(status, 'admission', 'limit'))}   "
            f"controller mode {ctl.get('mode', fmt.NA)}"
        )

    def on_button_pressed(self, event: Button.Pressed) -> None:
        button = event.button.id or ""
        if button in ("pause", "resume"):
            self.tui.action_engine(button)
        elif button == "restart":
            self.tui.action_restart()
        elif button.startswith("mode-"):
            self.tui.set_controller(mode=button.removeprefix("mode-"))
        elif button == "set-limit":
            self._set_limit()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "limit":
            self._set_limit()

    def _set_limit(self) -> None:
        text = self.query_one("#limit", Input).value.strip()
        try:
            limit = int(text)
        except ValueError:
            self.notify(f"limit: a whole number >= 1, got {text!r}", severity="error")
            return
        if limit < 1:
            self.notify(f"limit: must be >= 1, got {limit}", severity="error")
            return
        # A manual limit only sticks in manual mode; say so by setting both.
        self.tui.set_controller(mode="manual", limit=limit)
