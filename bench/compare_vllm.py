"""Appliance (shipped config) vs vLLM's own OpenAI server (vLLM's defaults), same model.

What runs:
- The appliance with the repo's config.yaml as shipped. Only state_dir (a fresh folder per
  round), server.host/port and engine.model (pointed at the converted default model,
  state/models/SmolLM2-135M-Instruct) are changed; every other key, the controller, admission,
  enforce_eager, max_num_seqs and the rest, is what a fresh install runs with.
- vLLM's server with vLLM's defaults: `python -m vllm.entrypoints.openai.api_server --model DIR
  --served-model-name NAME --host 127.0.0.1 --port P`. No --enforce-eager, --max-num-seqs,
  --max-model-len, --dtype or anything else that tunes it.
- The one setting both get alike: the KV-cache budget. On the CPU engine vLLM sizes its KV cache
  from VLLM_CPU_KVCACHE_SPACE (GiB); vLLM's server gets the shipped engine.kv_cache_space_gib
  there (as --kv-cache-memory-bytes if it is not a whole number of GiB), the same budget the
  appliance gives its engine. Without it the two would not run on the same memory.

How: vLLM's benchmark (`vllm.benchmarks.serve`, random dataset, 128 in / 64 out, ignore_eos)
against /v1/chat/completions (backend openai-chat) and /v1/completions (backend openai) at each
concurrency level. The servers never run at once (2 cores): each round starts one, runs all
its cells, stops it, then the other; who goes first alternates from round to round. Each
server starts once per round and its start time (launch to ready) is reported.

Writes the table (per endpoint and concurrency: median over rounds of the per-round
appliance/vLLM ratios of output tok/s and of P99 TTFT, with their min-max spread, failed
requests, start times) into its section of docs/benchmarks.md, and the raw numbers to
docs/bench-compare-vllm.json (rewritten after every server run, so a crash keeps what ran).

    .venv/bin/python bench/compare_vllm.py [--concurrency 1,4,16] [--rounds 3]
    .venv/bin/python bench/compare_vllm.py --quick     # smoke: 1 round, 1,4, few prompts
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import (  # noqa: E402
    BENCHMARKS_MD,
    add_output_args,
    doc_parser,
    load_shipped,
    meta_head,
    publish,
    resolve_outputs,
    shipped_appliance_config,
    work_dir,
    write_json,
)
from bench.servers import (  # noqa: E402
    ServerProc,
    free_port,
    start_appliance,
    start_vllm_defaults,
    vllm_defaults_command,
)

JSON_OUT = ROOT / "docs" / "bench-compare-vllm.json"
QUICK_JSON_OUT = ROOT / "state" / "bench-compare-vllm-quick.json"
SECTION = "compare_vllm"
INPUT_LEN = 128
OUTPUT_LEN = 64
START_TIMEOUT_S = 900  # the compiled path takes ~2 min to start on 2 cores; leave room
SIDES = ("appliance", "vllm")
# name -> (vllm bench backend, path)
ENDPOINTS = {
    "chat": ("openai-chat", "/v1/chat/completions"),
    "completions": ("openai", "/v1/completions"),
}
KEEP = (
    "completed",
    "failed",
    "output_throughput",
    "request_throughput",
    "p50_ttft_ms",
    "p99_ttft_ms",
    "p50_tpot_ms",
    "p99_tpot_ms",
    "p99_e2el_ms",
    "duration",
)


def prompts_for(concurrency: int, quick: bool) -> int:
    """Enough prompts for a steady state at each level without an hour-long run on 2 cores."""
    return max(4, 2 * concurrency) if quick else max(8, 3 * concurrency)


def run_vllm_bench(
    url: str,
    model_name: str,
    model_dir: Path,
    backend: str,
    endpoint: str,
    concurrency: int,
    num_prompts: int,
    warmups: int,
) -> dict[str, Any]:
    """One vllm.benchmarks.serve run; the summary numbers."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(
        [
            "--backend", backend,
            "--base-url", url,
            "--endpoint", endpoint,
            "--model", model_name,
            "--tokenizer", str(model_dir),
            "--dataset-name", "random",
            "--random-input-len", str(INPUT_LEN),
            "--random-output-len", str(OUTPUT_LEN),
            "--num-prompts", str(num_prompts),
            "--max-concurrency", str(concurrency),
            "--ignore-eos",
            "--seed", "0",
            "--num-warmups", str(warmups),
            "--disable-tqdm",
            "--percentile-metrics", "ttft,tpot,e2el",
            "--metric-percentiles", "50,99",
        ]
    )  # fmt: skip
    result = main(args)
    return {k: result.get(k) for k in KEEP}


