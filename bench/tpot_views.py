"""Does the daemon's own TPOT reading match what its clients see? The same requests, both ways.

The controller judges the TPOT SLO on the daemon's reading (a request's tokens timed as the
engine hands them to the serving layer); a client judges it on the chunks it reads, after the
HTTP layer and its own event loop. Where the two part, the controller steers by a number no
client sees. For each limit: a daemon (real CPU engine, static limit N) with N closed-loop
streamed chat clients for --duration-s; each request's TPOT from the client, the daemon's
`request_done` log line of each (`ev_tpot_s`), and the client's event-loop lag (a 10 ms
ticker's overshoot: a starved client reads its chunks late).

    .venv/bin/python bench/tpot_views.py [--levels 24,48] [--duration-s 40] \
        [--markdown docs/benchmarks.md --section tpot_views] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from appliance.bench_runner import BenchSettings, connect, document_prompt, stream_chat  # noqa: E402
from appliance.domain.incidents import REQUEST_EVENT, parse_lines  # noqa: E402
from bench.goodput import GoodputSlo, _load_session  # noqa: E402
from bench.goodput_trace import Plan, _daemon_config, calibrate  # noqa: E402
from bench.goodput_trace import _pct as pct  # noqa: E402
from bench.report import MODEL_DIR, publish_doc  # noqa: E402

TICK_S = 0.01
PROMPT_TOKENS = 100  # thermal's chat prompts


@dataclass(frozen=True)
class Row:
    """One limit: the same requests' TPOT as the client and as the daemon saw it."""

    limit: int
    client_n: int
    daemon_n: int
    client_p50_s: float | None
    client_p99_s: float | None
    daemon_p50_s: float | None
    daemon_p99_s: float | None
    loop_lag_p99_ms: float | None


def daemon_tpots(log_lines: Iterable[str]) -> list[float]:
    """The TPOT of every request the daemon's log says is done (`appliance logs analyze`'s
    reader of its JSON lines)."""
    out = []
    for rec in parse_lines(log_lines):
        tpot = rec.number("tpot_s") if rec.event == REQUEST_EVENT else None
        if tpot is not None and tpot > 0:
            out.append(tpot)
    return out


def _config(limit: int, model_dir: Path, port: int) -> dict[str, Any]:
    """The trace bench's daemon (the same engine), at a static limit, logging each request."""
    plan = Plan(
        traces=(),
        runs=1,
        levels=(limit,),
        slo=GoodputSlo(5.0, 0.5),
        max_tokens=32,
        drain_s=0.0,
        max_limit=max(64, limit),
    )
    cfg = _daemon_config(plan, model_dir, port)
    cfg["admission"]["concurrency_limit"] = limit
    cfg["logging"] = {"level": "info"}  # the request_done lines
    return cfg


async def _load(url: str, limit: int, duration_s: float) -> tuple[list[float], list[float]]:
    """`limit` closed-loop streams of PROMPT_TOKENS-token prompts: client TPOTs, loop lags."""
    lags: list[float] = []
    tpots: list[float] = []
    stop = time.perf_counter() + duration_s
    async with _load_session() as session:
        target = await connect(session, BenchSettings(url=url))
        words = (await calibrate(session, target)).words_for(PROMPT_TOKENS)

        async def ticker() -> None:
            while time.perf_counter() < stop:
                t = time.perf_counter()
                await asyncio.sleep(TICK_S)
                lags.append(time.perf_counter() - t - TICK_S)

        async def worker(w: int) -> None:
            i = 0
            while time.perf_counter() < stop:
                prompt = document_prompt(w * 10_000 + i, 1, words)
                s = await stream_chat(session, target, prompt, 32, seed=w * 10_000 + i)
                if s.ok and s.tpot_s:
                    tpots.append(s.tpot_s)
                i += 1

        await asyncio.gather(ticker(), *(worker(w) for w in range(limit)))
    return tpots, lags


async def measure(limit: int, duration_s: float, log: Any = print) -> Row:
    from appliance.model_prep import prepare_default_model
    from bench.servers import free_port, start_appliance

    model_dir = prepare_default_model(MODEL_DIR)
    with tempfile.TemporaryDirectory(prefix="tpot-views-") as tmp:
        log(f"limit {limit}: starting the daemon ...")
        server = start_appliance(_config(limit, model_dir, free_port()), Path(tmp) / "daemon")
        try:
            tpots, lags = await _load(server.url, limit, duration_s)
        finally:
            server.stop()
        daemon = daemon_tpots((Path(tmp) / "daemon" / "daemon.log").read_text().splitlines())
    lag = pct(lags, 99)
    return Row(
        limit,
        len(tpots),
        len(daemon),
        pct(tpots, 50),
        pct(tpots, 99),
        pct(daemon, 50),
        pct(daemon, 99),
        None if lag is None else lag * 1000,
    )


def render(rows: Sequence[Row], command: str) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.0f}"

    lines = [
        "## The daemon's TPOT and its clients' (issue 15)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} with `{command}` on 2 cores, vLLM CPU engine, "
        "SmolLM2: at each static limit N, N closed-loop streamed chat clients (~100-token "
        "prompts, 32 output tokens); the same requests' TPOT as each client read its chunks "
        "and as the daemon logged it (`request_done`, `ev_tpot_s`).",
        "",
        "| limit | requests (client / daemon) | client p50 / p99 ms | daemon p50 / p99 ms "
        "| client loop lag p99 ms |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lag = "-" if r.loop_lag_p99_ms is None else f"{r.loop_lag_p99_ms:.1f}"
        lines.append(
            f"| {r.limit} | {r.client_n} / {r.daemon_n} | {ms(r.client_p50_s)} / "
            f"{ms(r.client_p99_s)} | {ms(r.daemon_p50_s)} / {ms(r.daemon_p99_s)} | {lag} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--levels", default="24,48")
    p.add_argument("--duration-s", type=float, default=40.0)
    p.add_argument("--markdown")
    p.add_argument("--section", default="tpot_views")
    p.add_argument("--json-out")
    args = p.parse_args(argv)
    try:
        levels = tuple(int(x) for x in args.levels.split(",") if x.strip())
    except ValueError:
        raise SystemExit(f"levels: whole numbers, got {args.levels!r}") from None
    if not levels or min(levels) < 1 or not args.duration_s > 0:
        raise SystemExit("levels: whole numbers >= 1; duration-s: > 0")
    rows = [asyncio.run(measure(n, args.duration_s)) for n in levels]
    command = "python bench/tpot_views.py " + " ".join(sys.argv[1:] if argv is None else argv)
    doc = {"command": command, "rows": [asdict(r) for r in rows]}
    publish_doc(render(rows, command), doc, args.markdown, args.section, args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
