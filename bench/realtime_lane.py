"""Realtime-lane TTFT under a batch overload, with and without the reserved share.

Starts `appliance serve` (real CPU engine) twice, identical but for
`admission.realtime_reserved_share` (the configured share, then 0), floods it with
closed-loop batch clients (more than the concurrency limit, so batch requests queue), and
sends a short streamed realtime request at a steady pace. Reports the realtime P50/P99
TTFT of each arm and the P99 ratio (without / with), and writes docs/benchmarks.md.

    .venv/bin/python bench/realtime_lane.py [--share 0.125] [--limit 8] [--batch-clients 16]
        [--probes 20] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from appliance.client import aiter_sse  # noqa: E402
from appliance.domain.latency_window import percentile  # noqa: E402
from bench.report import BENCHMARKS_MD, MODEL_DIR, write_section  # noqa: E402
from bench.servers import free_port, small_engine, start_appliance  # noqa: E402


async def _ttft(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> float:
    """Seconds to the first streamed content of one request."""
    t0 = time.monotonic()
    async with session.post(url, json={**body, "stream": True}) as r:
        if r.status != 200:
            raise RuntimeError(f"{r.status}: {(await r.text())[:200]}")
        first = None
        async for event in aiter_sse(r.content):
            if first is not None or event.done:
                continue  # read to the end: a flood client sends its next one after
            if event.json()["choices"][0].get("delta", {}).get("content"):
                first = time.monotonic() - t0
        if first is None:
            raise RuntimeError("no content streamed")
        return first


async def run_arm(url: str, model: str, args: argparse.Namespace) -> dict[str, Any]:
    """The flood, the probes; the probes' TTFTs and what the batch lane did meanwhile."""
    chat = url + "/v1/chat/completions"
    stop = asyncio.Event()
    batch_done = [0]
    flood = {
        "model": model,
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
        "max_tokens": args.batch_max_tokens,
        "priority": "batch",
    }
    probe = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 4,
        "priority": "realtime",
        "deadline_ms": 600_000,  # measure the TTFT, do not cut the answer
    }
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as s:

        async def batch_client() -> None:
            while not stop.is_set():
                await _ttft(s, chat, flood)
                batch_done[0] += 1

        clients = [asyncio.create_task(batch_client()) for _ in range(args.batch_clients)]
        await asyncio.sleep(args.warmup_s)
        ttfts = []
        for i in range(args.probes):
            ttfts.append(await _ttft(s, chat, probe))
            print(f"  probe {i + 1}/{args.probes}: TTFT {ttfts[-1] * 1000:.0f} ms", flush=True)
            await asyncio.sleep(args.probe_gap_s)
        stop.set()
        for c in clients:
            c.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
    return {
        "ttft_s": ttfts,
        "p50_ms": percentile(ttfts, 50) * 1000,
        "p99_ms": percentile(ttfts, 99) * 1000,
        "batch_completed": batch_done[0],
    }


def _daemon_config(model_dir: Path, limit: int, share: float) -> dict[str, Any]:
    """One arm's daemon: identical for both but for the reserved share."""
    return {
        "server": {"port": free_port()},
        # Both arms alike; compiled would add minutes to each start.
        "engine": small_engine(model_dir),
        "admission": {
            "concurrency_limit": limit,
            "realtime_reserved_share": share,
            "max_queue_wait_s": 3600,
            "queue_capacity": {"realtime": 64, "interactive": 64, "batch": 1024},
        },
        "controller": {"mode": "manual"},
        "logging": {"level": "warning"},
    }


def run_rounds(args: argparse.Namespace, arms: dict[str, float]) -> dict[str, list[dict]]:
    """Every round, both arms (the first alternating), a fresh daemon for each."""
    from appliance.model_prep import prepare_default_model

    model_dir = prepare_default_model(MODEL_DIR)
    results: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory(prefix="rt-bench-") as tmp:
        for r in range(args.rounds):
            order = list(arms) if r % 2 == 0 else list(reversed(arms))
            for arm in order:
                print(f"round {r + 1}: {arm} (share {arms[arm]:g}), starting", flush=True)
                cfg = _daemon_config(model_dir, args.limit, arms[arm])
                server = start_appliance(cfg, Path(tmp) / f"{arm}-{r}")
                try:
                    results[arm].append(asyncio.run(run_arm(server.url, model_dir.name, args)))
                finally:
                    server.stop()
                last = results[arm][-1]
                print(f"  {arm}: P50 {last['p50_ms']:.0f} ms, P99 {last['p99_ms']:.0f} ms")
    return results


def render_section(
    args: argparse.Namespace,
    arms: dict[str, float],
    results: dict[str, list[dict[str, Any]]],
    command: str,
) -> str:
    """The docs/benchmarks.md section: the setup, the table of medians, the P99 ratio."""

    def med(arm: str, key: str) -> float:
        return statistics.median(x[key] for x in results[arm])

    ratio = med("no_reserve", "p99_ms") / med("reserved", "p99_ms")
    return "\n".join(
        [
            "## Realtime lane under a batch overload (issue 9)",
            "",
            f"Measured {time.strftime('%Y-%m-%d')} with `{command}` on 2 cores / 24 GiB, no "
            f"GPU, SmolLM2-135M-Instruct on the vLLM CPU engine (priority scheduling on in "
            f"both arms). {args.batch_clients} closed-loop batch clients "
            f"({args.batch_max_tokens} tokens each) against a concurrency limit of "
            f"{args.limit}; one short streamed realtime request every {args.probe_gap_s:g} s, "
            f"{args.probes} per run; medians over {args.rounds} round(s).",
            "",
            "| arm | reserved share | realtime P50 TTFT ms | realtime P99 TTFT ms | "
            "batch requests done |",
            "|---|---|---|---|---|",
            *(
                f"| {arm} | {arms[arm]:g} | {med(arm, 'p50_ms'):.0f} | "
                f"{med(arm, 'p99_ms'):.0f} | {med(arm, 'batch_completed'):.0f} |"
                for arm in arms
            ),
            "",
            f"Realtime P99 TTFT without / with the reserved share: **{ratio:.1f}x**.",
        ]
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--share", type=float, default=0.125, help="the reserved share under test")
    p.add_argument("--limit", type=int, default=8, help="admission.concurrency_limit")
    p.add_argument("--batch-clients", type=int, default=16)
    p.add_argument("--batch-max-tokens", type=int, default=96)
    p.add_argument("--probes", type=int, default=20)
    p.add_argument("--probe-gap-s", type=float, default=1.0)
    p.add_argument("--warmup-s", type=float, default=8.0)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", default=str(BENCHMARKS_MD))
    args = p.parse_args()

    arms = {"reserved": args.share, "no_reserve": 0.0}
    results = run_rounds(args, arms)
    command = (
        f"python bench/realtime_lane.py --share {args.share:g} --limit {args.limit} "
        f"--batch-clients {args.batch_clients} --probes {args.probes} --rounds {args.rounds}"
    )
    section = render_section(args, arms, results, command)
    print(section)
    write_section(Path(args.out), "realtime_lane", section + "\n")
    (Path(args.out).parent / "bench-realtime-lane.json").write_text(
        json.dumps({"command": command, "results": results}, indent=1)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
