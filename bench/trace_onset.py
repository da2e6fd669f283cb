"""Where the controller stood when a trace's load changed, against what it lost to the oracle.

For every stored run of the trace bench with a static sweep, per seed and per change of
segment (the hot room's start, the documents' arrival, ...): the highest limit the controller
ran in the last --before-s before the change, over the limit of the best static arm (seed 0's
best, the oracle), and that seed's good requests against the oracle's: over the whole run,
in the segment before the change (whose requests are still running when it comes) and in the
segment after. Grouped by how far above the oracle's limit the controller stood.

A limit that rides the TPOT SLO's edge serves as much as a lower one on a steady load, and
leaves no room when the box slows or the prompts grow: the requests running then finish late.
This reads the stored runs for how much that costs, trace by trace.

Like every reader of the stored runs, it reads only files whose runs each had prompts of
their own (bench/trace_files.py); --with-shared-cache reads the others too.

    .venv/bin/python bench/trace_onset.py 'docs/bench-goodput-traces-*.json' [--before-s 10] \
        [--markdown docs/benchmarks.md --section trace_onset]

Segment boundaries come from the trace definitions in bench/traces/ as they are now; a stored
run whose phase count differs from its trace's segments is left out.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.goodput_trace import TraceRun, best_static_seed0, load_trace  # noqa: E402
from bench.report import publish_doc  # noqa: E402
from bench.trace_ceiling import runs_of  # noqa: E402
from bench.trace_files import add_shared_cache_flag, load  # noqa: E402

# How far above the oracle's limit the controller stood at a change: the groups' upper bounds.
BANDS: tuple[tuple[str, float], ...] = (
    ("at or under the oracle's", 1.0),
    ("up to 1.3x the oracle's", 1.3),
    ("over 1.3x the oracle's", float("inf")),
)


@dataclass(frozen=True)
class Onset:
    """One seed of one controller run at one change of segment."""

    trace: str
    boundary: int  # the change from segment `boundary` to `boundary + 1`
    limit: int  # the controller's highest limit in the span before the change
    oracle_limit: int
    run_ratio: float  # the seed's good requests over the oracle's, the whole run
    before_diff: int  # good requests, controller minus oracle, in the segment before
    after_diff: int  # the same in the segment after


@dataclass(frozen=True)
class Row:
    trace: str
    boundary: int
    at_s: float
    band: str
    seeds: int
    run_ratio_median: float
    before_diff_median: float
    after_diff_median: float


def boundaries_s(durations_s: Sequence[float]) -> list[float]:
    """When each segment after the first begins, in seconds from the trace's start."""
    out, at = [], 0.0
    for d in durations_s[:-1]:
        at += d
        out.append(at)
    return out


def limit_before(timeline: Iterable[dict[str, Any]], at_s: float, before_s: float) -> int | None:
    """The highest limit the timeline shows in [at_s - before_s, at_s); None without one."""
    limits = [
        int(s["limit"])
        for s in timeline
        if "limit" in s and at_s - before_s <= float(s["t_s"]) < at_s
    ]
    return max(limits) if limits else None


def onsets(runs: Sequence[TraceRun], durations_s: Sequence[float], before_s: float) -> list[Onset]:
    """Every controller seed's stand at every change of segment, against the oracle."""
    if not any(r.arm.startswith("static:") and r.seed == 0 for r in runs):
        return []
    oracle = best_static_seed0(runs)
    oracle_limit = int(oracle.arm.split(":")[1])
    segments = len(durations_s)
    found = []
    for ctl in (r for r in runs if r.arm.startswith("controller")):
        static = next((r for r in runs if r.arm == oracle.arm and r.seed == ctl.seed), None)
        if static is None or static.good <= 0:
            continue
        if len(ctl.phases) != segments or len(static.phases) != segments:
            continue
        for i, at_s in enumerate(boundaries_s(durations_s)):
            limit = limit_before(ctl.timeline, at_s, before_s)
            if limit is None:
                continue
            found.append(
                Onset(
                    trace=ctl.trace,
                    boundary=i,
                    limit=limit,
                    oracle_limit=oracle_limit,
                    run_ratio=ctl.good / static.good,
                    before_diff=ctl.phases[i].good - static.phases[i].good,
                    after_diff=ctl.phases[i + 1].good - static.phases[i + 1].good,
                )
            )
    return found


