#!/usr/bin/env python3
"""Check the appliance's memory estimator against real torch allocations, and read NVML.

Run from the repository root: `python3 scripts/gpu_check.py --out gpu_check.json`. Progress
lines go to stderr; one JSON file goes to --out, rewritten after every section, so a run cut
short still leaves what it measured. Each section is recorded on its own: one that fails keeps
its error in the JSON ("status": "error") and the rest still run.

1. nvml: one full sample per GPU and the sampling time, through scripts/gpu_sample_check.py.
2. cuda_context: NVML's used memory before CUDA starts and after a context, a first allocation
   and a first matmul, against estimator.RUNTIME_FIXED_BYTES["cuda"].
3. weights: estimator.weights_bytes against the model transformers builds from the same
   config.json (parameters x 2 bytes for bf16, and torch.cuda.memory_allocated on a GPU).
4. kv_cache: the KV pool the estimator plans for a fixed budget, allocated as vLLM allocates
   it (one [2, blocks, block_size, kv_heads, head_dim] tensor per layer).
5. activation: the peak of one forward pass over T tokens against estimator.runtime_buffers.
6. estimate: estimator.estimate() for Llama-3.1-8B on this GPU, for the docs.
7. after_load: NVML after the load, and the memory used outside torch's allocator.

Without a CUDA GPU (or with --cpu) sections 3 and 4 run on the CPU with SmolLM2-135M (the other
models' parameters are counted on the meta device, which allocates nothing) and the GPU-only
sections say {"gpu": false}. Nothing here changes a GPU setting: it reads NVML and allocates
memory. Exit status 0 when every section ran, 1 when one failed.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import io
import json
import os
import platform
import re
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

# Only the pure estimator, the config reader and the NVML adapter: none of them pulls in the
# daemon's dependencies (pydantic, aiohttp, yaml, apscheduler, textual), which the GPU box lacks.
from appliance.adapters.nvml import NvmlTelemetry
from appliance.domain import estimator as est
from appliance.model_info import load_model_spec, spec_from_config

if TYPE_CHECKING:
    import torch

ROOT = Path(__file__).resolve().parents[2]

GIB = est.GIB
MIB = est.MIB
DTYPE = "bfloat16"

SMOL = "SmolLM2-135M-Instruct"
QWEN_05B = "Qwen2.5-0.5B"
QWEN_7B = "Qwen2.5-7B-Instruct"
MISTRAL = "Mistral-7B-Instruct-v0.3"
LLAMA = "Llama-3.1-8B-Instruct"

# The models' own config.json files, as published (SmolLM2's is the copy in
# state/models/SmolLM2-135M-Instruct). Only geometry matters for memory; the rest is kept so
# spec_from_config reads exactly what it reads in production.
MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    SMOL: {
        "_model_name_or_path": "Smollm2 135M 8k Lc100K Mix1 Ep2",
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "dtype": "bfloat16",
        "eos_token_id": 2,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 576,
        "initializer_range": 0.02,
        "intermediate_size": 1536,
        "max_position_embeddings": 8192,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 9,
        "num_hidden_layers": 30,
        "num_key_value_heads": 3,
        "pad_token_id": 2,
        "pretraining_tp": 1,
        "rms_norm_eps": 9.999999747378752e-06,
        "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
        "tie_word_embeddings": True,
        "transformers_version": "5.19.0",
        "unk_token_id": 0,
        "use_cache": True,
        "vocab_size": 49152,
    },
    QWEN_05B: {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "hidden_act": "silu",
        "hidden_size": 896,
        "initializer_range": 0.02,
        "intermediate_size": 4864,
        "max_position_embeddings": 32768,
        "max_window_layers": 24,
        "model_type": "qwen2",
        "num_attention_heads": 14,
        "num_hidden_layers": 24,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.40.1",
        "use_cache": True,
        "use_mrope": False,
        "use_sliding_window": False,
        "vocab_size": 151936,
    },
    QWEN_7B: {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "hidden_act": "silu",
        "hidden_size": 3584,
        "initializer_range": 0.02,
        "intermediate_size": 18944,
        "max_position_embeddings": 32768,
        "max_window_layers": 28,
        "model_type": "qwen2",
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 131072,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.43.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 152064,
    },
    MISTRAL: {
        "architectures": ["MistralForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "model_type": "mistral",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.42.0.dev0",
        "use_cache": True,
        "vocab_size": 32768,
    },
    LLAMA: {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.43.0.dev0",
        "use_cache": True,
        "vocab_size": 128256,
    },
}
# Parameter totals the checkpoints' safetensors metadata publish: a reference independent of
# both the estimator and transformers.
PUBLISHED_PARAMS: dict[str, int] = {
    SMOL: 134_515_008,
    QWEN_05B: 494_032_768,
    QWEN_7B: 7_615_616_512,
    MISTRAL: 7_248_023_552,
    LLAMA: 8_030_261_248,
}
SMALL_MODELS = (SMOL, QWEN_05B)
LOCAL_SMOL_DIR = ROOT / "state" / "models" / SMOL

GPU_KV_BUDGET = 8 * GIB
# The CPU engine's KV space is a few GiB; a quarter GiB of untouched torch.empty costs nothing.
CPU_KV_BUDGET = 256 * MIB
# (sequences, tokens each): T = 2048 and 8192 in one sequence, and 8192 as four sequences.
ACTIVATION_SHAPES: tuple[tuple[int, int], ...] = ((1, 2048), (1, 8192), (4, 2048))
# The first forward loads kernels and allocates cuBLAS's workspace through torch's allocator;
# a short pass first keeps that out of the measured peaks.
WARMUP_TOKENS = 128
NVML_SAMPLES = 200
NVML_SAMPLES_QUICK = 50
DEFAULT_BUDGET_S = 200.0
# Rough upper bounds of an item's seconds on an H200: an item that would not finish within
# --budget-s is skipped (and the JSON says so) rather than run past the borrowed device time.
NEED_S_SMALL = 5.0
NEED_S_LARGE = 25.0
NEED_S_ACTIVATION_LARGE = 60.0
ESTIMATE_SUMMARY_KEYS = (
    "model",
    "device_memory_bytes",
    "usable_bytes",
    "weights_bytes",
    "activation_bytes",
    "logits_bytes",
    "runtime_fixed_bytes",
    "runtime_buffers_bytes",
    "safety_margin_bytes",
    "kv_budget_bytes",
    "kv_bytes_per_token",
    "num_kv_blocks",
    "block_size",
    "kv_capacity_tokens",
    "max_num_batched_tokens",
    "max_num_seqs",
    "seq_len",
    "max_concurrent_seqs",
    "recommended_gpu_memory_utilization",
    "recommended_max_num_seqs",
    "recommended_max_model_len",
    "engine_memory_bytes",
    "fits",
    "reason",
)


@dataclass
class Run:
    """One run's settings, its NVML handle, and the JSON result it builds up."""

    out: Path
    quick: bool
    budget_s: float
    cuda: bool = False
    cuda_reason: str = ""
    nv: NvmlTelemetry | None = None
    # NVML's index of the GPU torch calls cuda:0 (CUDA_VISIBLE_DEVICES' first entry, else 0).
    gpu_index: int = 0
    baseline_used_bytes: int | None = None
    started: float = field(default_factory=time.monotonic)
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> str:
        """Where real tensors go: "cuda" or "cpu"."""
        return "cuda" if self.cuda else "cpu"

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self.started

    def left(self) -> float:
        """Seconds left of --budget-s."""
        return self.budget_s - self.elapsed()

    def log(self, message: str) -> None:
        """One progress line on stderr (stdout stays free for a caller that captures it)."""
        print(f"[gpu_check {self.elapsed():6.1f}s] {message}", file=sys.stderr, flush=True)

    def save(self) -> None:
        """Write the result so far; replace atomically so a reader never sees half a file."""
        self.result["elapsed_s"] = round(self.elapsed(), 2)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_name(self.out.name + ".tmp")
        tmp.write_text(json.dumps(self.result, indent=2, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, self.out)


Section = Callable[[Run], dict[str, Any]]


# -- helpers --------------------------------------------------------------------------------


def _error_body(exc: BaseException) -> dict[str, Any]:
    return {
        "status": "error",
        "error": f"{type(exc).__name__}: {exc}",
        "traceback": traceback.format_exc(limit=8),
    }


def run_section(run: Run, name: str, fn: Section) -> None:
    """Run one section; its result or its error goes into the JSON, which is saved."""
    run.log(f"{name}: start")
    t0 = time.monotonic()
    try:
        body = fn(run)
        body.setdefault("status", "ok")
    except Exception as exc:  # one failed section must not cost the others their results
        body = _error_body(exc)
        run.result["errors"].append({"section": name, "error": body["error"]})
    body["elapsed_s"] = round(time.monotonic() - t0, 2)
    run.result["sections"][name] = body
    run.log(f"{name}: {body['status']} in {body['elapsed_s']} s")
    run.save()


def _guarded(
    run: Run, label: str, need_s: float, fn: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """One model inside a section: skipped when the budget is short, its error kept."""
    if run.left() < need_s:
        run.log(f"{label}: skipped, {run.left():.0f} s left of the budget, needs ~{need_s:.0f}")
        return {"status": "skipped", "reason": f"time budget: {run.left():.0f} s left"}
    try:
        body = fn()
        body.setdefault("status", "ok")
        return body
    except Exception as exc:  # e.g. out of memory on one model: the next one still runs
        body = _error_body(exc)
        run.result["errors"].append({"section": label, "error": body["error"]})
        run.log(f"{label}: {body['error']}")
        return body
    finally:
        _free(run)


def _no_gpu(run: Run) -> dict[str, Any]:
    return {"gpu": False, "status": "skipped", "reason": run.cuda_reason}


def _free(run: Run) -> None:
    """Drop what the last model left, and hand cached blocks back so the next delta is clean."""
    gc.collect()
    if run.cuda:
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _allocated(run: Run) -> int:
    if not run.cuda:
        return 0
    import torch

    torch.cuda.synchronize()
    return int(torch.cuda.memory_allocated())


def _reset_peak(run: Run) -> None:
    if run.cuda:
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak(run: Run) -> int:
    if not run.cuda:
        return 0
    import torch

    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated())


def _nvml_used(run: Run) -> int | None:
    """NVML's used bytes on the GPU torch uses (device-wide, every process's share)."""
    if run.nv is None or not run.nv.available:
        return None
    for sample in run.nv.sample():
        if sample.index == run.gpu_index:
            return sample.mem_used_bytes
    return None


def _mib(n: float | None) -> float | None:
    return None if n is None else round(n / MIB, 1)


def _compare(estimate: int, measured: int) -> dict[str, Any]:
    """Estimate against measurement: difference, ratio, and a sentence saying which is larger."""
    diff = estimate - measured
    ratio = estimate / measured if measured else None
    side = "equal" if diff == 0 else "above" if diff > 0 else "below"
    if diff == 0:
        verdict = "estimate equals the measurement"
    else:
        pct = f" ({diff / measured:+.1%})" if measured else ""
        verdict = f"estimate is {side} the measurement by {abs(diff) / MIB:.1f} MiB{pct}"
    return {
        "estimate_bytes": estimate,
        "measured_bytes": measured,
        "estimate_minus_measured_bytes": diff,
        "estimate_over_measured": None if ratio is None else round(ratio, 4),
        "estimate_side": side,
        "verdict": verdict,
    }


def _load_script(name: str) -> ModuleType:
    """Import a script of scripts/ by path (it is not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _transformers() -> ModuleType:
    """transformers, imported only after the CUDA-context section: its import may probe CUDA."""
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def _dtype_kwarg() -> str:
    # transformers 4.56 renamed from_config's torch_dtype to dtype; 5.x warns on the old name.
    version = _transformers().__version__
    major, minor = (int(part) for part in re.findall(r"\d+", version)[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def _hf_config(cfg: dict[str, Any], **overrides: Any) -> Any:
    _transformers()
    from transformers import AutoConfig

    return AutoConfig.for_model(**{**cfg, **overrides})


def _build(config: Any, device: str, attn: str | None = None) -> torch.nn.Module:
    """The model with random bf16 weights, allocated directly on `device` (meta: nowhere)."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {_dtype_kwarg(): torch.bfloat16}
    if attn is not None:
        kwargs["attn_implementation"] = attn
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, **kwargs)
    return model.eval()


