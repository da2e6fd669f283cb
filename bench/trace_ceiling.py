"""How far any controller could beat the best static limit in the trace bench's stored runs.

Per seed of a run, the most requests any arm served (a 200, in time or late) over the best
static limit's good ones (`goodput_trace.served_vs_static`): a controller that serves as many
as the busiest arm of that seed, every one in time, beats the oracle by that much. Where the
ceiling is under the target ratio, the box itself bounds the run, not the controller.

Like every reader of the stored runs, it reads only files whose runs each had prompts of
their own (bench/trace_files.py); --with-shared-cache reads the others too.

    .venv/bin/python bench/trace_ceiling.py 'docs/bench-goodput-traces-*.json' [--target 1.1] \
        [--markdown docs/benchmarks.md --section trace_ceiling]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.goodput_trace import (  # noqa: E402
    TraceRun,
    best_static_seed0,
    served_ratios,
    trace_run_from,
)
from bench.report import publish_doc  # noqa: E402
from bench.trace_files import add_shared_cache_flag, load  # noqa: E402


@dataclass(frozen=True)
class Ceiling:
    """One trace over the files: each seed's ceiling, and how many sit under the target."""

    trace: str
    files: int
    ceilings: tuple[float, ...]
    under_target: int


def runs_of(doc: dict[str, Any]) -> dict[str, list[TraceRun]]:
    """A stored run's TraceRuns by trace."""
    out: dict[str, list[TraceRun]] = {}
    for r in doc.get("runs") or ():
        run = trace_run_from(r)
        out.setdefault(run.trace, []).append(run)
    return out


def seed_ceilings(runs: list[TraceRun]) -> list[float]:
    """Per seed: most served by any arm over the best static limit's good (none without a
    static sweep)."""
    if not any(r.arm.startswith("static:") and r.seed == 0 for r in runs):
        return []
    return served_ratios(runs, best_static_seed0(runs).arm)


def ceilings(docs: Iterable[dict[str, Any]], target: float) -> list[Ceiling]:
    per: dict[str, tuple[int, list[float], int]] = {}
    for doc in docs:
        for trace, runs in runs_of(doc).items():
            found = seed_ceilings(runs)
            if not found:
                continue
            files, values, under = per.get(trace, (0, [], 0))
            values += found
            under += sum(1 for c in found if c < target)
            per[trace] = (files + 1, values, under)
    return [Ceiling(t, f, tuple(v), u) for t, (f, v, u) in per.items()]


def render(rows: list[Ceiling], target: float, command: str) -> str:
    lines = [
        "## How far a controller could beat the best static limit (issue 15)",
        "",
        f"From `{command}`: per seed of every stored run, the most requests any arm served (in "
        "time or late) over the best static limit's good ones. A controller serving as many "
        "as the busiest arm, every one in time, beats the oracle by this much.",
        "",
        f"| trace | runs | seeds | ceiling median [min-max] | seeds under {target:g}x |",
        "|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: r.trace):
        c = r.ceilings
        lines.append(
            f"| {r.trace} | {r.files} | {len(c)} | {statistics.median(c):.2f}x "
            f"[{min(c):.2f}-{max(c):.2f}] | {r.under_target} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("patterns", nargs="+", help="stored --json-out files (globs expand here)")
    p.add_argument("--target", type=float, default=1.1)
    add_shared_cache_flag(p)
    p.add_argument("--markdown")
    p.add_argument("--section", default="trace_ceiling")
    args = p.parse_args(argv)
    if not args.target > 0:
        raise SystemExit(f"target: must be > 0, got {args.target}")
    stored = load(args.patterns, args.with_shared_cache)
    rows = ceilings(stored.docs, args.target)
    if not rows:
        raise stored.none_read("no run with a static sweep in them")
    names = " ".join(f"'{pat}'" for pat in args.patterns)
    command = f"python bench/trace_ceiling.py {names} --target {args.target:g}{stored.flag}"
    doc = {"command": command, "notes": stored.notes(), "rows": [r.__dict__ for r in rows]}
    text = render(rows, args.target, command) + stored.markdown_notes()
    publish_doc(text, doc, args.markdown, args.section, None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
