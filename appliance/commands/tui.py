"""`appliance tui`: the Textual operator console (it talks to the daemon over HTTP only).

The daemon's URL and admin token come from the daemon's own config, found in the daemon's
search order, so a systemd install needs no flags; --url, --token-file and the environment
still win (appliance.client.find_daemon).
"""

from __future__ import annotations

from typing import Any

from appliance.commands._subparsers import add_command
from tui.cli import add_arguments, run


def register(sub: Any) -> None:
    """Add `tui [--config PATH] [--url URL] [--token-file PATH] [--refresh S]`."""
    add_command(
        sub,
        "tui",
        run,
        add_arguments,
        help="the operator console (Textual)",
        description="Monitor and steer the running daemon through its admin API.",
    )