def band_of(limit: int, oracle_limit: int) -> str:
    ratio = limit / oracle_limit
    return next(name for name, upper in BANDS if ratio <= upper)


def rows(found: Sequence[Onset], starts: dict[str, list[float]]) -> list[Row]:
    groups: dict[tuple[str, int, str], list[Onset]] = {}
    for o in found:
        groups.setdefault((o.trace, o.boundary, band_of(o.limit, o.oracle_limit)), []).append(o)
    order = {name: i for i, (name, _) in enumerate(BANDS)}
    out = []
    for (trace, boundary, band), group in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][1], order[kv[0][2]])
    ):
        out.append(
            Row(
                trace=trace,
                boundary=boundary,
                at_s=starts[trace][boundary],
                band=band,
                seeds=len(group),
                run_ratio_median=statistics.median(o.run_ratio for o in group),
                before_diff_median=statistics.median(o.before_diff for o in group),
                after_diff_median=statistics.median(o.after_diff for o in group),
            )
        )
    return out


def collect(
    docs: Iterable[dict[str, Any]], durations: dict[str, list[float]], before_s: float
) -> list[Onset]:
    found: list[Onset] = []
    for doc in docs:
        for trace, runs in runs_of(doc).items():
            if trace in durations:
                found += onsets(runs, durations[trace], before_s)
    return found


def render(table: Sequence[Row], before_s: float, command: str) -> str:
    lines = [
        "## Where the controller stood when the load changed (issue 15)",
        "",
        f"From `{command}`: per seed of every stored run with a static sweep, the highest "
        f"limit the controller ran in the {before_s:g} s before each change of segment, over "
        "the best static limit's (the oracle, seed 0's best), and that seed's good requests "
        "against the oracle's: the whole run's ratio, and the difference in the segment "
        "before the change (its requests still run when the change comes) and after. "
        "Medians over the seeds in each group.",
        "",
        "| trace | change at | controller's limit | seeds | run ctl/oracle | "
        "segment before, ctl - oracle | segment after, ctl - oracle |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in table:
        lines.append(
            f"| {r.trace} | {r.at_s:g} s | {r.band} | {r.seeds} | {r.run_ratio_median:.2f}x | "
            f"{r.before_diff_median:+g} | {r.after_diff_median:+g} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("patterns", nargs="+", help="stored --json-out files (globs expand here)")
    p.add_argument("--before-s", type=float, default=10.0)
    add_shared_cache_flag(p)
    p.add_argument("--markdown")
    p.add_argument("--section", default="trace_onset")
    args = p.parse_args(argv)
    if not args.before_s > 0:
        raise SystemExit(f"before-s: must be > 0, got {args.before_s}")
    stored = load(args.patterns, args.with_shared_cache)
    docs = stored.docs
    names = {r.get("trace") for doc in docs for r in doc.get("runs") or ()}
    durations = {}
    for name in sorted(n for n in names if n):
        try:
            trace = load_trace(name)
        except (OSError, ValueError):
            continue  # a trace no longer shipped: its runs are left out
        durations[name] = [s.duration_s for s in trace.segments]
    found = collect(docs, durations, args.before_s)
    if not found:
        raise stored.none_read("no controller run with a static sweep and a timeline in them")
    starts = {t: boundaries_s(d) for t, d in durations.items()}
    table = rows(found, starts)
    names_arg = " ".join(f"'{pat}'" for pat in args.patterns)
    command = f"python bench/trace_onset.py {names_arg} --before-s {args.before_s:g}{stored.flag}"
    doc = {"command": command, "notes": stored.notes(), "rows": [r.__dict__ for r in table]}
    text = render(table, args.before_s, command) + stored.markdown_notes()
    publish_doc(text, doc, args.markdown, args.section, None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
