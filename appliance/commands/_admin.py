"""What the commands that talk to the running daemon share: the client and its failures."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from appliance.client import AdminError, SyncAdminClient, address_from_args

# The daemon is doing something slow (a job starting, a restart asked for): give it time.
ADMIN_TIMEOUT_S = 30.0


def run_against_daemon(
    args: argparse.Namespace, call: Callable[[SyncAdminClient], int]
) -> int:
    """call(client) for the daemon the flags and its config name; 1 with the reason on failure."""
    client = SyncAdminClient.at(address_from_args(args), timeout_s=ADMIN_TIMEOUT_S)
    try:
        return call(client)
    except AdminError as exc:
        print(f"appliance {args.command}: {exc.message}", file=sys.stderr)
        return 1