def _pick_models(run: Run) -> tuple[str, ...]:
    return SMALL_MODELS if run.quick else tuple(MODEL_CONFIGS)


# -- 1. NVML --------------------------------------------------------------------------------


def section_nvml(run: Run) -> dict[str, Any]:
    """gpu_sample_check's own check (one sample per GPU, sampling time), captured as JSON."""
    check = _load_script("gpu_sample_check")
    count = NVML_SAMPLES_QUICK if run.quick else NVML_SAMPLES
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        status = check.main(["--count", str(count)])
    report: dict[str, Any] = json.loads(captured.getvalue())
    report["exit_status"] = status
    if report.get("gpu"):
        # The readings a reader looks for first, pulled out of the full samples.
        report["temperatures"] = [
            {
                key: s.get(key)
                for key in ("index", "name", "core_temp_c", "mem_temp_c", "power_w", "sm_clock_mhz")
            }
            for s in report.get("samples", [])
        ]
        timing = report.get("timing", {})
        run.log(
            f"nvml: {report.get('gpu_count')} GPU(s), median {timing.get('median_ms')} ms, "
            f"p99 {timing.get('p99_ms')} ms, max {timing.get('max_ms')} ms"
        )
    return report


# -- 2. CUDA context ------------------------------------------------------------------------


