"""How a command module adds its sub-command: one parser, its options, the function it runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def add_group(sub: Any, name: str, help: str) -> Any:
    """`appliance NAME ACTION ...`: the parser NAME, whose action is required; the actions are
    added to what this returns. args.NAME_command says which one ran."""
    group = sub.add_parser(name, help=help)
    return group.add_subparsers(dest=f"{name}_command", required=True)


def add_command(
    sub: Any,
    name: str,
    run: Callable[[argparse.Namespace], int],
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    **parser_kw: Any,
) -> argparse.ArgumentParser:
    """The parser `name` that runs run(args), with the options add_arguments adds (the daemon
    flags, or a module's own set); returned so the caller can add more."""
    p: argparse.ArgumentParser = sub.add_parser(name, **parser_kw)
    if add_arguments is not None:
        add_arguments(p)
    p.set_defaults(func=run)
    return p
