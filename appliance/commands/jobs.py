"""`appliance jobs list|run`: the maintenance jobs, through the running daemon."""

from __future__ import annotations

import argparse
import json
from typing import Any

from appliance.client import SyncAdminClient, add_daemon_arguments
from appliance.commands._admin import run_against_daemon
from appliance.commands._subparsers import add_command, add_group


def register(sub: Any) -> None:
    """Add `jobs list [--json]` and `jobs run NAME [--force]`."""
    jobs_sub = add_group(sub, "jobs", "maintenance jobs (through the running daemon)")
    p = add_command(
        jobs_sub, "list", run_list, add_daemon_arguments, help="jobs, next run, last outcome"
    )
    p.add_argument("--json", action="store_true")
    p = add_command(jobs_sub, "run", run_job, add_daemon_arguments, help="run a job now")
    p.add_argument("name", help="restart | benchmark | recalibrate | predictor")
    p.add_argument("--force", action="store_true", help="skip the load guard")


def run_list(args: argparse.Namespace) -> int:
    """Print the jobs: schedule, next run, last outcome."""

    def show(client: SyncAdminClient) -> int:
        jobs = client.run(lambda c: c.jobs())["jobs"]
        if args.json:
            print(json.dumps(jobs, indent=2))
            return 0
        print(f"{'job':<12} {'cron':<20} {'next run':<27} last")
        for j in jobs:
            last = j["history"][0] if j["history"] else None
            last_txt = f"{last['outcome']} ({last['trigger']})" if last else "never"
            print(f"{j['name']:<12} {j['cron']:<20} {j['next_run'] or '-':<27} {last_txt}")
        return 0

    return run_against_daemon(args, show)


def run_job(args: argparse.Namespace) -> int:
    """Start a job now; it runs in the daemon, this returns once it started."""

    def start(client: SyncAdminClient) -> int:
        out = client.run(lambda c: c.run_job(args.name, force=args.force))
        print(
            f"{out['job']}: {out['status']} ({out['trigger']}); follow it with "
            "`appliance jobs list` or the TUI"
        )
        return 0

    return run_against_daemon(args, start)