def section_cuda_context(run: Run) -> dict[str, Any]:
    """What CUDA costs before torch allocates anything, read by NVML around each step."""
    if not run.cuda:
        return _no_gpu(run)
    import torch

    before = _nvml_used(run)
    torch.cuda.init()
    after_init = _nvml_used(run)
    tiny = torch.zeros(1, device=run.device)
    torch.cuda.synchronize()
    after_alloc, reserved_alloc = _nvml_used(run), int(torch.cuda.memory_reserved())
    # The first matmul creates the cuBLAS handle and its workspace, which every engine pays.
    a = torch.randn(1024, 1024, device=run.device, dtype=torch.bfloat16)
    product = a @ a
    torch.cuda.synchronize()
    after_matmul, reserved_matmul = _nvml_used(run), int(torch.cuda.memory_reserved())
    del tiny, a, product
    fixed = est.RUNTIME_FIXED_BYTES["cuda"]
    props = torch.cuda.get_device_properties(0)
    body: dict[str, Any] = {
        "gpu": True,
        "device_name": torch.cuda.get_device_name(0),
        "torch_uuid": str(getattr(props, "uuid", "")),
        "nvml_index": run.gpu_index,
        "nvml_used_at_start_bytes": run.baseline_used_bytes,
        "nvml_used_before_cuda_init_bytes": before,
        "nvml_used_after_cuda_init_bytes": after_init,
        "nvml_used_after_first_alloc_bytes": after_alloc,
        "torch_reserved_after_first_alloc_bytes": reserved_alloc,
        "nvml_used_after_first_matmul_bytes": after_matmul,
        "torch_reserved_after_first_matmul_bytes": reserved_matmul,
        "estimator_runtime_fixed_bytes": fixed,
        "note": "RUNTIME_FIXED_BYTES also covers NCCL and vLLM's CUDA-graph pool, not measured "
        "here; NVML counts the whole device, so another process's memory would show too",
    }
    if before is not None and after_alloc is not None and after_matmul is not None:
        context = after_alloc - before - reserved_alloc
        with_cublas = after_matmul - before - reserved_matmul
        body["context_bytes"] = context
        body["context_and_cublas_bytes"] = with_cublas
        body["estimator_fixed_vs_context_and_cublas"] = _compare(fixed, with_cublas)
        run.log(
            f"cuda_context: context {_mib(context)} MiB, with cuBLAS {_mib(with_cublas)} MiB; "
            f"estimator keeps {_mib(fixed)} MiB"
        )
    return body