def get_json(url: str) -> Any:
    """GET url as JSON; the error as a string if it fails (only recorded, never needed)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.loads(resp.read())
    except Exception as exc:
        return f"error: {exc!r}"


def log_lines(path: Path, needle: str, limit: int = 5) -> list[str]:
    """The first lines of a server log that contain needle."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [line.strip()[:2000] for line in text.splitlines() if needle in line][:limit]


def start_side(
    side: str, work: Path, tag: str, model_dir: Path, model_name: str, kv_gib: float
) -> tuple[ServerProc, Path]:
    port = free_port()
    if side == "appliance":
        state_dir = work / f"appliance-{tag}"
        cfg = shipped_appliance_config(state_dir, port, model_dir)
        server = start_appliance(cfg, state_dir, timeout_s=START_TIMEOUT_S)
        return server, state_dir / "daemon.log"
    log = work / f"vllm-{tag}.log"
    server = start_vllm_defaults(
        model_dir, port, log, kv_gib, served_model_name=model_name, timeout_s=START_TIMEOUT_S
    )
    return server, log


def run_side(
    side: str,
    tag: str,
    work: Path,
    plan: dict[str, Any],
    model_dir: Path,
    model_name: str,
    kv_gib: float,
) -> dict[str, Any]:
    """Start one server, run every endpoint x concurrency cell against it, stop it."""
    out: dict[str, Any] = {"start_s": None, "cells": {}}
    t0 = time.monotonic()
    try:
        server, log = start_side(side, work, tag, model_dir, model_name, kv_gib)
    except Exception as exc:  # a 40-minute run records it and goes on
        out["error"] = f"start failed: {exc}"[-4000:]
        print(f"  {side} did not start: {exc}"[:2000], flush=True)
        return out
    out["start_s"] = round(time.monotonic() - t0, 1)
    print(f"  {side} ready in {out['start_s']:.0f} s at {server.url}", flush=True)
    try:
        out["models"] = get_json(server.url + "/v1/models")
        for ep, (backend, path) in ENDPOINTS.items():
            cells: dict[str, Any] = {}
            out["cells"][ep] = cells
            for c in plan["levels"]:
                try:
                    cell = run_vllm_bench(
                        server.url,
                        model_name,
                        model_dir,
                        backend,
                        path,
                        c,
                        prompts_for(c, plan["quick"]),
                        plan["warmups"],
                    )
                    print(
                        f"  {side} {ep} c={c}: {cell['output_throughput']:.1f} tok/s, "
                        f"P99 TTFT {cell['p99_ttft_ms']:.0f} ms, failed {cell['failed']}",
                        flush=True,
                    )
                except Exception as exc:
                    cell = {"error": repr(exc)[:2000]}
                    print(f"  {side} {ep} c={c}: error {exc!r}"[:2000], flush=True)
                cells[str(c)] = cell
    finally:
        out["exit_status"] = server.stop()
        if side == "vllm":
            out["non_default_args"] = log_lines(log, "non-default args")
        else:
            # The shipped maintenance schedule runs; note any job that ran inside the run.
            out["maintenance_jobs_started"] = len(log_lines(log, "job_started", 1000))
    out["wall_s"] = round(time.monotonic() - t0, 1)
    return out


def cell_value(run: dict[str, Any], ep: str, c: int, key: str) -> float | None:
    cell = run.get("cells", {}).get(ep, {}).get(str(c))
    if not cell or "error" in cell or not cell.get("completed"):
        return None
    value = cell.get(key)
    return float(value) if value is not None else None


def spread(values: list[float]) -> dict[str, Any] | None:
    if not values:
        return None
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def summarize(results: dict[str, list[dict[str, Any]]], levels: list[int]) -> dict[str, Any]:
    """Per endpoint and level: medians, per-round ratios (appliance / vLLM of the same round)
    and their median and min-max, failed requests; and the start times."""
    summary: dict[str, Any] = {"cells": {}, "start_s": {}}
    rounds = min(len(results["appliance"]), len(results["vllm"]))
    for ep in ENDPOINTS:
        for c in levels:
            row: dict[str, Any] = {}
            for key, name in (("output_throughput", "tok_s"), ("p99_ttft_ms", "p99_ttft_ms")):
                per_side = {
                    s: [cell_value(run, ep, c, key) for run in results[s][:rounds]] for s in SIDES
                }
                for s in SIDES:
                    row[f"{s}_{name}"] = spread([v for v in per_side[s] if v is not None])
                ratios = [
                    a / v
                    for a, v in zip(per_side["appliance"], per_side["vllm"], strict=True)
                    if a is not None and v  # v is neither None nor 0
                ]
                row[f"{name}_ratio"] = spread(ratios)
                row[f"{name}_ratios"] = ratios
            for s in SIDES:
                cells = [r.get("cells", {}).get(ep, {}).get(str(c)) for r in results[s]]
                row[f"{s}_failed"] = sum((x or {}).get("failed") or 0 for x in cells)
                row[f"{s}_errors"] = sum(1 for x in cells if not x or "error" in x)
            summary["cells"][f"{ep}/{c}"] = row
    for s in SIDES:
        summary["start_s"][s] = spread([r["start_s"] for r in results[s] if r["start_s"]])
    return summary


