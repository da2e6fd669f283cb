"""`appliance precheck`: the environment pre-flight report."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from appliance.commands._config import CONFIG_ERROR_EXIT
from appliance.config import find_config_path, load_config
from appliance.errors import ConfigError
from appliance.precheck import CheckResult, exit_code, render_json, render_table, run_prechecks


def register(sub: Any) -> None:
    """Add `precheck [--config PATH] [--json]` to the CLI's sub-parsers."""
    p = sub.add_parser(
        "precheck",
        help="environment pre-flight report; exit 0 when nothing fails, 1 otherwise",
        description="Check GPU, driver, CUDA, versions, disk, port, model and memory plan.",
    )
    p.add_argument("--config", help="config file (default: $APPLIANCE_CONFIG, /etc, ./)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run every check and print the report; the exit code says whether anything failed."""
    path = find_config_path(args.config)
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        results = [CheckResult("config", "fail", str(exc).replace("\n", ";"))]
        print(render_json(results) if args.json else render_table(results))
        return CONFIG_ERROR_EXIT
    results = run_prechecks(cfg, config_source=str(path) if path else None)
    print(render_json(results) if args.json else render_table(results))
    sys.stdout.flush()
    return exit_code(results)