# -- 3. weights -----------------------------------------------------------------------------


def _weights_one(run: Run, name: str, device: str) -> dict[str, Any]:
    cfg = MODEL_CONFIGS[name]
    spec = spec_from_config(cfg, name=name)
    est_bytes = est.weights_bytes(spec, DTYPE)
    est_count = est.estimated_param_count(spec)
    config = _hf_config(cfg)
    before = _allocated(run)
    _reset_peak(run)
    t0 = time.monotonic()
    model = _build(config, device)
    build_s = time.monotonic() - t0
    allocated = _allocated(run) - before
    peak = _peak(run) - before
    # named_parameters() lists a shared tensor once, so a tied lm_head is not counted twice.
    params = dict(model.named_parameters())
    count = sum(p.numel() for p in params.values())
    param_bytes = sum(p.numel() * p.element_size() for p in params.values())
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in params.values()})
    out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
    tied = out_emb is not None and out_emb.weight is in_emb.weight
    del model, params, out_emb, in_emb
    numel_x2 = count * est.DTYPE_BYTES[DTYPE]
    entry: dict[str, Any] = {
        "device": device,
        "build_s": round(build_s, 2),
        "spec_tie_word_embeddings": spec.tie_word_embeddings,
        "hf_tied_embeddings": tied,
        "hf_param_dtypes": dtypes,
        "published_param_count": PUBLISHED_PARAMS[name],
        "estimator_param_count": est_count,
        "hf_param_count": count,
        "estimator_weights_bytes": est_bytes,
        "hf_numel_x2_bytes": numel_x2,
        "hf_param_bytes": param_bytes,
        "hf_buffer_bytes": buffer_bytes,
        "estimator_vs_numel_x2": _compare(est_bytes, numel_x2),
        "estimator_count_equals_published": est_count == PUBLISHED_PARAMS[name],
    }
    if run.cuda and device != "meta":
        # Allocated also holds the (float32) rotary buffers and the allocator's 512-byte rounding.
        entry["cuda_allocated_bytes"] = allocated
        entry["cuda_peak_during_build_bytes"] = peak
        entry["estimator_vs_cuda_allocated"] = _compare(est_bytes, allocated)
    shown = f", allocated {_mib(allocated)} MiB" if run.cuda and device != "meta" else ""
    run.log(
        f"weights/{name} ({device}): estimator {_mib(est_bytes)} MiB, numel x 2 "
        f"{_mib(numel_x2)} MiB{shown}; {entry['estimator_vs_numel_x2']['verdict']}"
    )
    return entry


def _local_checkpoint() -> dict[str, Any]:
    """The estimator's weights from the safetensors headers of the local SmolLM2 folder."""
    spec = load_model_spec(LOCAL_SMOL_DIR)
    from_config = spec_from_config(MODEL_CONFIGS[SMOL], name=SMOL)
    return {
        "path": str(LOCAL_SMOL_DIR.relative_to(ROOT)),
        "header_param_count": spec.param_count,
        "header_param_bytes": spec.param_bytes,
        "weights_source": est.weights_source(spec),
        "estimator_weights_bytes_from_headers": est.weights_bytes(spec, DTYPE),
        "estimator_weights_bytes_from_config": est.weights_bytes(from_config, DTYPE),
    }


