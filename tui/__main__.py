"""`python -m tui`: the console without going through the appliance CLI."""

from __future__ import annotations

import argparse
import sys

from tui.cli import add_arguments, run

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m tui", description="appliance operator console")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
