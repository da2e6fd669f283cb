"""The `appliance` command."""

from __future__ import annotations

import argparse
import sys

from appliance.commands import (
    audit,
    bench,
    config_check,
    estimate,
    install_service,
    jobs,
    keys,
    logs,
    model,
    precheck,
    serve,
    status,
    thresholds,
    tui,
    usage,
)
from appliance.commands._config import CONFIG_ERROR_EXIT
from appliance.errors import ConfigError

# Every sub-command, in the order `appliance --help` lists them; each module adds itself with
# register(sub), and one missing is an ImportError here, never a command silently gone.
COMMANDS = (
    serve,
    status,
    tui,
    config_check,
    model,
    jobs,
    thresholds,
    precheck,
    estimate,
    bench,
    install_service,
    logs,
    keys,
    usage,
    audit,
)


def build_parser() -> argparse.ArgumentParser:
    """The parser with every sub-command registered."""
    parser = argparse.ArgumentParser(prog="appliance", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return CONFIG_ERROR_EXIT


if __name__ == "__main__":
    sys.exit(main())
