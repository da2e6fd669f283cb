"""`appliance bench`: a concurrency sweep against a running daemon or any OpenAI endpoint.

Prints the table, the knee, the Pareto front and the scores; `--json` prints the report as
JSON instead, `--output` writes it to a file, `--plot` draws throughput and P99 TTFT against
concurrency with the knee marked. `bench_result(args)` returns the report object (what the
daemon's re-benchmark job stores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import urllib.request
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
from appliance.domain.analysis import ScoreWeights, Slo

BAD_INPUT_EXIT = 2
DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_LEVELS = "1,2,4,8,16"


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
    p = sub.add_parser(
        "bench",
        help="concurrency sweep: throughput, TTFT/TPOT/E2E percentiles, knee, Pareto front",
        description="Benchmark a running daemon or any OpenAI-compatible endpoint.",
    )
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The bench options (shared by `appliance bench` and `python -m appliance.commands.bench`)."""
    p.add_argument(
        "--url", help=f"endpoint base URL (default: the configured daemon, {DEFAULT_URL})"
    )
    p.add_argument("--config", help="config file for the default URL and admin token")
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
    p.add_argument("--token-file", help="admin token file, for telemetry from /admin/status")
    p.add_argument("--slo-ttft-s", type=float, help="P99 TTFT objective for the knee (s)")
    p.add_argument("--slo-tpot-s", type=float, help="P99 TPOT objective for the knee (s)")
    p.add_argument(
        "--tune",
        action="store_true",
        help="three-phase tuning instead of --concurrency: baseline 8, then up to the knee",
    )
    p.add_argument("--max-concurrency", type=int, default=256, help="highest level --tune tries")
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


def _load_config(args: argparse.Namespace) -> Any:
    """The config when one can be read, else None (any endpoint works without one)."""
    try:
        from appliance.config import find_config_path, load_config

        return load_config(find_config_path(getattr(args, "config", None)))
    except Exception:  # its defaults are only a guess for another endpoint
        return None


def _config_defaults(args: argparse.Namespace) -> tuple[str | None, Path | None]:
    """(daemon URL, admin token path) from the config, when one can be read."""
    cfg = _load_config(args)
    if cfg is None:
        return None, None
    return (
        f"http://{cfg.server.host}:{cfg.server.port}",
        cfg.state_dir / cfg.server.admin_token_file,
    )


def _weights(args: argparse.Namespace) -> ScoreWeights | None:
    """The score weights of config.yaml (bench.weights), else the built-in 40/30/20/10."""
    cfg = _load_config(args)
    return None if cfg is None else cfg.bench.weights.to_policy()


def _admin_call(
    settings: BenchSettings, method: str, path: str, body: Any = None
) -> dict[str, Any] | None:
    """One admin API call to the benchmarked daemon; None without a token or on failure."""
    if not settings.admin_token:
        return None
    req = urllib.request.Request(
        settings.url + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {settings.admin_token}",
            "Content-Type": "application/json",
        },
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return dict(json.loads(resp.read()))
    except (OSError, ValueError):
        return None


def daemon_slo(settings: BenchSettings) -> Slo | None:
    """The SLO the daemon's controller steers by (GET /admin/status), when it says."""
    status = _admin_call(settings, "GET", "/admin/status")
    ctl = (status or {}).get("controller") or {}
    ttft, tpot = ctl.get("slo_ttft_p99_s"), ctl.get("slo_tpot_p99_s")
    if ttft is None and tpot is None:
        return None
    return Slo(ttft_p99_s=ttft, tpot_p99_s=tpot)


def record(settings: BenchSettings, report: BenchReport, apply: bool) -> str | None:
    """Store the report in the daemon's database; with apply, its limit becomes the ceiling."""
    path = "/admin/benchmarks" + ("?apply=1" if apply else "")
    answer = _admin_call(settings, "POST", path, report.to_dict())
    if answer is None:
        return None
    text = f"stored as benchmark {answer.get('id')} in the daemon's database"
    if answer.get("applied"):
        text += f"; the controller's ceiling is now {answer.get('ceiling')}"
    return text


