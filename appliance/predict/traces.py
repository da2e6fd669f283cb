"""Load traces on disk: metric-history rows as CSV (one column per key, empty = missing), so a
recorded export and a synthetic trace read the same way."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

COLUMNS: tuple[str, ...] = (
    "ts_s",
    "resolution_s",
    "gpu_util_pct",
    "mem_used_ratio",
    "core_temp_c_max",
    "queued",
    "in_flight",
    "tokens_per_s",
)


def write_rows(path: str | Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Write rows with COLUMNS (plus any other keys the rows carry, sorted)."""
    extra = sorted({k for r in rows for k in r} - set(COLUMNS))
    with Path(path).open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*COLUMNS, *extra], restval="")
        writer.writeheader()
        writer.writerows(rows)


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows as dicts of floats; empty cells and non-numbers are left out (a missing key)."""
    out: list[dict[str, Any]] = []
    with Path(path).open(newline="") as f:
        for raw in csv.DictReader(f):
            row: dict[str, Any] = {}
            for key, text in raw.items():
                if key is None or text is None or not text.strip():
                    continue
                try:
                    row[key] = float(text)
                except ValueError:
                    continue
            out.append(row)
    return out
