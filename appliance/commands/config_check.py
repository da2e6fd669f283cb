"""`appliance config check PATH`: validate a config file, engine.vllm and cross-field rules too."""

from __future__ import annotations

import argparse
from typing import Any

from appliance.commands._config import load_checked
from appliance.commands._subparsers import add_command, add_group
from appliance.config import resolve_model_dir


def register(sub: Any) -> None:
    """Add `config check PATH`."""
    cfg_sub = add_group(sub, "config", "config file tools")
    p = add_command(
        cfg_sub, "check", run, help="validate a config file; exit 2 naming every bad key"
    )
    p.add_argument("path")


def run(args: argparse.Namespace) -> int:
    """0 and a one-line summary; a bad file raises ConfigError (exit 2 in the CLI)."""
    cfg = load_checked(args.path)
    print(f"{args.path}: OK (model {resolve_model_dir(cfg)}, port {cfg.server.port})")
    return 0
