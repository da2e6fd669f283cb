"""Appliance vs vLLM's own OpenAI server, same model, same engine settings, same run.

Runs vLLM's benchmark (`vllm.benchmarks.serve`, random 128 in / 64 out) at each concurrency
against both servers, one after the other (two servers at once would share 2 cores), and
writes the table with the ratios to docs/benchmarks.md and the raw numbers to JSON.

    .venv/bin/python bench/compare_vllm.py [--concurrency 1,4,16] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import write_section  # noqa: E402
from bench.servers import ServerProc, free_port, start_appliance, start_vllm_server  # noqa: E402

MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 32
KV_GIB = 1.0
INPUT_LEN = 128
OUTPUT_LEN = 64


def prompts_for(concurrency: int) -> int:
    """Enough prompts for a steady state at each level without an hour-long run on 2 cores."""
    return max(8, 3 * concurrency)


def run_vllm_bench(url: str, model_dir: Path, concurrency: int, num_prompts: int) -> dict[str, Any]:
    """One vllm.benchmarks.serve run; the summary numbers."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(
        [
            "--backend",
            "openai",
            "--base-url",
            url,
            "--endpoint",
            "/v1/completions",
            "--model",
            model_dir.name,
            "--tokenizer",
            str(model_dir),
            "--dataset-name",
            "random",
            "--random-input-len",
            str(INPUT_LEN),
            "--random-output-len",
            str(OUTPUT_LEN),
            "--num-prompts",
            str(num_prompts),
            "--max-concurrency",
            str(concurrency),
            "--ignore-eos",
            "--seed",
            "0",
            "--num-warmups",
            "2",
            "--disable-tqdm",
            "--percentile-metrics",
            "ttft,tpot,e2el",
            "--metric-percentiles",
            "50,99",
        ]
    )
    result = main(args)
    keep = (
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
    return {k: result.get(k) for k in keep}


def sweep(server: ServerProc, model_dir: Path, levels: list[int]) -> dict[int, dict[str, Any]]:
    out = {}
    for c in levels:
        out[c] = run_vllm_bench(server.url, model_dir, c, prompts_for(c))
        print(
            f"  c={c}: {out[c]['output_throughput']:.1f} tok/s, "
            f"P99 TTFT {out[c]['p99_ttft_ms']:.0f} ms",
            flush=True,
        )
    return out


def render(
    results: dict[str, list[dict[int, dict[str, Any]]]], levels: list[int], meta: dict[str, Any]
) -> str:
    """The markdown table: medians over rounds, and the appliance/vLLM ratios."""

    def med(side: str, c: int, key: str) -> float:
        return statistics.median(r[c][key] for r in results[side])

    lines = [
        "## Appliance vs vLLM's OpenAI server (issue 2)",
        "",
        f"Measured {meta['date']} with `{meta['command']}` on {meta['machine']}: "
        f"SmolLM2-135M-Instruct bf16, vLLM {meta['vllm']} CPU engine, KV cache {KV_GIB:g} GiB, "
        f"max_num_seqs {MAX_NUM_SEQS}, random {INPUT_LEN} in / {OUTPUT_LEN} out (ignore_eos), "
        f"`vllm.benchmarks.serve` against `/v1/completions`; {meta['rounds']} round(s), "
        "medians shown. The two servers ran one after the other, never at once.",
        "",
        "| concurrency | prompts | appliance tok/s | vLLM tok/s | tok/s ratio (>= 1.0) | "
        "appliance P99 TTFT ms | vLLM P99 TTFT ms | P99 TTFT ratio (<= 1.0) | failed (a/v) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in levels:
        a_tps, v_tps = med("appliance", c, "output_throughput"), med("vllm", c, "output_throughput")
        a_ttft, v_ttft = med("appliance", c, "p99_ttft_ms"), med("vllm", c, "p99_ttft_ms")
        fa = sum(r[c]["failed"] for r in results["appliance"])
        fv = sum(r[c]["failed"] for r in results["vllm"])
        lines.append(
            f"| {c} | {prompts_for(c)} | {a_tps:.1f} | {v_tps:.1f} | {a_tps / v_tps:.2f} | "
            f"{a_ttft:.0f} | {v_ttft:.0f} | {a_ttft / v_ttft:.2f} | {fa}/{fv} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    args = parser.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]

    from appliance.model_prep import prepare_default_model

    model_dir = prepare_default_model(ROOT / "state" / "models" / "SmolLM2-135M-Instruct")
    results: dict[str, list[dict[int, dict[str, Any]]]] = {"appliance": [], "vllm": []}
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        for r in range(args.rounds):
            # Alternate who goes first, so warm caches or a drifting machine favour neither.
            order = ("appliance", "vllm") if r % 2 == 0 else ("vllm", "appliance")
            for side in order:
                port = free_port()
                print(f"round {r + 1}: starting {side}", flush=True)
                if side == "appliance":
                    server = start_appliance(
                        {
                            "server": {"port": port},
                            "engine": {
                                "model": str(model_dir),
                                "max_model_len": MAX_MODEL_LEN,
                                "max_num_seqs": MAX_NUM_SEQS,
                                "kv_cache_space_gib": KV_GIB,
                            },
                            # Admission must not be the bottleneck in a like-for-like run:
                            # the limit at the engine's own max_num_seqs, held there (the
                            # controller would steer it to the SLO, which vLLM's server
                            # does not have), and no queue timeout shorter than vLLM's.
                            "admission": {
                                "concurrency_limit": MAX_NUM_SEQS,
                                "max_queue_wait_s": 3600,
                            },
                            "controller": {"mode": "manual"},
                            "logging": {"level": "warning"},
                        },
                        Path(tmp) / f"appliance-{r}",
                    )
                else:
                    server = start_vllm_server(
                        model_dir,
                        port,
                        Path(tmp) / f"vllm-{r}.log",
                        KV_GIB,
                        MAX_MODEL_LEN,
                        MAX_NUM_SEQS,
                    )
                try:
                    results[side].append(sweep(server, model_dir, levels))
                finally:
                    server.stop()
    import vllm

    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "command": "python bench/compare_vllm.py --concurrency "
        f"{args.concurrency} --rounds {args.rounds}",
        "machine": "2 cores / 24 GiB, no GPU",
        "vllm": vllm.__version__,
        "rounds": args.rounds,
    }
    section = render(results, levels, meta)
    print(section)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_section(out, "compare_vllm", section)
    (out.parent / "bench-compare-vllm.json").write_text(
        json.dumps({"meta": meta, "results": results}, indent=1, default=str)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