def section_weights(run: Run) -> dict[str, Any]:
    """Weights per model; without a GPU only SmolLM2 is allocated, the rest counted on meta."""
    models: dict[str, Any] = {}
    for name in _pick_models(run):
        real = run.cuda or name == SMOL
        device = run.device if real else "meta"
        need = NEED_S_SMALL if name in SMALL_MODELS or not real else NEED_S_LARGE
        models[name] = _guarded(
            run, f"weights/{name}", need, lambda n=name, d=device: _weights_one(run, n, d)
        )
    body: dict[str, Any] = {"gpu": run.cuda, "dtype": DTYPE, "models": models}
    if LOCAL_SMOL_DIR.is_dir():
        body["local_checkpoint"] = _local_checkpoint()
    return body


# -- 4. KV cache ----------------------------------------------------------------------------


def _kv_one(run: Run, name: str, budget: int) -> dict[str, Any]:
    import torch

    cfg = MODEL_CONFIGS[name]
    spec = spec_from_config(cfg, name=name)
    block = est.vllm_block_size(spec, "cuda" if run.cuda else "cpu")
    blocks = est.kv_pool_blocks(spec, budget, block, DTYPE)
    block_bytes = est.kv_block_bytes(spec, block, DTYPE)
    # The tensor geometry comes from transformers' config, not from the spec, so the check also
    # covers spec_from_config's reading of heads and head_dim.
    config = _hf_config(cfg)
    layers = int(config.num_hidden_layers)
    kv_heads = int(config.num_key_value_heads)
    head_dim = int(
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )
    shape = (2, blocks, block, kv_heads, head_dim)
    before = _allocated(run)
    # vLLM zero-fills one int8 buffer per layer and views it as this shape; the bytes are the
    # same, and empty() keeps a CPU run from touching a quarter GiB of pages.
    tensors = [torch.empty(shape, dtype=torch.bfloat16, device=run.device) for _ in range(layers)]
    allocated = _allocated(run) - before
    tensor_bytes = sum(t.numel() * t.element_size() for t in tensors)
    del tensors
    est_pool = blocks * block_bytes
    tokens = blocks * block
    entry: dict[str, Any] = {
        "device": run.device,
        "budget_bytes": budget,
        "block_size": block,
        "num_blocks": blocks,
        "tensor_shape_per_layer": list(shape),
        "layers": layers,
        "estimator_kv_block_bytes": block_bytes,
        "estimator_pool_bytes": est_pool,
        "tensor_bytes": tensor_bytes,
        "estimator_vs_tensor_bytes": _compare(est_pool, tensor_bytes),
        "capacity_tokens": tokens,
        "estimator_kv_capacity_tokens": est.kv_capacity_tokens(spec, budget, block, DTYPE),
        "estimator_kv_bytes_per_token": est.kv_bytes_per_token(spec, DTYPE),
        "measured_kv_bytes_per_token": tensor_bytes // tokens if tokens else None,
        "spec_geometry_matches_config": (spec.num_layers, spec.num_kv_heads, spec.head_dim)
        == (layers, kv_heads, head_dim),
    }
    if run.cuda:
        entry["cuda_allocated_bytes"] = allocated
        entry["estimator_vs_cuda_allocated"] = _compare(est_pool, allocated)
    run.log(
        f"kv_cache/{name}: {blocks} blocks of {block}, estimator {_mib(est_pool)} MiB, "
        f"tensors {_mib(tensor_bytes)} MiB"
        + (f", allocated {_mib(allocated)} MiB" if run.cuda else "")
    )
    return entry


def section_kv_cache(run: Run) -> dict[str, Any]:
    """The estimator's KV pool for a fixed budget, allocated for real."""
    budget = GPU_KV_BUDGET if run.cuda else CPU_KV_BUDGET
    names = _pick_models(run) if run.cuda else (SMOL,)
    models = {
        name: _guarded(
            run, f"kv_cache/{name}", NEED_S_SMALL, lambda n=name: _kv_one(run, n, budget)
        )
        for name in names
    }
    return {"gpu": run.cuda, "dtype": DTYPE, "budget_bytes": budget, "models": models}


# -- 5. activation peak ---------------------------------------------------------------------


