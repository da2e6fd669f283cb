"""`appliance usage`: requests and tokens per API key, through the running daemon."""

from __future__ import annotations

import argparse
import json
from typing import Any

from appliance.client import SyncAdminClient, add_daemon_arguments
from appliance.commands._admin import run_against_daemon
from appliance.commands._subparsers import add_command


def register(sub: Any) -> None:
    """Add `usage [--from DAY] [--to DAY] [--json]`."""
    p = add_command(
        sub, "usage", run_usage, add_daemon_arguments, help="requests and tokens per API key"
    )
    p.add_argument(
        "--from", dest="from_day", help="first UTC day, YYYY-MM-DD (default: 6 days ago)"
    )
    p.add_argument("--to", dest="to_day", help="last UTC day, YYYY-MM-DD (default: today)")
    p.add_argument("--json", action="store_true")


def run_usage(args: argparse.Namespace) -> int:
    """Print one line per key: requests, answered, refused by status, tokens."""

    def show(client: SyncAdminClient) -> int:
        doc = client.run(lambda c: c.usage(args.from_day, args.to_day))
        if args.json:
            print(json.dumps(doc, indent=2))
            return 0
        print(f"usage {doc['from']} .. {doc['to']} (UTC)")
        if not doc["keys"]:
            print("no requests in this span")
            return 0
        head = ("key", "requests", "answered", "prompt tok", "output tok")
        print(f"{head[0]:<20} {head[1]:>9} {head[2]:>9} {head[3]:>11} {head[4]:>11}  other")
        for k in doc["keys"]:
            other = ", ".join(
                f"{status} {n}"
                for status, n in sorted(k["by_status"].items())
                if status not in ("ok", "deadline")
            )
            print(
                f"{k['key']:<20} {k['requests']:>9} {k['answered']:>9} "
                f"{k['prompt_tokens']:>11} {k['completion_tokens']:>11}  {other or '-'}"
            )
        return 0

    return run_against_daemon(args, show)
