"""The event stream (derates, restarts, controller moves, jobs, errors), filterable."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Input

from tui import fmt
from tui.screens.base import ApplianceScreen
from tui.view_state import Model

ROWS_SHOWN = 300


def matches(event: dict[str, Any], words: list[str]) -> bool:
    """True when every word occurs in the event's kind, reason or data."""
    if not words:
        return True
    text = f"{event.get('kind', '')} {event.get('reason', '')} {json.dumps(event.get('data'))}"
    text = text.lower()
    return all(w in text for w in words)


def _key(event: dict[str, Any]) -> tuple[Any, ...]:
    """What tells one event from the next (seq where the daemon numbers them)."""
    return (event.get("seq"), event.get("ts_s"), event.get("kind"), event.get("reason"))


class EventsScreen(ApplianceScreen):
    """Newest at the bottom; the filter narrows by kind or any word."""

    TITLE_TEXT = "Events"
    BINDINGS: ClassVar[list[Binding]] = [
        Binding("slash", "focus_filter", "Filter"),
        Binding("escape", "focus_table", "Table", show=False),
    ]

    def compose_body(self) -> ComposeResult:
        yield Input(placeholder="filter: kind or words, e.g. thermal", id="filter")
        yield DataTable(id="events", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_column("time", width=8)
        table.add_column("#", width=5)
        table.add_column("kind", width=18)
        table.add_column("reason")
        self._shown: tuple[Any, ...] | None = None
        self._seen_added = -1
        self._filter: list[str] = []
        # The table, not the filter, takes focus: single-key bindings must keep working.
        table.focus()

    def action_focus_filter(self) -> None:
        """Start typing a filter."""
        self.query_one("#filter", Input).focus()

    def action_focus_table(self) -> None:
        """Leave the filter; keys drive the app again."""
        self.query_one(DataTable).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_focus_table()

    def on_input_changed(self, event: Input.Changed) -> None:
        self._filter = event.value.lower().split()
        self._shown = None  # redraw everything under the new filter
        self._seen_added = -1
        self.show(self.tui.model)

    def show(self, model: Model) -> None:
        if model.events_added == self._seen_added:
            return  # no event arrived since the last draw: skip even the filtering
        self._seen_added = model.events_added
        events = [e for e in model.events if matches(e, self._filter)][-ROWS_SHOWN:]
        # The count alone stops moving once ROWS_SHOWN events match: key on the newest too.
        shown = (len(events), _key(events[-1]) if events else None)
        if shown == self._shown:
            return  # nothing new: leave the table (and the cursor) alone
        table = self.query_one(DataTable)
        table.clear()
        for e in events:
            table.add_row(
                fmt.clock(e.get("ts_s")),
                str(e.get("seq", "")),
                str(e.get("kind", "")),
                str(e.get("reason", "")),
            )
        self._shown = shown
        if events:
            table.move_cursor(row=len(events) - 1)