def _forward_peaks(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, Any]:
    """Peaks above the weights: the base model alone, lm_head on the last token, HF's whole."""
    import torch

    base = model.base_model
    head = model.get_output_embeddings()
    assert head is not None
    with torch.no_grad():
        # use_cache=False: HF would otherwise keep a KV cache of every layer, which vLLM's
        # activation profile does not hold (its KV cache is the separate pool).
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        hidden = base(input_ids=ids, use_cache=False).last_hidden_state
        torch.cuda.synchronize()
        hidden_peak = torch.cuda.max_memory_allocated() - before
        hidden_bytes = hidden.numel() * hidden.element_size()
        mid = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        last = head(hidden[:, -1, :])  # vLLM computes logits for each sequence's last token
        torch.cuda.synchronize()
        head_peak = torch.cuda.max_memory_allocated() - mid
        last_bytes = last.numel() * last.element_size()
        del hidden, last
        torch.cuda.synchronize()
        before_full = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        logits = model(input_ids=ids, use_cache=False).logits  # HF: logits for every token
        torch.cuda.synchronize()
        full_peak = torch.cuda.max_memory_allocated() - before_full
        logits_bytes = logits.numel() * logits.element_size()
        logits_dtype = str(logits.dtype).removeprefix("torch.")
        del logits
    return {
        "hidden_peak_bytes": int(hidden_peak),
        "hidden_output_bytes": int(hidden_bytes),
        "lm_head_last_token_peak_bytes": int(head_peak),
        "last_token_logits_bytes": int(last_bytes),
        # Hidden state stays alive while lm_head runs, so the vLLM-like peak is the larger of
        # the base model's peak and hidden + lm_head's own peak.
        "vllm_like_peak_bytes": int(max(hidden_peak, hidden_bytes + head_peak)),
        "hf_full_peak_bytes": int(full_peak),
        "hf_logits_bytes": int(logits_bytes),
        "hf_logits_dtype": logits_dtype,
        "hf_full_peak_without_logits_bytes": int(full_peak - logits_bytes),
    }


def _activation_shape(
    run: Run, name: str, model: torch.nn.Module, seqs: int, tokens_each: int
) -> dict[str, Any]:
    import torch

    spec = spec_from_config(MODEL_CONFIGS[name], name=name)
    total = seqs * tokens_each
    ids = torch.randint(0, spec.vocab_size, (seqs, tokens_each), device=run.device)
    measured = _forward_peaks(model, ids)
    del ids
    rb = est.runtime_buffers(
        spec, max_num_batched_tokens=total, max_num_seqs=seqs, device="cuda", dtype=DTYPE
    )
    act_vs_hidden = _compare(rb.activation_bytes, measured["hidden_peak_bytes"])
    entry: dict[str, Any] = {
        "sequences": seqs,
        "tokens_per_sequence": tokens_each,
        "tokens": total,
        "attn_implementation": "sdpa",
        **measured,
        "hf_logits_formula_bytes": total * spec.vocab_size * est.DTYPE_BYTES[DTYPE],
        "estimator_activation_bytes": rb.activation_bytes,
        "estimator_logits_bytes": rb.logits_bytes,
        "estimator_activation_per_token_bytes": rb.activation_bytes // total,
        "measured_hidden_peak_per_token_bytes": measured["hidden_peak_bytes"] // total,
        "activation_vs_hidden_peak": act_vs_hidden,
        "activation_plus_logits_vs_vllm_like_peak": _compare(
            rb.activation_bytes + rb.logits_bytes, measured["vllm_like_peak_bytes"]
        ),
        "activation_plus_logits_vs_hf_full_peak": _compare(
            rb.activation_bytes + rb.logits_bytes, measured["hf_full_peak_bytes"]
        ),
    }
    run.log(
        f"activation/{name} {seqs}x{tokens_each}: estimator {_mib(rb.activation_bytes)} MiB, "
        f"hidden peak {_mib(measured['hidden_peak_bytes'])} MiB, HF full "
        f"{_mib(measured['hf_full_peak_bytes'])} MiB; {act_vs_hidden['verdict']}"
    )
    return entry


def _activation_model(run: Run, name: str, shapes: tuple[tuple[int, int], ...]) -> dict[str, Any]:
    import torch

    model = _build(_hf_config(MODEL_CONFIGS[name], use_cache=False), run.device, attn="sdpa")
    warm = torch.randint(0, 100, (1, WARMUP_TOKENS), device=run.device)
    _forward_peaks(model, warm)
    del warm
    # The model goes when this returns: the caller's _guarded then empties the cache.
    shapes_out = {
        f"{seqs}x{each}": _guarded(
            run,
            f"activation/{name}/{seqs}x{each}",
            NEED_S_SMALL,
            lambda s=seqs, e=each: _activation_shape(run, name, model, s, e),
        )
        for seqs, each in shapes
    }
    return {"shapes": shapes_out}


def _activation_verdicts(models: dict[str, Any]) -> dict[str, str]:
    """Per model and shape: is estimator.runtime_buffers' activation above the measured peak?"""
    out: dict[str, str] = {}
    for name, model in models.items():
        for shape, entry in model.get("shapes", {}).items():
            if entry.get("status") == "ok":
                out[f"{name} {shape}"] = entry["activation_vs_hidden_peak"]["verdict"]
    return out


