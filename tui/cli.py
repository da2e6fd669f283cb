"""Arguments and start-up of the console, shared by `appliance tui` and `python -m tui`."""

from __future__ import annotations

import argparse
import os

from tui.client import DEFAULT_URL, AdminClient, resolve_token


def add_arguments(p: argparse.ArgumentParser) -> None:
    """--url, --token-file, --refresh."""
    p.add_argument(
        "--url",
        help="daemon base URL (default $APPLIANCE_URL, then the daemon's config; "
        f"`python -m tui`: {DEFAULT_URL})",
    )
    p.add_argument(
        "--token-file",
        help="admin token file (default $APPLIANCE_ADMIN_TOKEN, then the daemon's state "
        "directory; `python -m tui`: ./state/admin.token)",
    )
    p.add_argument("--refresh", type=float, default=2.0, help="seconds between polls (2)")


def run(args: argparse.Namespace) -> int:
    """Start the console; the exit code is 0 on a normal quit."""
    from tui.app import build_app

    if args.refresh <= 0:
        print(f"--refresh: must be > 0, got {args.refresh}")
        return 2
    url = args.url or os.environ.get("APPLIANCE_URL") or DEFAULT_URL
    client = AdminClient(url, resolve_token(args.token_file))
    result = build_app(client, refresh_s=args.refresh).run()
    return int(result or 0)
