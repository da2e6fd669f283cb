"""The engine's step time against the concurrency limit, on a cool box and beside CPU burners:
the curve the controller's latency projection assumes (latency in proportion to the limit).

For each static limit, closed-loop chat clients (the limit + 8, so a queue is always there)
keep the engine full; after --settle-s the engine's own steps (vLLM's stat logger, as the
controller sees them in /admin/status `controller.live`) are sampled every --every-s over
--measure-s: the mean inter-token gap of the steps in the last span, and the batch they ran.
With --burners N,... the same again with N CPU-burning processes beside the engine (as the
thermal trace's hot room slows the box). The median says what a decode step costs at that
batch; the max shows the steps that carried a wave of prefill.

    .venv/bin/python bench/step_time.py --start [--levels 8,16,32,48,64] [--burners 0,2] \
        [--markdown docs/benchmarks.md --section step_time] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from appliance.bench_runner import BenchSettings, connect, document_prompt, stream_chat  # noqa: E402
from appliance.client import AdminClient, DaemonAddress, Token  # noqa: E402
from bench.goodput import Daemon, GoodputSlo, _load_session  # noqa: E402
from bench.goodput_trace import Plan, _daemon_config, arm_body, calibrate  # noqa: E402
from bench.report import MODEL_DIR, add_daemon_args, publish_doc, start_burner, stop_burners  # noqa: E402


@dataclass(frozen=True)
class Settings:
    levels: tuple[int, ...]
    burners: tuple[int, ...]
    settle_s: float = 10.0
    measure_s: float = 24.0
    every_s: float = 2.0
    prompt_tokens: int = 100
    max_tokens: int = 32
    max_limit: int = 64


@dataclass(frozen=True)
class Row:
    """One limit with N burners: the steps' mean gap over the samples, and the batch."""

    burners: int
    limit: int
    samples: int
    tpot_median_s: float | None
    tpot_min_s: float | None
    tpot_max_s: float | None
    batch_median: float | None


def summarise(burners: int, limit: int, live: Sequence[dict[str, Any]]) -> Row:
    """The samples of controller.live taken at one limit (None where no steps were judged)."""
    tpots = [float(x["tpot_s"]) for x in live if x.get("tpot_s") is not None]
    batches = [float(x["batch"]) for x in live if x.get("batch") is not None]
    return Row(
        burners=burners,
        limit=limit,
        samples=len(tpots),
        tpot_median_s=statistics.median(tpots) if tpots else None,
        tpot_min_s=min(tpots) if tpots else None,
        tpot_max_s=max(tpots) if tpots else None,
        batch_median=statistics.median(batches) if batches else None,
    )


@contextlib.contextmanager
def burning(n: int) -> Iterator[None]:
    """n CPU-burning processes for the block; killed however it ends."""
    procs = [start_burner() for _ in range(n)]
    try:
        yield
    finally:
        stop_burners(procs)


async def measure(url: str, token: str | None, s: Settings, log: Any = print) -> list[Row]:
    """Every burner count x every level on the daemon at url; its controller is put back as
    it was however the run ends."""
    rows: list[Row] = []
    address = DaemonAddress(url, Token(token, "bench"))
    async with _load_session() as session, AdminClient.at(address) as admin:
        daemon = Daemon(admin)
        target = await connect(session, BenchSettings(url=url))
        words = (await calibrate(session, target)).words_for(s.prompt_tokens)
        before = await daemon.status()
        if before is None:
            raise RuntimeError("GET /admin/status failed: the admin token is needed")
        try:
            for burners in s.burners:
                with burning(burners):
                    for limit in s.levels:
                        applied, why = await daemon.set_controller(
                            arm_body(f"static:{limit}", s.max_limit)
                        )
                        if not applied:
                            raise RuntimeError(why)
                        live = await _load_and_sample(session, target, daemon, limit, words, s)
                        rows.append(summarise(burners, limit, live))
                        log(f"  {burners} burner(s), limit {limit}: {_cell(rows[-1])}")
                        await daemon.wait_idle(120.0)
        finally:
            await daemon.set_controller(Daemon.restore_body(before))
    return rows


