"""One controller's ratio to the oracle, pooled over every stored run of it: where a 3-seed
cell cannot tell 1.1x from 1.0x (bench/trace_noise.py), several runs of the same code can.

Name the files of one controller's code (the runs' sections say which commit each ran). Per
run (a file's trace) with a static sweep, each seed's ln(the arm's good / the best static
arm's good on that seed), the oracle being the run's own (seed 0's best static limit). A
run is a day and a box's speed: the runs are the units. The pooled ratio is exp(the mean of
the runs' means), and its 95 % interval is the runs' spread (a t interval over the run
means, n_runs - 1 degrees of freedom), which carries both the seeds' noise and the days'.
Against the issue's target for the trace (--target-changing, --target-steady) the verdict
is "met" where the whole interval is at or over it, "missed" where it is all under, and
"open" where the interval holds it.

Only files whose every run recorded its prefix-cache hit ratio are pooled: those ran each
run on prompts of its own (goodput.run_tag; bench/trace_files.py says why).
--with-shared-cache pools the others too.

--against ARM sets each seed against that arm of the same run instead of the oracle (the
issue's "1.5x unbounded": --against unbounded --target-changing 1.5). Unbounded admission
can make no good request at all. Such a seed's ratio is unbounded: it is in no run's mean
and not in the interval, which is then over the seeds where the base made some (leaving
out seeds wholly in the arm's favour can only understate it, so a "met" holds; a "missed"
cannot be read from them and stays "open"). A run with only such seeds shows as infinite,
and the section says how many seeds that was. Where the base made none in every seed (and
the arm some in each), no interval is shown, and from two runs on the verdict is met.

    .venv/bin/python bench/trace_pooled.py docs/bench-goodput-traces-medgap-*.json ... \
        [--arm controller] [--markdown docs/benchmarks.md --section trace_pooled]
"""

from __future__ import annotations

import argparse
import math
import shlex
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.report import publish_doc  # noqa: E402
from bench.trace_ceiling import runs_of  # noqa: E402
from bench.trace_files import add_shared_cache_flag, load, shown  # noqa: E402
from bench.trace_noise import seed_pairs  # noqa: E402

# Two-sided 95 % quantiles of Student's t by degrees of freedom (1-30); 2.0 past 30.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(dof: int) -> float:
    if dof < 1:
        raise ValueError(f"dof: must be >= 1, got {dof}")
    return _T975[dof - 1] if dof <= len(_T975) else 2.0


@dataclass(frozen=True)
class Pooled:
    """One trace: each run's mean log ratio (oldest first), pooled."""

    trace: str
    seeds: int
    # Per run, the mean over its seeds where the base made some; None where it made none in
    # every seed of that run (each of its ratios unbounded).
    run_means: tuple[float | None, ...]
    target: float
    unscored: int = 0  # seeds where the arm made no good request: no log ratio
    base_zero: int = 0  # seeds where only the base made none: unbounded, in no mean

    @property
    def finite_means(self) -> tuple[float, ...]:
        return tuple(m for m in self.run_means if m is not None)

    @property
    def ratio(self) -> float:
        finite = self.finite_means
        return math.exp(statistics.fmean(finite)) if finite else math.inf

    @property
    def base_never_good(self) -> bool:
        """The base made no good request in any seed, and the arm made some in every one:
        each seed's ratio is unbounded, so no run has a finite mean to spread."""
        return self.seeds > 0 and self.base_zero == self.seeds and self.unscored == 0

    @property
    def interval(self) -> tuple[float, float] | None:
        """95 % interval of the pooled ratio over the runs where the base made some good
        requests; None from fewer than two of them (no day-to-day spread). Seeds where the
        base made none are left out rather than counted as one: the arm's own count would
        then stand in for a ratio, and its day-to-day swing (86 good one day, 216 the next)
        would widen the interval to nothing."""
        finite = self.finite_means
        n = len(finite)
        if n < 2:
            return None
        half = t975(n - 1) * statistics.stdev(finite) / math.sqrt(n)
        mean = statistics.fmean(finite)
        return math.exp(mean - half), math.exp(mean + half)

    @property
    def verdict(self) -> str:
        # Even an unbounded ratio needs a second day to agree before it is a verdict.
        if self.base_never_good and len(self.run_means) >= 2:
            return "met (base made no good request in any seed)"
        span = self.interval
        if span is None:
            if len(self.run_means) < 2:
                return "one run"
            made_some, runs = len(self.finite_means), len(self.run_means)
            return f"{made_some} of {runs} runs where the base made some"
        low, high = span
        if low >= self.target:
            return "met"
        # Seeds left out for an unbounded ratio were the arm's best: no "missed" without them.
        if high < self.target and not self.base_zero:
            return "missed"
        return "open"


def target_for(trace: str, changing: float, steady: float) -> float:
    """The issue's target: steady loads stay even, loads that change shape win."""
    return steady if trace.startswith("steady") else changing


