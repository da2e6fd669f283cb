"""Arguments and start-up of the console, shared by `appliance tui` and `python -m tui`."""

from __future__ import annotations

import argparse
import sys

from appliance.client import AdminClient, add_daemon_arguments, address_from_args
from appliance.errors import ConfigError

# The console polls every few seconds: a daemon slower than this to answer shows as down.
CALL_TIMEOUT_S = 5.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """--config, --url, --token-file (how to find the daemon) and --refresh."""
    add_daemon_arguments(p)
    p.add_argument("--refresh", type=float, default=2.0, help="seconds between polls (2)")


def run(args: argparse.Namespace) -> int:
    """Start the console; 0 on a normal quit, 2 on a bad --refresh or a bad config."""
    from tui.app import build_app

    if args.refresh <= 0:
        print(f"--refresh: must be > 0, got {args.refresh}", file=sys.stderr)
        return 2
    try:
        address = address_from_args(args)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    client = AdminClient.at(address, timeout_s=CALL_TIMEOUT_S)
    result = build_app(client, refresh_s=args.refresh).run()
    return int(result or 0)
