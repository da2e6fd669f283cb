"""`appliance bench`: a concurrency sweep against a running daemon or any OpenAI endpoint.

Prints the table, the knee, the Pareto front and the scores; `--json` prints the report as
JSON instead, `--output` writes it to a file, `--plot` draws throughput and P99 TTFT against
concurrency with the knee marked. `bench_result(args)` returns the report object (what the
daemon's re-benchmark job stores).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.bench_runner import (
    SCENARIOS,
    BenchError,
    BenchReport,
    BenchSettings,
    Progress,
    ProgressFn,
    run_sweep,
    run_tuning,
)
from appliance.client import (
    AdminError,
    DaemonAddress,
    SyncAdminClient,
    add_daemon_arguments,
    daemon_address,
)
from appliance.commands._subparsers import add_command
from appliance.config import find_config_path, load_config
from appliance.domain.objectives import Objective
from appliance.domain.sweep_analysis import ScoreWeights, Slo
from appliance.errors import ConfigError

BAD_INPUT_EXIT = 2
DEFAULT_LEVELS = "1,2,4,8,16"
# Storing a report writes the daemon's SQLite store; give a busy daemon time.
RECORD_TIMEOUT_S = 30.0


def parse_levels(text: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4); a clear error naming --concurrency otherwise."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError("concurrency: need at least one level, e.g. 1,2,4,8")
    levels = []
    for part in parts:
        try:
            value = int(part)
        except ValueError:
            raise ValueError(f"concurrency: {part!r} is not a whole number") from None
        if value < 1:
            raise ValueError("concurrency: each level must be >= 1")
        if value in levels:
            raise ValueError(f"concurrency: level {value} appears more than once")
        levels.append(value)
    return tuple(sorted(levels))


def register(sub: Any) -> None:
    """Add `bench [--url URL] [--scenario ...] [--concurrency 1,2,4] [...]` to the CLI."""
    add_command(
        sub,
        "bench",
        run,
        add_arguments,
        help="concurrency sweep: throughput, TTFT/TPOT/E2E percentiles, knee, Pareto front",
        description="Benchmark a running daemon or any OpenAI-compatible endpoint.",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The bench options (shared by `appliance bench` and `python -m appliance.commands.bench`)."""
    # --token-file: telemetry from /admin/status, and the report stored in the daemon.
    add_daemon_arguments(p, url_help="endpoint base URL, a daemon or any OpenAI server")
    p.add_argument("--scenario", choices=SCENARIOS, default="chat")
    p.add_argument(
        "--concurrency", default=DEFAULT_LEVELS, help=f"levels (default {DEFAULT_LEVELS})"
    )
    p.add_argument(
        "--requests-per-level", type=int, help="requests per level (default max(8, 2 x level))"
    )
    p.add_argument("--max-tokens", type=int, default=64, help="output tokens per request")
    p.add_argument("--model", help="model id (default: the first of GET /v1/models)")
    p.add_argument("--api-key", help="client API key for /v1 (default $OPENAI_API_KEY)")
    p.add_argument("--slo-ttft-s", type=float, help="P99 TTFT objective for the knee (s)")
    p.add_argument("--slo-tpot-s", type=float, help="P99 TPOT objective for the knee (s)")
    p.add_argument(
        "--tune",
        action="store_true",
        help="three-phase tuning instead of --concurrency: baseline 8, then up to the knee",
    )
    p.add_argument("--max-concurrency", type=int, default=256, help="highest level --tune tries")
    p.add_argument(
        "--extend-to",
        type=int,
        help="a sweep still rising at its largest level doubles up to this level, e.g. the "
        "engine's max_num_seqs (default: measure only --concurrency)",
    )
    p.add_argument("--warmup", type=int, default=1, help="warm-up requests before measuring")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--output", help="also write the JSON report to this file")
    p.add_argument("--plot", help="write a PNG of throughput and P99 TTFT vs concurrency")
    p.add_argument(
        "--no-record",
        action="store_true",
        help="do not store the report in the daemon's database (POST /admin/benchmarks)",
    )
    p.add_argument(
        "--no-apply",
        action="store_true",
        help="with --tune: store the result but do not hand the limit to the controller",
    )
    p.add_argument(
        "--objective",
        help="hand this run on as the controller's ceiling: knee, score (bench.weights) or "
        "a level on the Pareto front (default with --tune: knee)",
    )


