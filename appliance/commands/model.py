"""`appliance model prepare`: convert the default model once (both make targets run it)."""

from __future__ import annotations

import argparse
from typing import Any

from appliance.commands._config import load_for
from appliance.config import resolve_model_dir


def register(sub: Any) -> None:
    """Add `model prepare [--config PATH] [--force]`."""
    model_p = sub.add_parser("model", help="model tools")
    model_sub = model_p.add_subparsers(dest="model_command", required=True)
    p = model_sub.add_parser("prepare", help="convert the default model once (idempotent)")
    p.add_argument("--config")
    p.add_argument("--force", action="store_true")
    p.set_defaults(func=run)


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
