"""The key map."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

HELP = """\
[b]Screens[/]   d dashboard  e events  c controls  j jobs  b benchmarks  u usage per key
[b]Engine[/]    p pause admission   r resume   R graceful restart (asks first)
[b]Events[/]    / filter by kind or words (e.g. thermal), enter or escape to leave it
[b]Jobs[/]      enter on a job: run it now (asks first)
[b]Any[/]       g refresh now   ? this help   q quit

Live updates come from /admin/events (SSE); /admin/status is polled as well.
When the daemon is down a red banner says so and the console reconnects by itself.
The admin token: --token-file, else $APPLIANCE_ADMIN_TOKEN, else the daemon's config
(state_dir/admin.token, with the config found as `appliance serve` finds it).
"""


class HelpScreen(ModalScreen[None]):
    """Key bindings and where things come from."""

    BINDINGS: ClassVar[list[Binding]] = [
        Binding("escape,q,question_mark", "app.pop_screen", "Close")
    ]

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Static(HELP)
            yield Static("[dim]escape closes[/]")
