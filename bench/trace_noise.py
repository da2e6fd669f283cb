"""How far one seed of the trace bench moves the controller's ratio to the oracle: what a
3-seed cell can tell apart, from the stored runs.

Per stored run (a file's trace) with a static sweep: each seed's ln(controller good / the
best static arm's good), that seed's own oracle run. Each run's mean is taken out (a run has
its own code and its own day), and what is left is pooled over the runs: the seed-to-seed
standard deviation of the log ratio. From it, the 95 % interval of a cell's mean ratio over
--seeds seeds (2 sd / sqrt(seeds), as a factor), and the seeds a cell would need for an
interval of +-5 %.

Like every reader of the stored runs, it reads only files whose runs each had prompts of
their own (bench/trace_files.py); --with-shared-cache reads the others too.

    .venv/bin/python bench/trace_noise.py 'docs/bench-goodput-traces-*.json' [--seeds 3] \
        [--markdown docs/benchmarks.md --section trace_noise]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.goodput_trace import TraceRun, best_static_seed0  # noqa: E402
from bench.report import publish_doc  # noqa: E402
from bench.trace_ceiling import runs_of  # noqa: E402
from bench.trace_files import add_shared_cache_flag, load  # noqa: E402

RESOLUTION = 1.05  # the interval a cell would need to tell 1.0x from 1.1x apart with room


@dataclass(frozen=True)
class Noise:
    trace: str
    runs: int
    seeds: int
    sd_log: float  # seed-to-seed sd of ln(controller / oracle), runs' means taken out

    def interval(self, seeds: int) -> float:
        """The 95 % half-width of a mean over `seeds` seeds, as a factor (1.2: x/÷ 1.2)."""
        return math.exp(2 * self.sd_log / math.sqrt(seeds))

    def seeds_for(self, factor: float = RESOLUTION) -> int:
        """Seeds a cell needs for a 95 % half-width of `factor`."""
        return math.ceil((2 * self.sd_log / math.log(factor)) ** 2)


def seed_pairs(
    runs: Sequence[TraceRun], arm: str = "controller", against: str | None = None
) -> list[tuple[int, int]]:
    """Per seed with both arms: (the arm's good, the base arm's good). The base is `against`
    where named, else the oracle (seed 0's best static limit; none without a sweep)."""
    if against is None:
        if not any(r.arm.startswith("static:") and r.seed == 0 for r in runs):
            return []
        against = best_static_seed0(runs).arm
    out = []
    for ctl in (r for r in runs if r.arm == arm):
        base = next((r for r in runs if r.arm == against and r.seed == ctl.seed), None)
        if base is not None:
            out.append((ctl.good, base.good))
    return out


def log_ratios(runs: Sequence[TraceRun], arm: str = "controller") -> list[float]:
    """Per seed: ln(the arm's good over the oracle's good on that seed); a seed where either
    made no good request has no log ratio and is left out."""
    return [math.log(a / b) for a, b in seed_pairs(runs, arm) if a > 0 and b > 0]


def pooled(docs: Iterable[dict[str, Any]]) -> list[Noise]:
    per: dict[str, tuple[int, int, float, int]] = {}  # runs, seeds, sum of squares, dof
    for doc in docs:
        for trace, runs in runs_of(doc).items():
            xs = log_ratios(runs)
            if len(xs) < 2:
                continue
            mean = sum(xs) / len(xs)
            n_runs, n_seeds, ss, dof = per.get(trace, (0, 0, 0.0, 0))
            ss += sum((x - mean) ** 2 for x in xs)
            per[trace] = (n_runs + 1, n_seeds + len(xs), ss, dof + len(xs) - 1)
    return [
        Noise(trace, runs, seeds, math.sqrt(ss / dof))
        for trace, (runs, seeds, ss, dof) in sorted(per.items())
        if dof > 0
    ]


def render(rows: Sequence[Noise], seeds: int, command: str) -> str:
    lines = [
        "## How far one seed moves the controller's ratio to the oracle (issue 15)",
        "",
        f"From `{command}`: per stored run with a static sweep, each seed's ln(controller "
        "good / the best static arm's good on that seed); each run's mean taken out, the rest "
        "pooled over the runs. The interval is the 95 % half-width of a cell's mean ratio "
        f"over {seeds} seeds, as a factor; the last column, the seeds a cell would need for "
        f"+-{(RESOLUTION - 1) * 100:.0f} %.",
        "",
        f"| trace | runs | seeds | seed-to-seed sd of ln ratio | {seeds}-seed interval | "
        f"seeds for +-{(RESOLUTION - 1) * 100:.0f} % |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.trace} | {r.runs} | {r.seeds} | {r.sd_log:.2f} | "
            f"x/÷ {r.interval(seeds):.2f} | {r.seeds_for()} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("patterns", nargs="+", help="stored --json-out files (globs expand here)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per cell (default 3)")
    add_shared_cache_flag(p)
    p.add_argument("--markdown")
    p.add_argument("--section", default="trace_noise")
    args = p.parse_args(argv)
    if args.seeds < 1:
        raise SystemExit(f"seeds: must be >= 1, got {args.seeds}")
    stored = load(args.patterns, args.with_shared_cache)
    rows = pooled(stored.docs)
    if not rows:
        raise stored.none_read("no run with a static sweep and two controller seeds in them")
    names = " ".join(f"'{pat}'" for pat in args.patterns)
    command = f"python bench/trace_noise.py {names} --seeds {args.seeds}{stored.flag}"
    doc = {"command": command, "notes": stored.notes(), "rows": [r.__dict__ for r in rows]}
    text = render(rows, args.seeds, command) + stored.markdown_notes()
    publish_doc(text, doc, args.markdown, args.section, None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