@dataclass(frozen=True)
class BenchPlan:
    """What the arguments ask for, checked: the settings, the SLO, the weights, the daemon."""

    settings: BenchSettings
    slo: Slo | None  # None: the daemon's own, when it says
    weights: ScoreWeights  # config.yaml's bench.weights (built-in 40/30/20/10 by default)
    daemon: DaemonAddress


def _check_numbers(args: argparse.Namespace) -> None:
    if args.requests_per_level is not None and args.requests_per_level < 1:
        raise ValueError(f"requests-per-level: must be >= 1, got {args.requests_per_level}")
    if args.max_tokens < 1:
        raise ValueError(f"max-tokens: must be >= 1, got {args.max_tokens}")
    if args.max_concurrency < 1:
        raise ValueError(f"max-concurrency: must be >= 1, got {args.max_concurrency}")
    if args.warmup < 0:
        raise ValueError(f"warmup: must be >= 0, got {args.warmup}")
    if args.objective is not None:
        Objective.parse(args.objective)  # ValueError names the option
    if args.extend_to is not None and args.extend_to < 1:
        raise ValueError(f"extend-to: must be >= 1, got {args.extend_to}")
    for name in ("slo_ttft_s", "slo_tpot_s"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise ValueError(f"{name.replace('_', '-')}: must be > 0, got {value}")


def plan_from_args(args: argparse.Namespace) -> BenchPlan:
    """The checked plan; ValueError names the bad option, ConfigError the bad config key.

    The endpoint and admin token are found as every client finds the daemon
    (appliance.client); the configured daemon's token is never sent to another endpoint.
    """
    levels = parse_levels(args.concurrency)
    _check_numbers(args)
    cfg = load_config(find_config_path(args.config))
    daemon = daemon_address(cfg, url=args.url, token_file=args.token_file)
    if args.token_file and daemon.token.value is None:
        raise ValueError(f"token-file: cannot read {args.token_file} ({daemon.token.problem})")
    slo = None
    if args.slo_ttft_s is not None or args.slo_tpot_s is not None:
        slo = Slo(ttft_p99_s=args.slo_ttft_s, tpot_p99_s=args.slo_tpot_s)
    settings = BenchSettings(
        url=daemon.url,
        scenario=args.scenario,
        concurrency=levels,
        requests_per_level=args.requests_per_level,
        max_tokens=args.max_tokens,
        model=args.model,
        api_key=args.api_key or os.environ.get("OPENAI_API_KEY") or None,
        admin_token=daemon.token.value,
        warmup_requests=args.warmup,
        extend_to=args.extend_to,
    )
    return BenchPlan(settings, slo, cfg.bench.weights.to_policy(), daemon)


def daemon_slo(daemon: DaemonAddress) -> Slo | None:
    """The SLO the daemon's controller steers by (GET /admin/status), when it says.

    None without a token, or from an endpoint that is not an appliance.
    """
    if daemon.token.value is None:
        return None
    try:
        status = SyncAdminClient.at(daemon).run(lambda c: c.status())
    except AdminError:
        return None
    ctl = status.get("controller") or {}
    ttft, tpot = ctl.get("slo_ttft_p99_s"), ctl.get("slo_tpot_p99_s")
    if ttft is None and tpot is None:
        return None
    return Slo(ttft_p99_s=ttft, tpot_p99_s=tpot)


def record(
    daemon: DaemonAddress, report: BenchReport, apply: bool, objective: str = "knee"
) -> str | None:
    """Store the report in the daemon's database; with apply, the level objective picks
    becomes the ceiling.

    What happened, as a line for the operator; None without an admin token.
    """
    if daemon.token.value is None:
        return None
    client = SyncAdminClient.at(daemon, timeout_s=RECORD_TIMEOUT_S)
    try:
        answer = client.run(lambda c: c.record_benchmark(report.to_dict(), apply, objective))
    except AdminError as exc:
        return f"not stored in the daemon's database: {exc.message}"
    text = f"stored as benchmark {answer.get('id')} in the daemon's database"
    if answer.get("applied"):
        ceiling = answer.get("ceiling")
        text += f"; the controller's ceiling is now {'none' if ceiling is None else ceiling}"
        text += f" ({answer.get('reason')})"
    elif answer.get("not_applied"):
        text += f"; not applied: {answer['not_applied']}"
    return text


class _PlainProgress:
    """One line per level on stderr: for logs, pipes and CI."""

    def __call__(self, p: Progress) -> None:
        if p.phase == "warmup" and p.done == p.total and p.total:
            print(f"warm-up: {p.total} request(s), {p.failed} failed", file=sys.stderr)
        elif p.phase == "level" and p.done == 0:
            print(
                f"level {p.level} ({p.level_index}/{p.levels_total}): {p.total} requests ...",
                file=sys.stderr,
                flush=True,
            )
        elif p.phase == "level" and p.done == p.total:
            print(f"level {p.level}: done, {p.failed} failed", file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


class _RichProgress:
    """A progress bar per level on a terminal (rich comes with textual)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        self._bar = RichProgress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        self._bar.start()
        self._tasks: dict[str, Any] = {}

    def __call__(self, p: Progress) -> None:
        key = "warmup" if p.phase == "warmup" else f"level {p.level}"
        if key not in self._tasks:
            label = "warm-up" if p.phase == "warmup" else f"concurrency {p.level:>4}"
            self._tasks[key] = self._bar.add_task(label, total=max(1, p.total))
        self._bar.update(self._tasks[key], completed=p.done)

    def close(self) -> None:
        self._bar.stop()


def _make_progress() -> _PlainProgress | _RichProgress:
    if sys.stderr.isatty():
        try:
            return _RichProgress()
        except ImportError:
            pass
    return _PlainProgress()


def bench_result(
    args: argparse.Namespace, progress: ProgressFn | None = None, plan: BenchPlan | None = None
) -> BenchReport:
    """Run what the arguments ask for and return the report (raises ValueError, BenchError).

    Without --slo-* the SLO is the one the benchmarked daemon steers by, where it says.
    """
    plan = plan or plan_from_args(args)
    slo = plan.slo if plan.slo is not None else daemon_slo(plan.daemon)
    if args.tune:
        coro = run_tuning(
            plan.settings,
            slo,
            max_concurrency=args.max_concurrency,
            max_limit=args.max_concurrency,
            weights=plan.weights,
            progress=progress,
        )
    else:
        coro = run_sweep(plan.settings, slo, weights=plan.weights, progress=progress)
    return asyncio.run(coro)


def _s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def render(report: BenchReport) -> str:
    """The report as a table plus the knee, front and scores."""
    scores = {s.concurrency: s.score for s in report.scores.scores} if report.scores else {}
    knee = report.knee.concurrency if report.knee else None
    head = (
        f"{'conc':>5} {'ok/sent':>8} {'req/s':>7} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} "
        f"{'TPOT p50':>9} {'TPOT p99':>9} {'E2E p99':>9} {'util':>5} {'J/tok':>7} {'score':>6}"
    )
    lines = [
        f"appliance bench: {report.model} at {report.url}, scenario {report.scenario}, "
        f"max_model_len {report.max_model_len or '?'}, {report.duration_s:.0f} s",
        "",
        head,
    ]
    for lv in report.levels:
        p = lv.point
        cells = [f"{lv.concurrency:>5}", f"{f'{lv.ok}/{lv.requests}':>8}"]
        if p is None:
            cells.append(f"  all failed: {lv.errors[0] if lv.errors else '?'}")
        else:
            cells += [
                f"{p.request_per_s:>7.2f}",
                f"{p.output_tok_s:>8.1f}",
                f"{_s(p.ttft_p50_s):>9}",
                f"{_s(p.ttft_p99_s):>9}",
                f"{_s(p.tpot_p50_s):>9}",
                f"{_s(p.tpot_p99_s):>9}",
                f"{_s(p.e2e_p99_s):>9}",
                f"{p.utilisation:>5.0%}" if p.utilisation is not None else f"{'-':>5}",
                f"{p.energy_j_per_token:>7.3f}"
                if p.energy_j_per_token is not None
                else f"{'-':>7}",
                f"{scores.get(lv.concurrency, 0.0):>6.3f}",
            ]
            marks = ("*" if lv.concurrency in report.pareto else "") + (
                " <- knee" if lv.concurrency == knee else ""
            )
            cells.append(marks)
        lines.append(" ".join(cells))
    lines.append("")
    if report.knee:
        lines.append(f"knee: {report.knee.concurrency} ({report.knee.reason})")
    lines.append(f"Pareto front (*): {', '.join(str(c) for c in report.pareto) or '-'}")
    if report.scores:
        w = ", ".join(f"{k} {v:.0%}" for k, v in report.scores.weights_used.items())
        dropped = f"; left out: {', '.join(report.scores.dropped)}" if report.scores.dropped else ""
        lines.append(f"best score: {report.scores.best_concurrency} (weights {w}{dropped})")
    if report.tuning:
        limit = report.tuning.recommended_limit
        lines.append(
            f"tuning: recommended limit {'none' if limit is None else limit} "
            f"({report.tuning.reason})"
        )
    lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines)


def write_plot(report: BenchReport, path: str | Path) -> None:
    """PNG: output tok/s and P99 TTFT against concurrency, the knee marked."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a server
    import matplotlib.pyplot as plt

    pts = sorted(report.points, key=lambda p: p.concurrency)
    xs = [p.concurrency for p in pts]
    fig, (ax_tok, ax_lat) = plt.subplots(2, 1, sharex=True, figsize=(7, 6), dpi=100)
    ax_tok.plot(xs, [p.output_tok_s for p in pts], "o-", color="tab:blue")
    ax_tok.set_ylabel("output tokens/s")
    ax_lat.plot(xs, [p.ttft_p99_s for p in pts], "o-", color="tab:red", label="P99 TTFT")
    ax_lat.plot(xs, [p.e2e_p99_s for p in pts], "s--", color="tab:gray", label="P99 E2E")
    ax_lat.set_ylabel("seconds")
    ax_lat.set_xlabel("concurrency")
    ax_lat.legend(loc="upper left")
    if report.slo and report.slo.ttft_p99_s:
        ax_lat.axhline(report.slo.ttft_p99_s, color="tab:red", linestyle=":", label="TTFT SLO")
    if len(xs) > 1 and xs[-1] / xs[0] >= 8:
        ax_lat.set_xscale("log", base=2)
    ax_lat.set_xticks(xs, [str(x) for x in xs])
    if report.knee:
        for ax in (ax_tok, ax_lat):
            ax.axvline(report.knee.concurrency, color="tab:green", linestyle="--")
        ax_tok.annotate(
            f"knee {report.knee.concurrency}",
            xy=(report.knee.concurrency, max(p.output_tok_s for p in pts)),
            xytext=(5, -15),
            textcoords="offset points",
            color="tab:green",
        )
    for ax in (ax_tok, ax_lat):
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"{report.model}: {report.scenario} scenario")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def _write_outputs(args: argparse.Namespace, report: BenchReport) -> int:
    if args.json:
        print(report.to_json())
    else:
        print(render(report))
    if args.output:
        Path(args.output).write_text(report.to_json() + "\n")
    if args.plot:
        try:
            write_plot(report, args.plot)
        except ImportError:
            print(
                "bench: --plot needs matplotlib (pip install 'appliance[bench]')", file=sys.stderr
            )
            return BAD_INPUT_EXIT
    return 0


def run(args: argparse.Namespace) -> int:
    """0 when the sweep ran, 1 when the endpoint failed it, 2 on bad input or a bad config."""
    progress = _make_progress()
    try:
        plan = plan_from_args(args)
        report = bench_result(args, progress, plan)
    except (ValueError, ConfigError, BenchError) as exc:
        progress.close()
        print(f"bench: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, BenchError) else BAD_INPUT_EXIT
    progress.close()
    if not args.no_record:
        apply = (args.tune or args.objective is not None) and not args.no_apply
        stored = record(plan.daemon, report, apply, args.objective or "knee")
        if stored:
            print(f"bench: {stored}", file=sys.stderr)
    return _write_outputs(args, report)


def main(argv: list[str] | None = None) -> int:
    """`python -m appliance.commands.bench ...`: the same command without the CLI around it."""
    parser = argparse.ArgumentParser(prog="appliance bench", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