def section_activation(run: Run) -> dict[str, Any]:
    """One forward pass per shape, its peak against estimator.runtime_buffers."""
    if not run.cuda:
        return _no_gpu(run)
    names = (SMOL,) if run.quick else (SMOL, LLAMA)
    shapes = ACTIVATION_SHAPES[:1] if run.quick else ACTIVATION_SHAPES
    models = {
        name: _guarded(
            run,
            f"activation/{name}",
            NEED_S_SMALL if name == SMOL else NEED_S_ACTIVATION_LARGE,
            lambda n=name: _activation_model(run, n, shapes),
        )
        for name in names
    }
    return {
        "gpu": True,
        "dtype": DTYPE,
        "models": models,
        "verdicts": _activation_verdicts(models),
        "how": "peaks are torch.cuda.max_memory_allocated above what was allocated before the "
        "pass (weights, input ids); hidden_peak is the base model alone (vLLM computes logits "
        "only for each sequence's last token: lm_head_last_token_peak), hf_full_peak includes "
        "HF's logits for every token. HF's eager RMSNorm upcasts to float32 and its MLP is "
        "unfused, so HF's peak is above vLLM's fused kernels' for the same tokens",
    }


# -- 6. estimate ----------------------------------------------------------------------------


def section_estimate(run: Run) -> dict[str, Any]:
    """The plan for Llama-3.1-8B on this GPU's real memory, for the docs."""
    if not run.cuda:
        return _no_gpu(run)
    import torch

    free, total = torch.cuda.mem_get_info()
    name = torch.cuda.get_device_name()
    major, minor = torch.cuda.get_device_capability()
    spec = spec_from_config(MODEL_CONFIGS[LLAMA], name=LLAMA)
    plan = est.estimate(
        spec,
        device_memory_bytes=int(total),
        device="cuda",
        device_name=name,
        compute_capability=major + minor / 10,
    )
    full = plan.to_dict()
    summary = {key: full[key] for key in ESTIMATE_SUMMARY_KEYS}
    gib = {k: round(v / GIB, 2) for k, v in summary.items() if k.endswith("_bytes")}
    run.log(
        f"estimate/{LLAMA}: weights {gib['weights_bytes']} GiB, KV {gib['kv_budget_bytes']} GiB, "
        f"buffers {gib['runtime_buffers_bytes']} GiB, margin {gib['safety_margin_bytes']} GiB, "
        f"max concurrency {plan.max_concurrent_seqs} at {plan.seq_len} tokens"
    )
    # The activation the plan reserves at its max_num_batched_tokens, beside the peak measured
    # for that many tokens in one sequence (section 5), when that was measured.
    shapes = run.result["sections"].get("activation", {}).get("models", {}).get(LLAMA, {})
    measured = shapes.get("shapes", {}).get(f"1x{plan.max_num_batched_tokens}", {})
    return {
        "gpu": True,
        "device_name": name,
        "compute_capability": f"{major}.{minor}",
        "measured_hidden_peak_at_max_num_batched_tokens_bytes": measured.get("hidden_peak_bytes"),
        "device_memory_bytes": int(total),
        "free_bytes_now": int(free),
        "summary": summary,
        "summary_gib": gib,
        "plan": full,
    }


# -- 7. after the load ----------------------------------------------------------------------


def section_after_load(run: Run) -> dict[str, Any]:
    """NVML once more (temperatures after the load); memory held outside torch's allocator."""
    if not run.cuda:
        return _no_gpu(run)
    import torch

    _free(run)
    samples = [s.to_dict() for s in run.nv.sample()] if run.nv is not None else []
    used = _nvml_used(run)
    reserved = int(torch.cuda.memory_reserved())
    body: dict[str, Any] = {
        "gpu": True,
        "samples": samples,
        "nvml_used_bytes": used,
        "torch_reserved_bytes": reserved,
        "torch_allocated_bytes": int(torch.cuda.memory_allocated()),
        "torch_max_reserved_bytes": int(torch.cuda.max_memory_reserved()),
    }
    if used is not None and run.baseline_used_bytes is not None:
        # Context, lazily loaded kernels (SDPA, GEMMs), cuBLAS: what the engine pays besides
        # what torch allocates, once every kernel this run used has been loaded.
        outside = used - run.baseline_used_bytes - reserved
        body["outside_torch_allocator_bytes"] = outside
        body["estimator_fixed_vs_outside_allocator"] = _compare(
            est.RUNTIME_FIXED_BYTES["cuda"], outside
        )
    return body


# -- findings -------------------------------------------------------------------------------


