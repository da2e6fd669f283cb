"""The engine settings the appliance picks where the operator did not: block size, KV dtype.

Pure policy: the engine adapter applies it at start, the estimator plans with it, and the
pre-check shows each choice with its reason. Only where vLLM allows the choice:

- Block size: 32-token KV blocks above 1024 tokens of context, else 64 (less waste at the
  tail of long sequences, fewer block-table entries for short ones). Not on the CPU engine
  (its attention takes 128-token blocks) and not for MLA models (their kernels fix it).
- KV cache dtype: fp8 on GPUs with compute capability 8.9 or higher (Ada, Hopper,
  Blackwell), which store and read it natively: half the KV memory, so about twice the
  sequences in flight. `engine.kv_cache_dtype: bfloat16` (or any explicit value) keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance.domain.estimator import block_size_rule_of_thumb
from appliance.domain.hardware import FP8_MIN_COMPUTE_CAPABILITY


@dataclass(frozen=True)
class EngineDefaults:
    """What the appliance sets for vLLM, and why; None: vLLM's own default stays."""

    block_size: int | None
    kv_cache_dtype: str  # the value to give vLLM ("auto" keeps the model's dtype)
    reasons: tuple[str, ...]


def engine_defaults(
    *,
    device: str,
    compute_capability: float | None,
    max_model_len: int,
    is_mla: bool,
    configured_kv_cache_dtype: str,
    configured_block_size: int | None,
) -> EngineDefaults:
    """The appliance's block size and KV dtype for this device and model, with reasons."""
    reasons: list[str] = []
    block: int | None = None
    if configured_block_size is not None:
        reasons.append(f"block_size {configured_block_size}: set in engine.vllm")
    elif device == "cpu":
        reasons.append("block_size: the CPU engine's attention fixes it (128)")
    elif is_mla:
        reasons.append("block_size: the MLA attention kernel fixes it")
    else:
        block = block_size_rule_of_thumb(max_model_len)
        side = "above" if max_model_len > 1024 else "at or below"
        reasons.append(f"block_size {block}: max_model_len {max_model_len} is {side} 1024 tokens")
    kv = configured_kv_cache_dtype
    if kv != "auto":
        reasons.append(f"kv_cache_dtype {kv}: set in engine.kv_cache_dtype")
    elif device == "cpu":
        reasons.append("kv_cache_dtype: the model's dtype (the CPU engine has no fp8 KV cache)")
    elif (
        compute_capability is not None and compute_capability >= FP8_MIN_COMPUTE_CAPABILITY
    ):
        kv = "fp8"
        reasons.append(
            f"kv_cache_dtype fp8: compute capability {compute_capability:.1f} >= "
            f"{FP8_MIN_COMPUTE_CAPABILITY} stores it natively; half the KV memory "
            "(engine.kv_cache_dtype: bfloat16 keeps the model's dtype)"
        )
    else:
        cc = "unknown" if compute_capability is None else f"{compute_capability:.1f}"
        reasons.append(f"kv_cache_dtype: the model's dtype (compute capability {cc} < 8.9)")
    return EngineDefaults(block_size=block, kv_cache_dtype=kv, reasons=tuple(reasons))
