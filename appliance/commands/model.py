"""`appliance model prepare`: convert the default model once (both make targets run it)."""

from __future__ import annotations

import argparse
from typing import Any

from appliance.commands._config import load_for
from appliance.commands._subparsers import add_command, add_group
from appliance.config import resolve_model_dir


def register(sub: Any) -> None:
    """Add `model prepare [--config PATH] [--force]`."""
    model_sub = add_group(sub, "model", "model tools")
    p = add_command(model_sub, "prepare", run, help="convert the default model once (idempotent)")
    p.add_argument("--config")
    p.add_argument("--force", action="store_true")


def run(args: argparse.Namespace) -> int:
    """Convert the default model into the state directory (nothing for another model)."""
    from appliance.model_prep import prepare_default_model

    cfg = load_for(args)
    target = resolve_model_dir(cfg) if cfg.engine.model == "default" else None
    if target is None:
        print(f"engine.model is {cfg.engine.model}: nothing to prepare")
        return 0
    prepare_default_model(target, force=args.force)
    print(target)
    return 0
