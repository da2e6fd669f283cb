"""`appliance tui`: the Textual operator console (it talks to the daemon over HTTP only)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    """Add `tui [--url URL] [--token-file PATH] [--refresh S]` to the CLI's sub-parsers."""
    from tui.cli import add_arguments

    p = sub.add_parser(
        "tui",
        help="the operator console (Textual)",
        description="Monitor and steer the running daemon through its admin API.",
    )
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the console until the operator quits."""
    from tui.cli import run as run_tui

    return run_tui(args)