def fmt_spread(sp: dict[str, Any] | None, digits: int, rounds: int = 0) -> str:
    """median (min-max); [n=K] where fewer than `rounds` rounds gave a value."""
    if not sp:
        return "n/a"
    text = f"{sp['median']:.{digits}f}"
    if sp["n"] > 1:
        text += f" ({sp['min']:.{digits}f}-{sp['max']:.{digits}f})"
    if sp["n"] < rounds:
        text += f" [n={sp['n']}]"
    return text


def render(summary: dict[str, Any], plan: dict[str, Any], meta: dict[str, Any]) -> str:
    """The markdown section."""
    kv = meta["kv_cache_gib"]
    eng = {
        k: str(v).lower() if isinstance(v, bool) else v for k, v in meta["appliance_engine"].items()
    }
    limit = meta["appliance_admission_limit"]
    limit = "null (= max_num_seqs)" if limit is None else limit
    n = meta["rounds"]
    kv_via = "VLLM_CPU_KVCACHE_SPACE" if float(kv).is_integer() else "--kv-cache-memory-bytes"
    lines = [
        "## Appliance (shipped config) vs vLLM's OpenAI server (vLLM defaults)",
        "",
        f"Measured {meta['date']} with `{meta['command']}` on {meta['machine']}, "
        f"vLLM {meta['vllm']} CPU engine, model {meta['model']} "
        f"(the converted default model). `vllm.benchmarks.serve`, random dataset "
        f"{INPUT_LEN} in / {OUTPUT_LEN} out (ignore_eos); {meta['rounds']} round(s). "
        "The two servers ran one after the other, never at once; who went first alternated "
        "each round, and each server started once per round.",
        "",
        f"- Appliance: `config.yaml` as shipped; only state_dir, server.host/port and "
        f"engine.model changed. That is enforce_eager {eng['enforce_eager']}, max_num_seqs "
        f"{eng['max_num_seqs']}, max_model_len {eng['max_model_len']}, dtype {eng['dtype']}, "
        f"scheduling_policy {eng['scheduling_policy']}, admission.concurrency_limit "
        f"{limit}, controller.mode {meta['appliance_controller']}.",
        f"- vLLM: `{meta['vllm_command']}`, everything else vLLM's default "
        "(the compiled path, its own max_num_seqs and max_model_len).",
        f"- Both: the same KV-cache budget, {kv:g} GiB (the shipped "
        f"engine.kv_cache_space_gib; vLLM's server gets it through {kv_via}), "
        "the only setting given to vLLM beyond model, name and address.",
        "",
        "Ratios are appliance / vLLM within the same round; shown: the median over rounds "
        "and (min-max) of the per-round ratios. tok/s ratio above 1 and TTFT ratio below 1 "
        "favour the appliance. Failed: requests failed over all rounds, appliance/vLLM.",
        "",
        "| endpoint | concurrency | prompts | appliance tok/s | vLLM tok/s | tok/s ratio | "
        "appliance P99 TTFT ms | vLLM P99 TTFT ms | P99 TTFT ratio | failed (a/v) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for ep, (_, path) in ENDPOINTS.items():
        for c in plan["levels"]:
            row = summary["cells"][f"{ep}/{c}"]
            failed = f"{row['appliance_failed']}/{row['vllm_failed']}"
            errs = row["appliance_errors"] + row["vllm_errors"]
            if errs:
                failed += f" ({row['appliance_errors']}/{row['vllm_errors']} runs errored)"
            lines.append(
                f"| `{path}` | {c} | {prompts_for(c, plan['quick'])} | "
                f"{fmt_spread(row['appliance_tok_s'], 1, n)} | "
                f"{fmt_spread(row['vllm_tok_s'], 1, n)} | "
                f"{fmt_spread(row['tok_s_ratio'], 2, n)} | "
                f"{fmt_spread(row['appliance_p99_ttft_ms'], 0, n)} | "
                f"{fmt_spread(row['vllm_p99_ttft_ms'], 0, n)} | "
                f"{fmt_spread(row['p99_ttft_ms_ratio'], 2, n)} | {failed} |"
            )
    lines += [
        "",
        "Absolute tok/s and TTFT columns: median (min-max) over rounds; [n=K]: only K rounds "
        "gave a number (a server that did not start, or a run that errored).",
        "",
        "| server | start to ready, s: median (min-max) | starts |",
        "|---|---|---|",
    ]
    for s, name in (("appliance", "appliance (`/health/ready`)"), ("vllm", "vLLM (`/health`)")):
        sp = summary["start_s"][s]
        lines.append(f"| {name} | {fmt_spread(sp, 0)} | {sp['n'] if sp else 0} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = doc_parser(__doc__)
    parser.add_argument(
        "--concurrency", default=None, help="comma-separated levels (default 1,4,16; quick 1,4)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="default 3; quick 1")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 1 round, concurrency 1,4, fewer prompts and warmups; writes the JSON "
        f"to {QUICK_JSON_OUT.relative_to(ROOT)} and docs/ only if --out/--json say so",
    )
    add_output_args(parser, BENCHMARKS_MD, JSON_OUT, "server logs")
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    try:
        levels = [
            int(x) for x in (args.concurrency or ("1,4" if args.quick else "1,4,16")).split(",")
        ]
    except ValueError:
        parser.error("--concurrency takes comma-separated integers")
    if any(c < 1 for c in levels):
        parser.error("--concurrency levels must be at least 1")
    args.levels = levels
    args.rounds = args.rounds or (1 if args.quick else 3)
    resolve_outputs(args, BENCHMARKS_MD, JSON_OUT, QUICK_JSON_OUT)
    return args


def run_meta(
    args: argparse.Namespace, plan: dict[str, Any], shipped: Any, model_dir: Path, model_name: str
) -> dict[str, Any]:
    """What the report says about the run: command, machine, versions, both servers' setup."""
    kv_gib = float(shipped.engine.kv_cache_space_gib)
    vcmd, venv = vllm_defaults_command(model_dir, 0, kv_gib, model_name)
    kv_env = venv.get("VLLM_CPU_KVCACHE_SPACE")
    vllm_cmd = ("VLLM_CPU_KVCACHE_SPACE=" + kv_env + " " if kv_env else "") + shlex.join(
        ["python", *vcmd[1:]]
    ).replace(str(model_dir), "DIR").replace("--port 0", "--port P")
    command = "python bench/compare_vllm.py " + " ".join(
        (["--quick"] if args.quick else [])
        + ["--concurrency", ",".join(map(str, args.levels)), "--rounds", str(args.rounds)]
    )
    return {
        **meta_head(command, model_name, model_dir),
        "rounds": args.rounds,
        "levels": args.levels,
        "quick": args.quick,
        "prompts": {str(c): prompts_for(c, args.quick) for c in args.levels},
        "warmups": plan["warmups"],
        "input_len": INPUT_LEN,
        "output_len": OUTPUT_LEN,
        "endpoints": {ep: {"backend": b, "path": p} for ep, (b, p) in ENDPOINTS.items()},
        "kv_cache_gib": kv_gib,
        "appliance_config": "config.yaml as shipped; changed: state_dir, server.host, "
        "server.port, engine.model",
        "appliance_engine": shipped.engine.model_dump(
            include={
                "enforce_eager",
                "max_num_seqs",
                "max_model_len",
                "dtype",
                "scheduling_policy",
                "kv_cache_space_gib",
            }
        ),
        "appliance_admission_limit": shipped.admission.concurrency_limit,
        "appliance_controller": shipped.controller.mode,
        "vllm_command": vllm_cmd,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = {"levels": args.levels, "rounds": args.rounds, "quick": args.quick}
    plan["warmups"] = 1 if args.quick else 2

    # What the shipped config resolves to (KV budget, served name, engine settings).
    model_dir, shipped, model_name = load_shipped()
    kv_gib = float(shipped.engine.kv_cache_space_gib)
    meta = run_meta(args, plan, shipped, model_dir, model_name)
    results: dict[str, list[dict[str, Any]]] = {"appliance": [], "vllm": []}

    def save(complete: bool) -> dict[str, Any]:
        summary = summarize(results, args.levels)
        write_json(
            args.json,
            {"complete": complete, "meta": meta, "summary": summary, "results": results},
        )
        return summary

    with work_dir(args.work_dir, "bench-compare-") as work:
        for r in range(args.rounds):
            # Alternate who goes first, so warm caches or a drifting machine favour neither.
            order = SIDES if r % 2 == 0 else SIDES[::-1]
            for side in order:
                print(f"round {r + 1}/{args.rounds}: {side}", flush=True)
                run = run_side(side, str(r), work, plan, model_dir, model_name, kv_gib)
                run["round"], run["first"] = r, side == order[0]
                results[side].append(run)
                save(complete=False)
    summary = save(complete=True)
    publish(render(summary, plan, meta), args.out, args.json, SECTION)
    broken = any(
        "error" in run
        or any("error" in cell for cells in run["cells"].values() for cell in cells.values())
        for side in SIDES
        for run in results[side]
    )
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
