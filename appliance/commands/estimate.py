"""`appliance estimate`: the memory plan for a model on a device, and which GPUs fit it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from appliance.domain.estimator import (
    DEFAULT_USABLE_FRACTION,
    GIB,
    EstimateInputError,
    MemoryPlan,
    ModelConfigError,
    estimate,
)
from appliance.domain.hardware import HardwareAdvice, advise
from appliance.model_info import load_model_spec

BAD_INPUT_EXIT = 2


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def register(sub: Any) -> None:
    """Add `estimate --model ... --gpu-memory-gib N [...]` to the CLI's sub-parsers."""
    p = sub.add_parser(
        "estimate",
        help="memory plan: weights, KV cache, buffers, margin; exit 1 if it does not fit",
        description="Plan memory for a model (folder or config.json) on one device.",
    )
    p.add_argument("--model", required=True, help="model folder or config.json")
    p.add_argument(
        "--gpu-memory-gib",
        type=_positive_float,
        required=True,
        help="memory of one device in GiB (host RAM with --device cpu)",
    )
    p.add_argument("--seq-len", type=_positive_int, help="tokens per sequence (default 2048)")
    p.add_argument("--batch-size", type=_positive_int, default=1, help="concurrent sequences")
    p.add_argument("--kv-dtype", default="auto", help="KV cache dtype (auto, fp8, bfloat16...)")
    p.add_argument("--v-kv-dtype", help="V cache dtype when it differs from K")
    p.add_argument("--dtype", default="auto", help="weight dtype (auto = the checkpoint's)")
    p.add_argument("--tensor-parallel-size", type=_positive_int, default=1)
    p.add_argument(
        "--usable-fraction",
        type=_fraction,
        default=DEFAULT_USABLE_FRACTION,
        help="cap: share of device memory the plan may use, safety margin included "
        f"(default {DEFAULT_USABLE_FRACTION})",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=_fraction,
        help="check vLLM's gpu_memory_utilization (engine.gpu_memory_utilization) as the "
        "daemon does: KV is what that share leaves, and share + margin must stay within the cap",
    )
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument(
        "--kv-cache-space-gib",
        type=_positive_float,
        help="fixed KV space (the CPU engine's VLLM_CPU_KVCACHE_SPACE)",
    )
    p.add_argument("--block-size", type=_positive_int, help="KV block size (default: vLLM's)")
    p.add_argument("--max-num-batched-tokens", type=_positive_int)
    p.add_argument("--max-num-seqs", type=_positive_int)
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=run)


def _g(n: int | float) -> str:
    return f"{n / GIB:8.2f} GiB"


def _line(label: str, value: str, note: str = "") -> str:
    return f"  {label:<22}{value}" + (f"   {note}" if note else "")