def _admin_token(args: argparse.Namespace, default_path: Path | None) -> str | None:
    if args.token_file:
        try:
            return Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise ValueError(
                f"token-file: cannot read {args.token_file} ({exc.strerror})"
            ) from None
    env = os.environ.get("APPLIANCE_ADMIN_TOKEN")
    if env:
        return env.strip()
    if default_path is not None and default_path.is_file():
        try:
            return default_path.read_text().strip()
        except OSError:
            return None
    return None


def settings_from_args(args: argparse.Namespace) -> tuple[BenchSettings, Slo | None]:
    """Validated settings and SLO; ValueError names the bad option."""
    levels = parse_levels(args.concurrency)
    if args.requests_per_level is not None and args.requests_per_level < 1:
        raise ValueError(f"requests-per-level: must be >= 1, got {args.requests_per_level}")
    if args.max_tokens < 1:
        raise ValueError(f"max-tokens: must be >= 1, got {args.max_tokens}")
    if args.max_concurrency < 1:
        raise ValueError(f"max-concurrency: must be >= 1, got {args.max_concurrency}")
    if args.warmup < 0:
        raise ValueError(f"warmup: must be >= 0, got {args.warmup}")
    for name in ("slo_ttft_s", "slo_tpot_s"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise ValueError(f"{name.replace('_', '-')}: must be > 0, got {value}")
    cfg_url, token_path = _config_defaults(args)
    url = (args.url or cfg_url or DEFAULT_URL).rstrip("/")
    if cfg_url is None or url != cfg_url.rstrip("/"):
        token_path = None  # the local daemon's token is never sent to another endpoint
    slo = None
    if args.slo_ttft_s is not None or args.slo_tpot_s is not None:
        slo = Slo(ttft_p99_s=args.slo_ttft_s, tpot_p99_s=args.slo_tpot_s)
    settings = BenchSettings(
        url=url,
        scenario=args.scenario,
        concurrency=levels,
        requests_per_level=args.requests_per_level,
        max_tokens=args.max_tokens,
        model=args.model,
        api_key=args.api_key or os.environ.get("OPENAI_API_KEY") or None,
        admin_token=_admin_token(args, token_path),
        warmup_requests=args.warmup,
    )
    return settings, slo


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
    args: argparse.Namespace,
    progress: ProgressFn | None = None,
    settings_slo: tuple[BenchSettings, Slo | None] | None = None,
) -> BenchReport:
    """Run what the arguments ask for and return the report (raises ValueError, BenchError).

    Without --slo-* the SLO is the one the benchmarked daemon steers by, where it says.
    """
    settings, slo = settings_slo or settings_from_args(args)
    if slo is None:
        slo = daemon_slo(settings)
    weights = _weights(args)
    if args.tune:
        coro = run_tuning(
            settings,
            slo,
            max_concurrency=args.max_concurrency,
            max_limit=args.max_concurrency,
            weights=weights,
            progress=progress,
        )
    else:
        coro = run_sweep(settings, slo, weights=weights, progress=progress)
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
        lines.append(
            f"tuning: recommended limit {report.tuning.recommended_limit} ({report.tuning.reason})"
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


def run(args: argparse.Namespace) -> int:
    """0 when the sweep ran, 1 when the endpoint failed it, 2 on bad input."""
    progress = _make_progress()
    try:
        settings_slo = settings_from_args(args)
        report = bench_result(args, progress, settings_slo)
    except ValueError as exc:
        progress.close()
        print(f"bench: {exc}", file=sys.stderr)
        return BAD_INPUT_EXIT
    except BenchError as exc:
        progress.close()
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    progress.close()
    if not getattr(args, "no_record", False):
        stored = record(settings_slo[0], report, apply=args.tune and not args.no_apply)
        if stored:
            print(f"bench: {stored}", file=sys.stderr)
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


def main(argv: list[str] | None = None) -> int:
    """`python -m appliance.commands.bench ...`: the same command without the CLI around it."""
    parser = argparse.ArgumentParser(prog="appliance bench", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
