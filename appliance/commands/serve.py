"""`appliance serve`: the daemon, in the foreground; SIGTERM drains, then it exits 0."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from appliance.commands._config import CONFIG_ERROR_EXIT, load_for
from appliance.errors import EngineStartError


def register(sub: Any) -> None:
    """Add `serve [--config PATH] [--host H] [--port P]`."""
    p = sub.add_parser("serve", help="run the daemon in the foreground")
    p.add_argument("--config")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the daemon until SIGTERM; 2 for a bad config or model, 1 when the engine fails."""
    from appliance.daemon.run import BadModelConfig, run_daemon
    from appliance.json_log import setup_logging

    cfg = load_for(args)
    setup_logging(cfg.logging.level, cfg.logging.json_lines)
    try:
        return asyncio.run(run_daemon(cfg))
    except EngineStartError as exc:
        print(f"cannot start: {exc}", file=sys.stderr)
        # A bad engine.model or model config.json is a bad config (exit 2, as ConfigError).
        return CONFIG_ERROR_EXIT if isinstance(exc, BadModelConfig) else 1
