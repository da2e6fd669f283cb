"""`appliance tui`: the Textual operator console (it talks to the daemon over HTTP only).

Where the daemon listens and where its admin token lives come from the daemon's own config
(the same search order: --config, $APPLIANCE_CONFIG, /etc/appliance/config.yaml,
./config.yaml), so on a systemd install (state in /var/lib/appliance) the console finds
both with no flags. --url, --token-file and $APPLIANCE_ADMIN_TOKEN still win.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    """Add `tui [--config PATH] [--url URL] [--token-file PATH] [--refresh S]`."""
    from tui.cli import add_arguments

    p = sub.add_parser(
        "tui",
        help="the operator console (Textual)",
        description="Monitor and steer the running daemon through its admin API.",
    )
    p.add_argument("--config", help="the daemon's config (default: the daemon's search order)")
    add_arguments(p)
    p.set_defaults(func=run)


def daemon_address(args: argparse.Namespace) -> tuple[str, str | None]:
    """(URL, token file) for the console: the flags, else what the daemon's config says."""
    from appliance.config import find_config_path, load_config

    url = args.url or os.environ.get("APPLIANCE_URL")
    token_file = args.token_file
    if url and (token_file or os.environ.get("APPLIANCE_ADMIN_TOKEN")):
        return url, token_file
    cfg = load_config(find_config_path(args.config))
    if not url:
        # A daemon bound to every address still answers on the loopback.
        host = "127.0.0.1" if cfg.server.host in ("0.0.0.0", "::", "") else cfg.server.host
        url = f"http://{host}:{cfg.server.port}"
    if not token_file and not os.environ.get("APPLIANCE_ADMIN_TOKEN"):
        token_file = str(Path(cfg.state_dir) / cfg.server.admin_token_file)
    return url, token_file


def run(args: argparse.Namespace) -> int:
    """Run the console until the operator quits."""
    from tui.cli import run as run_tui

    args.url, args.token_file = daemon_address(args)
    return run_tui(args)