def render_plan(plan: MemoryPlan, advice: HardwareAdvice | None) -> str:
    """The plan as aligned tables: components, recommendations, batch table, hardware."""
    p = plan
    runtime_note = (
        f"activations {p.activation_bytes / GIB:.2f}, logits {p.logits_bytes / GIB:.2f}, "
        f"fixed {p.runtime_fixed_bytes / GIB:.2f}"
    )
    kv_note = (
        f"K {p.k_dtype}, V {p.v_dtype}; {p.kv_bytes_per_token_at_seq_len} B averaged "
        f"over {p.seq_len} tokens"
    )
    out = [
        f"Memory plan: {p.model} on {p.device}, {p.device_memory_bytes / GIB:.2f} GiB per device"
        f" (TP {p.tensor_parallel_size}), {p.batch_size} x {p.seq_len} tokens",
        _line(f"usable ({p.usable_fraction:.0%} cap)", _g(p.usable_bytes)),
        _line(
            "engine share",
            _g(p.engine_memory_bytes),
            f"gpu_memory_utilization {p.gpu_memory_utilization:g} (configured)"
            if p.gpu_memory_utilization is not None
            else "usable - safety margin",
        ),
        _line(f"weights ({p.weight_dtype})", _g(p.weights_bytes), p.weights_source),
        _line("runtime buffers", _g(p.runtime_buffers_bytes), runtime_note),
        _line("safety margin", _g(p.safety_margin_bytes)),
        _line("KV budget", _g(p.kv_budget_bytes), p.kv_budget_source),
        _line("KV per token", f"{p.kv_bytes_per_token:>8} B  ", kv_note),
        _line("KV for the batch", _g(p.kv_cache_bytes)),
        _line("KV headroom", _g(p.headroom_bytes)),
        f"  => {p.reason}",
        "",
        f"KV capacity: {p.kv_capacity_tokens:,} tokens in {p.num_kv_blocks:,} blocks of "
        f"{p.block_size}; vLLM would report {p.vllm_kv_cache_size_tokens:,}; "
        f"{p.max_concurrent_seqs} sequences of {p.seq_len} at once",
        f"Recommended: max_num_seqs {p.recommended_max_num_seqs}, gpu_memory_utilization "
        f"{p.recommended_gpu_memory_utilization:.2f}, max_model_len {p.recommended_max_model_len}"
        f" (for {p.batch_size} sequences), block_size {p.vllm_block_size} (vLLM's pick; "
        f"rule of thumb {p.block_size_rule_of_thumb})",
        f"Naive formula (batch x seq x 2 x hidden x layers x dtype x 1.15): "
        f"{p.naive_kv_bytes / GIB:.2f} GiB vs {p.kv_cache_bytes / GIB:.2f} GiB computed "
        f"({p.naive_error_ratio:.2f}x)",
    ]
    out += [f"Note: {n}" for n in p.notes]
    out += [
        "",
        f"Batch table at {p.batch_table[0].seq_len if p.batch_table else 0} tokens:",
        f"  {'batch':>5}  {'KV cache':>12}  {'total':>12}  {'headroom':>12}  fits",
    ]
    for row in p.batch_table:
        out.append(
            f"  {row.batch_size:>5}  {_g(row.kv_cache_bytes)}  {_g(row.total_bytes)}  "
            f"{_g(row.headroom_bytes)}  {'yes' if row.fits else 'no'}"
        )
    if advice is not None:
        out += [
            "",
            f"Hardware for {advice.concurrency} x {advice.seq_len} tokens (KV {advice.kv_dtype}):",
            f"  {'GPU':<11} {'count':>5}  fits  {'seqs':>5}  notes",
        ]
        for o in advice.options:
            out.append(
                f"  {o.gpu:<11} {o.count:>5}  {'yes ' if o.fits else 'no  '}  "
                f"{o.max_concurrent_seqs:>5}  {'; '.join(o.notes)}"
            )
        best = advice.recommended
        out.append(
            f"  => {best.count} x {best.gpu}" if best else "  => no listed GPU fits even at TP 8"
        )
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    """Print the plan; 0 when it fits, 1 when it does not, 2 on bad input."""
    try:
        spec = load_model_spec(args.model)
        plan = estimate(
            spec,
            device_memory_bytes=round(args.gpu_memory_gib * GIB),
            seq_len=args.seq_len,
            batch_size=args.batch_size,
            kv_dtype=args.kv_dtype,
            v_dtype=args.v_kv_dtype,
            weight_dtype=args.dtype,
            device=args.device,
            usable_fraction=args.usable_fraction,
            gpu_memory_utilization=args.gpu_memory_utilization,
            tensor_parallel_size=args.tensor_parallel_size,
            block_size=args.block_size,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            kv_cache_bytes_budget=(
                round(args.kv_cache_space_gib * GIB) if args.kv_cache_space_gib else None
            ),
        )
        advice = None
        if args.device == "cuda":
            try:
                advice = advise(
                    spec,
                    seq_len=plan.seq_len,
                    concurrency=plan.batch_size,
                    kv_dtype=args.kv_dtype,
                    weight_dtype=args.dtype,
                    usable_fraction=args.usable_fraction,
                )
            except EstimateInputError:
                advice = None  # no TP size divides the heads; the plan itself still stands
    except (ModelConfigError, EstimateInputError) as exc:
        print(f"estimate: {exc}", file=sys.stderr)
        return BAD_INPUT_EXIT
    if args.json:
        doc: dict[str, Any] = {"plan": plan.to_dict()}
        doc["hardware"] = advice.to_dict() if advice else None
        print(json.dumps(doc, indent=2))
    else:
        print(render_plan(plan, advice))
    return 0 if plan.fits else 1
