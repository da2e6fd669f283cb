"""`appliance thresholds list|rollback`: the recalibrated alert and derating thresholds."""

from __future__ import annotations

import argparse
import json
from typing import Any

from appliance.client import SyncAdminClient, add_daemon_arguments
from appliance.commands._admin import run_against_daemon
from appliance.commands._subparsers import add_command, add_group


def register(sub: Any) -> None:
    """Add `thresholds list [--json]` and `thresholds rollback`."""
    th_sub = add_group(sub, "thresholds", "recalibrated alert and derating thresholds")
    p = add_command(
        th_sub, "list", run_list, add_daemon_arguments, help="the set in force and the earlier ones"
    )
    p.add_argument("--json", action="store_true")
    add_command(
        th_sub,
        "rollback",
        run_rollback,
        add_daemon_arguments,
        help="go back to the set before the one in force",
    )


def run_list(args: argparse.Namespace) -> int:
    """Print the set in force, the earlier sets and where the alert rules are."""

    def show(client: SyncAdminClient) -> int:
        doc = client.run(lambda c: c.thresholds())
        if args.json:
            print(json.dumps(doc, indent=2))
            return 0
        active = doc["active"]
        print(f"in force (from {active['source']}, set {active['id'] or '-'}):")
        for key, value in active["data"].items():
            print(f"  {key:<22} {value}")
        earlier = ", ".join(str(t["id"]) for t in doc["previous"]) or "none"
        print(f"earlier sets (rollback targets, newest first): {earlier}")
        print(f"alert rules: {doc['rules_path']}")
        return 0

    return run_against_daemon(args, show)


def run_rollback(args: argparse.Namespace) -> int:
    """Go back to the previous set; print what the daemon did."""

    def roll_back(client: SyncAdminClient) -> int:
        print(json.dumps(client.run(lambda c: c.rollback_thresholds()), indent=2))
        return 0

    return run_against_daemon(args, roll_back)