def pool(
    docs: Iterable[dict[str, Any]],
    arm: str,
    changing: float,
    steady: float,
    against: str | None = None,
) -> list[Pooled]:
    """Per trace, the arm's runs against `against` (None: each run's oracle)."""
    per: dict[str, list[tuple[float, float | None, int]]] = {}
    unscored: dict[str, int] = {}
    base_zero: dict[str, int] = {}
    for doc in docs:
        when = float(doc.get("measured_at_unix_s") or 0.0)
        for trace, runs in runs_of(doc).items():
            both = seed_pairs(runs, arm, against)
            pairs = [(a, b) for a, b in both if a > 0]
            # A base that made no good request (unbounded admission drowning in its own
            # queue) gives no finite ratio: that seed is in no mean (Pooled.interval).
            xs = [math.log(a / b) for a, b in pairs if b > 0]
            base_zero[trace] = base_zero.get(trace, 0) + len(pairs) - len(xs)
            unscored[trace] = unscored.get(trace, 0) + len(both) - len(pairs)
            if pairs:
                mean = statistics.fmean(xs) if xs else None
                per.setdefault(trace, []).append((when, mean, len(pairs)))
    out = []
    for trace, found in sorted(per.items()):
        found.sort(key=lambda item: item[0])
        means = tuple(mean for _, mean, _ in found)
        seeds = sum(n for _, _, n in found)
        target = target_for(trace, changing, steady)
        out.append(Pooled(trace, seeds, means, target, unscored[trace], base_zero[trace]))
    return out


def _span(p: Pooled) -> str:
    span = p.interval
    return "-" if span is None else f"{span[0]:.2f}-{span[1]:.2f}x"


def _times(ratio: float) -> str:
    return "∞" if math.isinf(ratio) else f"{ratio:.2f}"


def render(
    rows: Sequence[Pooled],
    arm: str,
    command: str,
    notes: Sequence[str] = (),
    against: str | None = None,
) -> str:
    base = "the oracle" if against is None else f"`{against}`"
    per_seed = (
        "per run with a static sweep, each seed's good requests over the run's best static "
        "limit's on that seed (its oracle)"
        if against is None
        else f"per run, each seed's good requests over the `{against}` arm's on that seed"
    )
    lines = [
        f"## `{arm}` against {base}, pooled over its stored runs (issue 15)",
        "",
        f"From `{command}`: {per_seed}; per run the geometric mean "
        "over its seeds; pooled, the geometric mean of the runs, with a 95 % t interval over "
        "the runs (each run a day and a box's speed). Verdict against the issue's target: "
        "met where the interval is all at or over it, missed where all under, open where it "
        "holds the target.",
        "",
        "| trace | runs | seeds | each run, oldest first | pooled | 95 % interval | target "
        "| verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in rows:
        each = ", ".join(_times(math.inf if m is None else math.exp(m)) for m in p.run_means)
        lines.append(
            f"| {p.trace} | {len(p.run_means)} | {p.seeds} | {each} | {_times(p.ratio)}x | "
            f"{_span(p)} | {p.target:g}x | {p.verdict} |"
        )
    if notes:
        lines += ["", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("patterns", nargs="+", help="stored --json-out files of one controller code")
    p.add_argument("--arm", default="controller", help="the arm to pool (default controller)")
    p.add_argument(
        "--against",
        help="the arm each seed's ratio is over (e.g. unbounded; default each run's oracle)",
    )
    p.add_argument("--target-changing", type=float, default=1.1)
    p.add_argument("--target-steady", type=float, default=0.97)
    add_shared_cache_flag(p)
    p.add_argument("--markdown")
    p.add_argument("--section", default="trace_pooled")
    args = p.parse_args(argv)
    for name in ("target_changing", "target_steady"):
        if not getattr(args, name) > 0:
            raise SystemExit(f"{name.replace('_', '-')}: must be > 0, got {getattr(args, name)}")
    stored = load(args.patterns, args.with_shared_cache)
    rows = pool(stored.docs, args.arm, args.target_changing, args.target_steady, args.against)
    if not rows:
        base = "a static sweep" if args.against is None else f"an {args.against!r} arm"
        raise stored.none_read(f"no run with {base} and a {args.arm!r} arm in them")
    names = " ".join(shlex.quote(shown(f)) for f in stored.named)
    command = (
        f"python bench/trace_pooled.py {names} --arm {shlex.quote(args.arm)} "
        + ("" if args.against is None else f"--against {shlex.quote(args.against)} ")
        + f"--target-changing {args.target_changing:g} --target-steady {args.target_steady:g}"
        + stored.flag
    )
    notes = stored.notes()
    if base_zero := [f"{r.trace} {r.base_zero} of {r.seeds}" for r in rows if r.base_zero]:
        notes.insert(
            0,
            "Seeds where the base arm made no good request, each ratio unbounded (in no run's "
            "mean; a run of only such seeds shows ∞, and the interval is over the runs where "
            "the base made some): " + ", ".join(base_zero) + ". Where that is every seed, no "
            "interval, and met from two runs on",
        )
    if unscored := [f"{r.trace} {r.unscored}" for r in rows if r.unscored]:
        notes.insert(
            0, f"Seeds left out where `{args.arm}` made no good request: " + ", ".join(unscored)
        )
    doc = {
        "command": command,
        "notes": notes,
        "rows": [
            {**r.__dict__, "ratio": r.ratio, "interval": r.interval, "verdict": r.verdict}
            for r in rows
        ],
    }
    text = render(rows, args.arm, command, notes, args.against)
    publish_doc(text, doc, args.markdown, args.section, None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
