"""Which heavy libraries an import pulls in, asked of a fresh interpreter (this one has
imported everything the suite uses already)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def loaded_after_import(modules: Iterable[str], candidates: Iterable[str]) -> list[str]:
    """The `candidates` found in sys.modules after a new Python imports `modules`."""
    code = f"import sys, {', '.join(modules)}\n"
    code += f"print(','.join(sorted(m for m in {tuple(candidates)!r} if m in sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return [m for m in out.stdout.strip().split(",") if m]