async def _load_and_sample(
    session: Any, target: Any, daemon: Daemon, limit: int, words: int, s: Settings
) -> list[dict[str, Any]]:
    stop = asyncio.Event()
    sent = 0

    async def client(k: int) -> None:
        nonlocal sent
        while not stop.is_set():
            sent += 1
            await stream_chat(session, target, document_prompt(sent, k, words), s.max_tokens)

    tasks = [asyncio.create_task(client(k)) for k in range(limit + 8)]
    live: list[dict[str, Any]] = []
    try:
        await asyncio.sleep(s.settle_s)
        end = time.monotonic() + s.measure_s
        while time.monotonic() < end:
            status = await daemon.status()
            sample = ((status or {}).get("controller") or {}).get("live")
            if sample:
                live.append(sample)
            await asyncio.sleep(s.every_s)
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return live


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def _batch(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def tokens_per_s(batch: float | None, gap_s: float | None) -> float | None:
    """Decode tokens a second: the batch over the step's gap (each running request gets a
    token a step); where this stops rising with the limit, the box has reached its knee."""
    if batch is None or not gap_s:
        return None
    return batch / gap_s


def _cell(r: Row) -> str:
    return (
        f"{_ms(r.tpot_median_s)} ms [{_ms(r.tpot_min_s)}-{_ms(r.tpot_max_s)}] "
        f"at batch {_batch(r.batch_median)} ({r.samples} samples)"
    )


def render_markdown(doc: dict[str, Any]) -> str:
    s = doc["settings"]
    day = time.strftime("%Y-%m-%d", time.gmtime(doc["measured_at_unix_s"]))
    lines = [
        "## The engine's step time against the limit (issue 15)",
        "",
        f"Measured {day} with `{doc['command']}` on {doc['machine']}. Closed-loop chat "
        f"({s['prompt_tokens']}-token prompts, {s['max_tokens']} output tokens, the limit + 8 "
        "clients); the engine's steps as /admin/status `controller.live` shows them, sampled "
        f"every {s['every_s']:g} s over {s['measure_s']:g} s after {s['settle_s']:g} s: the "
        "steps' mean gap in ms, median [min-max] over the samples, the batch they ran, and "
        "decode tokens a second (batch over the median gap).",
        "",
        "| CPU burners | limit | step gap, ms | batch | tokens/s | samples |",
        "|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        rate = tokens_per_s(r["batch_median"], r["tpot_median_s"])
        lines.append(
            f"| {r['burners']} | {r['limit']} | {_ms(r['tpot_median_s'])} "
            f"[{_ms(r['tpot_min_s'])}-{_ms(r['tpot_max_s'])}] | "
            f"{_batch(r['batch_median'])} | {'-' if rate is None else f'{rate:.0f}'} | "
            f"{r['samples']} |"
        )
    return "\n".join(lines) + "\n"


async def run(s: Settings, url: str | None, token: str | None, log: Any = print) -> dict[str, Any]:
    """Measure on the daemon at url, or on one started here (the real CPU engine)."""
    from appliance.model_prep import prepare_default_model
    from bench.servers import free_port, start_appliance

    server = None
    with tempfile.TemporaryDirectory(prefix="step-time-") as tmp:
        if url is None:
            plan = Plan(
                traces=(),
                runs=1,
                levels=s.levels,
                slo=GoodputSlo(5.0, 0.5),
                max_tokens=s.max_tokens,
                drain_s=0.0,
                max_limit=s.max_limit,
            )
            log("starting the daemon ...")
            config = _daemon_config(plan, prepare_default_model(MODEL_DIR), free_port())
            server = start_appliance(config, Path(tmp) / "daemon")
            url, token = server.url, server.admin_address().token.value
        try:
            rows = await measure(url, token, s, log)
        finally:
            if server is not None:
                server.stop()
    return {
        "measured_at_unix_s": time.time(),
        "settings": asdict(s),
        "rows": [asdict(r) for r in rows],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_daemon_args(p)
    p.add_argument("--levels", default="8,16,32,48,64", help="static limits")
    p.add_argument("--burners", default="0,2", help="CPU-burning processes beside the engine")
    p.add_argument("--settle-s", type=float, default=10.0)
    p.add_argument("--measure-s", type=float, default=24.0)
    p.add_argument("--every-s", type=float, default=2.0)
    p.add_argument("--prompt-tokens", type=int, default=100)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--max-limit", type=int, default=64, help="engine.max_num_seqs of the daemon")
    p.add_argument("--machine", default="2 cores / 24 GiB, no GPU, vLLM CPU engine")
    p.add_argument("--markdown", help="write the table into this file's --section")
    p.add_argument("--section", default="step_time", help="the markdown section's name")
    p.add_argument("--json-out", help="write every number to this file")
    args = p.parse_args(argv)
    try:
        levels = tuple(int(x) for x in args.levels.split(",") if x.strip())
        burners = tuple(int(x) for x in args.burners.split(",") if x.strip())
    except ValueError as exc:
        raise SystemExit(f"levels, burners: whole numbers, comma-separated ({exc})") from None
    if not levels or any(n < 1 or n > args.max_limit for n in levels):
        raise SystemExit(f"levels: whole numbers in [1, --max-limit={args.max_limit}]")
    if not burners or any(n < 0 for n in burners):
        raise SystemExit("burners: whole numbers >= 0")
    if not (args.settle_s >= 0 and args.measure_s > 0 and args.every_s > 0):
        raise SystemExit("settle-s must be >= 0, measure-s and every-s > 0")
    if args.prompt_tokens < 1 or args.max_tokens < 1:
        raise SystemExit("prompt-tokens and max-tokens: >= 1")
    s = Settings(
        levels=levels,
        burners=burners,
        settle_s=args.settle_s,
        measure_s=args.measure_s,
        every_s=args.every_s,
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
        max_limit=args.max_limit,
    )
    token = Path(args.token_file).read_text().strip() if args.token_file else None
    doc = asyncio.run(run(s, None if args.start else args.url, token))
    doc["command"] = "python bench/step_time.py " + " ".join(sys.argv[1:] if argv is None else argv)
    doc["machine"] = args.machine
    publish_doc(render_markdown(doc), doc, args.markdown, args.section, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
