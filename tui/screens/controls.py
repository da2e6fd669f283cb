"""Controls: pause/resume admission, graceful restart, controller mode and manual limit, and
the SLO and bounds the controller steers by (asked before they are sent)."""

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
            yield Label("Steer by (p99 SLO in seconds, limit bounds; blank: unchanged)")
            with Horizontal(classes="button-row"):
                yield Input(placeholder="TTFT s", id="slo-ttft", type="number")
                yield Input(placeholder="TPOT s", id="slo-tpot", type="number")
                yield Input(placeholder="min", id="min", type="integer")
                yield Input(placeholder="max", id="max", type="integer")
                yield Button("Apply", id="apply-objectives", variant="primary")

    def show(self, model: Model) -> None:
        status = model.status or {}
        ctl = status.get("controller") or {}
        self.query_one("#control-state", Static).update(
            f"engine [b]{fmt.get(status, 'engine', 'state') or fmt.NA}[/]   "
            f"limit {fmt.num(fmt.get(status, 'admission', 'limit'))}   "
            f"controller mode {ctl.get('mode', fmt.NA)}\n"
            f"steers by p99 TTFT {fmt.num(ctl.get('slo_ttft_p99_s'), ' s', 2)}, "
            f"TPOT {fmt.num(ctl.get('slo_tpot_p99_s'), ' s', 2)}, "
            f"limits [{fmt.num(ctl.get('min'))}, {fmt.num(ctl.get('max'))}], "
            f"ceiling {fmt.num(ctl.get('ceiling'))}"
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
        elif button == "apply-objectives":
            self._apply_objectives()

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

    def _apply_objectives(self) -> None:
        """Check the four fields here (naming the bad one), then ask, then send."""
        fields: dict[str, float | int] = {}
        for widget_id, key, kind in (
            ("slo-ttft", "slo_ttft_p99_s", float),
            ("slo-tpot", "slo_tpot_p99_s", float),
            ("min", "min", int),
            ("max", "max", int),
        ):
            text = self.query_one(f"#{widget_id}", Input).value.strip()
            if not text:
                continue
            try:
                value = kind(text)
            except ValueError:
                what = "a whole number >= 1" if kind is int else "seconds > 0"
                self.notify(f"{key}: {what}, got {text!r}", severity="error")
                return
            if not value > 0:
                self.notify(f"{key}: must be > 0, got {text}", severity="error")
                return
            fields[key] = value
        if "min" in fields and "max" in fields and fields["min"] > fields["max"]:
            self.notify(
                f"min: must be <= max, got {fields['min']} > {fields['max']}", severity="error"
            )
            return
        if not fields:
            self.notify("nothing to change: fill in at least one field", severity="warning")
            return
        self.tui.confirm_controller(**fields)