def _findings(result: dict[str, Any]) -> list[str]:
    """One line per comparison, for a reader who opens nothing else."""
    sections = result.get("sections", {})
    lines: list[str] = []
    for name, entry in sections.get("weights", {}).get("models", {}).items():
        if entry.get("status") == "ok":
            cuda = entry.get("estimator_vs_cuda_allocated")
            alloc = f"; vs CUDA allocated: {cuda['verdict']}" if cuda else ""
            lines.append(
                f"weights {name} ({entry['device']}): vs numel x 2: "
                f"{entry['estimator_vs_numel_x2']['verdict']}{alloc}"
            )
    for name, entry in sections.get("kv_cache", {}).get("models", {}).items():
        if entry.get("status") == "ok":
            lines.append(f"kv_cache {name}: {entry['estimator_vs_tensor_bytes']['verdict']}")
    for name, model in sections.get("activation", {}).get("models", {}).items():
        for shape, entry in model.get("shapes", {}).items():
            if entry.get("status") == "ok":
                lines.append(
                    f"activation {name} {shape}: estimator activation_bytes vs measured "
                    f"hidden-state peak: {entry['activation_vs_hidden_peak']['verdict']}; "
                    "activation + logits vs vLLM-like peak: "
                    f"{entry['activation_plus_logits_vs_vllm_like_peak']['verdict']}"
                )
    ctx = sections.get("cuda_context", {}).get("estimator_fixed_vs_context_and_cublas")
    if ctx:
        lines.append(f"cuda context + cuBLAS vs RUNTIME_FIXED_BYTES: {ctx['verdict']}")
    after = sections.get("after_load", {}).get("estimator_fixed_vs_outside_allocator")
    if after:
        lines.append(f"memory outside torch's allocator at the end: {after['verdict']}")
    return lines


# -- main -----------------------------------------------------------------------------------


def _start(run: Run, argv: list[str]) -> None:
    """The result's header, and NVML's used memory before anything touches CUDA."""
    run.result = {
        "script": "scripts/gpu_check.py",
        "started_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "argv": argv,
        "gpu": False,
        "quick": run.quick,
        "budget_s": run.budget_s,
        "host": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
        },
        "versions": {},
        "sections": {},
        "errors": [],
        "findings": [],
        "finished": False,
    }
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    run.gpu_index = int(visible) if visible.isdigit() else 0
    run.nv = NvmlTelemetry(pcie_throughput_interval_s=10.0)
    run.baseline_used_bytes = _nvml_used(run)


def _pick_device(run: Run, force_cpu: bool) -> None:
    try:
        import torch
    except ImportError as exc:  # recorded; every torch section then fails with its reason
        run.cuda, run.cuda_reason = False, f"torch does not import: {exc}"
        run.result["errors"].append({"section": "device", "error": run.cuda_reason})
        return
    run.result["versions"].update(torch=torch.__version__, torch_cuda=torch.version.cuda)
    if force_cpu:
        run.cuda, run.cuda_reason = False, "--cpu given"
    elif not torch.cuda.is_available():
        # is_available() asks the driver for a device count; it creates no context.
        run.cuda, run.cuda_reason = False, "no CUDA GPU: torch.cuda.is_available() is False"
    else:
        run.cuda = True
    run.result["gpu"] = run.cuda
    run.result["device"] = run.device
    run.log(f"device: {run.device}" + (f" ({run.cuda_reason})" if run.cuda_reason else ""))


def main(argv: list[str] | None = None) -> int:
    """Run every section; returns 0 when all ran, 1 when one failed (the JSON says which)."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("gpu_check.json"), help="the JSON result")
    ap.add_argument(
        "--quick", action="store_true", help="small models and one activation shape only"
    )
    ap.add_argument("--cpu", action="store_true", help="take the CPU path even with a GPU")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=DEFAULT_BUDGET_S,
        help=f"skip items that would run past this many seconds (default {DEFAULT_BUDGET_S:g})",
    )
    args = ap.parse_args(argv)
    run = Run(out=args.out, quick=args.quick, budget_s=args.budget_s)
    _start(run, list(sys.argv[1:] if argv is None else argv))
    run.save()
    try:
        run_section(run, "nvml", section_nvml)
        _pick_device(run, args.cpu)
        run_section(run, "cuda_context", section_cuda_context)
        with contextlib.suppress(ImportError):  # the weights section records the failure
            run.result["versions"]["transformers"] = _transformers().__version__
        for name, fn in (
            ("weights", section_weights),
            ("kv_cache", section_kv_cache),
            ("activation", section_activation),
            ("estimate", section_estimate),
            ("after_load", section_after_load),
        ):
            run_section(run, name, fn)
        run.result["findings"] = _findings(run.result)
        run.result["finished"] = True
        run.save()
    finally:
        if run.nv is not None:
            run.nv.close()
    for line in run.result["findings"]:
        run.log(line)
    run.log(f"wrote {run.out} ({len(run.result['errors'])} error(s))")
    return 1 if run.result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
