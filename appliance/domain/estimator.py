"""Memory plan for a model on a device: weights, KV cache, runtime buffers, margin. Pure.

The KV arithmetic mirrors vLLM 0.32's block manager (vllm/v1/core/kv_cache_utils.py and
vllm/v1/kv_cache_interface.py): a block holds `block_size` tokens of every layer in a KV cache
group, the pool is `budget // bytes_per_block` whole blocks, a full-attention layer needs
cdiv(len, block) blocks per request, a sliding-window layer cdiv(min(window - 1 + in-flight
tokens, len), block) + 1, and an MLA layer caches one latent vector (kv_lora_rank +
qk_rope_head_dim) per token instead of K and V per head.

Memory shares, one meaning everywhere (the CLI, /admin/estimate and the daemon's start check):
- usable_fraction (the cap, 0.8 by default): the most of each device the plan may occupy,
  the safety margin included. Memory above it is never planned for.
- safety margin, max(2 GiB, 5 % of the device): held back inside the usable share.
- vLLM's gpu_memory_utilization is the share the engine itself allocates (weights, activations,
  and a KV cache that fills the rest of it). The engine may take usable - margin, so the cap
  maps to gpu_memory_utilization = (usable - margin) / memory (gpu_memory_utilization_for),
  and a configured value u keeps to the cap when u x memory + margin <= usable.
- Given a configured gpu_memory_utilization, the plan's KV budget is what vLLM will reserve
  (u x memory - weights - runtime buffers), and the plan fails if that share breaks the cap.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

GIB = 1024**3
MIB = 1024**2

Device = Literal["cuda", "cpu"]

# Bytes per element of the dtypes a checkpoint, a KV cache or a runtime may use.
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "int8": 1,
}

SAFETY_MARGIN_MIN_BYTES = 2 * GIB
SAFETY_MARGIN_FRACTION = 0.05
DEFAULT_USABLE_FRACTION = 0.8
NAIVE_OVERHEAD = 1.15
TABLE_BATCH_SIZES = (1, 2, 4, 8, 16, 32)
TABLE_SEQ_LEN = 2048
DEFAULT_SEQ_LEN = 2048
# CUDA context, NCCL and the CUDA-graph pool on a GPU; interpreter, torch and the worker process
# on the CPU engine. Measured orders of magnitude, not per-model numbers.
RUNTIME_FIXED_BYTES: dict[str, int] = {"cuda": GIB, "cpu": GIB}
# Byte rounding of the three shares (floor, ceil, floor) must not make 0.75 + 5 % exceed 80 %.
SHARE_ROUNDING_SLACK_BYTES = MIB
# Beyond this many running sequences the scheduler, not memory, is the limit (vLLM's own cap).
MAX_RECOMMENDED_SEQS = 1024


class ModelConfigError(ValueError):
    """A model config is missing a key or holds a value outside its limits; names the key."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}")


class EstimateInputError(ValueError):
    """An estimate input is outside its limits; names the field and the limit."""

    def __init__(self, field_name: str, message: str):
        self.field = field_name
        super().__init__(f"{field_name}: {message}")


def _positive(key: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ModelConfigError(key, f"must be a positive integer, got {value!r}")


def _non_negative(key: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ModelConfigError(key, f"must be a non-negative integer, got {value!r}")


@dataclass(frozen=True)
class ModelSpec:
    """What the planner needs to know about a model; names follow Hugging Face config keys."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    max_position_embeddings: int
    model_type: str = ""
    dtype: str = "bfloat16"
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    # Sliding-window attention: the window in tokens and which layer indices use it.
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] = ()
    # Multi-head latent attention (DeepSeek V2/V3): the cache holds the latent plus rope part.
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    q_lora_rank: int | None = None
    # Mixture of experts; num_dense_layers leading layers keep a dense MLP.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    num_dense_layers: int = 0
    norms_per_layer: int = 2
    # Exact figures from safetensors headers when the weights are at hand.
    param_count: int | None = None
    param_bytes: int | None = None
    quantized: bool = False

    def __post_init__(self) -> None:
        for key, value in (
            ("num_hidden_layers", self.num_layers),
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("norms_per_layer", self.norms_per_layer),
        ):
            _positive(key, value)
        for key, value in (
            ("n_routed_experts", self.num_experts),
            ("num_experts_per_tok", self.num_experts_per_tok),
            ("moe_intermediate_size", self.moe_intermediate_size),
            ("shared_expert_intermediate_size", self.shared_expert_intermediate_size),
            ("first_k_dense_replace", self.num_dense_layers),
        ):
            _non_negative(key, value)
        if self.num_kv_heads > self.num_attention_heads:
            raise ModelConfigError(
                "num_key_value_heads",
                f"{self.num_kv_heads} exceeds num_attention_heads ({self.num_attention_heads})",
            )
        if self.dtype not in DTYPE_BYTES:
            raise ModelConfigError("torch_dtype", f"unknown dtype {self.dtype!r}")
        if self.sliding_window is not None:
            _positive("sliding_window", self.sliding_window)
        elif self.sliding_layers:
            raise ModelConfigError("sliding_window", "layers slide but no window is given")
        if tuple(sorted(set(self.sliding_layers))) != self.sliding_layers:
            raise ModelConfigError("layer_types", "sliding layer indices must be sorted, unique")
        if self.sliding_layers and not 0 <= self.sliding_layers[-1] < self.num_layers:
            raise ModelConfigError(
                "layer_types",
                f"sliding layer {self.sliding_layers[-1]} outside 0..{self.num_layers - 1}",
            )
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise ModelConfigError(
                "kv_lora_rank", "MLA needs both kv_lora_rank and qk_rope_head_dim"
            )
        if self.kv_lora_rank is not None:
            _positive("kv_lora_rank", self.kv_lora_rank)
            _positive("qk_rope_head_dim", self.qk_rope_head_dim)
        if self.num_experts and not self.moe_intermediate_size:
            raise ModelConfigError("moe_intermediate_size", "required when experts are set")
        if self.num_dense_layers > self.num_layers:
            raise ModelConfigError(
                "first_k_dense_replace", f"exceeds num_hidden_layers ({self.num_layers})"
            )
        for key, value in (("param_count", self.param_count), ("param_bytes", self.param_bytes)):
            if value is not None:
                _positive(key, value)

    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention (DeepSeek-style compressed KV)."""
        return self.kv_lora_rank is not None

    @property
    def num_sliding_layers(self) -> int:
        """Layers whose attention (and so KV cache) is limited to the window."""
        return len(self.sliding_layers)

    @property
    def num_full_layers(self) -> int:
        """Layers that attend to (and keep) every token."""
        return self.num_layers - len(self.sliding_layers)


def dtype_bytes(name: str, field_name: str = "dtype") -> int:
    """Bytes per element of a dtype name; EstimateInputError names the field otherwise."""
    try:
        return DTYPE_BYTES[name.lower()]
    except (KeyError, AttributeError):
        raise EstimateInputError(
            field_name, f"unknown dtype {name!r}; one of {', '.join(sorted(DTYPE_BYTES))}"
        ) from None


def runtime_dtype(spec: ModelSpec, dtype: str = "auto") -> str:
    """The dtype vLLM computes in: 'auto' takes the checkpoint's, float32 becomes bfloat16."""
    if dtype != "auto":
        dtype_bytes(dtype, "dtype")
        return dtype
    # vLLM's "auto" downcasts float32 checkpoints to a 16-bit type.
    return "bfloat16" if DTYPE_BYTES[spec.dtype] == 4 else spec.dtype


def kv_dtypes(
    spec: ModelSpec, k_dtype: str = "auto", v_dtype: str | None = None
) -> tuple[str, str]:
    """Resolve the K and V cache dtypes: 'auto' is the runtime dtype, V defaults to K."""
    k = runtime_dtype(spec) if k_dtype == "auto" else k_dtype
    dtype_bytes(k, "kv_dtype")
    v = k if v_dtype is None else (runtime_dtype(spec) if v_dtype == "auto" else v_dtype)
    dtype_bytes(v, "v_dtype")
    return k, v


def _check_tp(tensor_parallel_size: int) -> None:
    if not isinstance(tensor_parallel_size, int) or tensor_parallel_size < 1:
        raise EstimateInputError(
            "tensor_parallel_size", f"must be a positive integer, got {tensor_parallel_size!r}"
        )


def kv_heads_per_gpu(spec: ModelSpec, tensor_parallel_size: int = 1) -> int:
    """KV heads one GPU stores: split by TP, replicated once TP exceeds the KV heads."""
    _check_tp(tensor_parallel_size)
    if spec.is_mla:
        # The latent is not split by head: every TP rank keeps the whole of it.
        return 1
    return max(1, spec.num_kv_heads // tensor_parallel_size)


def kv_layer_token_bytes(
    spec: ModelSpec,
    k_dtype: str = "auto",
    v_dtype: str | None = None,
    tensor_parallel_size: int = 1,
) -> int:
    """Bytes one token takes in one layer's KV cache on one GPU."""
    k, v = kv_dtypes(spec, k_dtype, v_dtype)
    heads = kv_heads_per_gpu(spec, tensor_parallel_size)
    if spec.is_mla:
        # One latent vector serves as both K and V; it is stored once, in the key dtype.
        assert spec.kv_lora_rank is not None and spec.qk_rope_head_dim is not None
        return (spec.kv_lora_rank + spec.qk_rope_head_dim) * DTYPE_BYTES[k]
    return heads * spec.head_dim * (DTYPE_BYTES[k] + DTYPE_BYTES[v])


def kv_bytes_per_token(
    spec: ModelSpec,
    k_dtype: str = "auto",
    v_dtype: str | None = None,
    *,
    tensor_parallel_size: int = 1,
) -> int:
    """KV bytes per token, every layer, one GPU: 2 x layers x KV heads x head dim x dtype."""
    # Sliding-window layers count like full ones here; kv_bytes_for_tokens caps them.
    return spec.num_layers * kv_layer_token_bytes(spec, k_dtype, v_dtype, tensor_parallel_size)


def kv_bytes_for_tokens(
    spec: ModelSpec,
    num_tokens: int,
    k_dtype: str = "auto",
    v_dtype: str | None = None,
    *,
    tensor_parallel_size: int = 1,
) -> int:
    """Exact KV bytes one sequence of num_tokens holds, sliding layers capped at the window."""
    if num_tokens < 0:
        raise EstimateInputError("num_tokens", f"must be >= 0, got {num_tokens}")
    per_layer = kv_layer_token_bytes(spec, k_dtype, v_dtype, tensor_parallel_size)
    held_sliding = min(num_tokens, spec.sliding_window or num_tokens)
    return per_layer * (spec.num_full_layers * num_tokens + spec.num_sliding_layers * held_sliding)


@dataclass(frozen=True)
class KvGroups:
    """How vLLM's hybrid allocator groups layers: equal-sized groups, one block table each."""

    group_size: int
    full_groups: int
    sliding_groups: int


def kv_groups(spec: ModelSpec) -> KvGroups:
    """vLLM's grouping: one group for uniform models, groups of the rarer type's size otherwise."""
    n_full, n_sliding = spec.num_full_layers, spec.num_sliding_layers
    if n_sliding == 0:
        return KvGroups(n_full, 1, 0)
    if n_full == 0:
        return KvGroups(n_sliding, 0, 1)
    size = min(n_full, n_sliding)
    if max(n_full, n_sliding) < 1.5 * size:
        # vLLM pads the smaller type up instead of making many tiny groups.
        size = max(n_full, n_sliding)
    return KvGroups(size, math.ceil(n_full / size), math.ceil(n_sliding / size))


def kv_block_bytes(
    spec: ModelSpec,
    block_size: int,
    k_dtype: str = "auto",
    v_dtype: str | None = None,
    *,
    tensor_parallel_size: int = 1,
) -> int:
    """Bytes of one block in vLLM's shared pool: block_size tokens of one group's layers."""
    _check_block_size(block_size)
    page = block_size * kv_layer_token_bytes(spec, k_dtype, v_dtype, tensor_parallel_size)
    return kv_groups(spec).group_size * page


def _check_block_size(block_size: int) -> None:
    if not isinstance(block_size, int) or block_size < 1:
        raise EstimateInputError("block_size", f"must be a positive integer, got {block_size!r}")


def kv_blocks_per_sequence(
    spec: ModelSpec, seq_len: int, block_size: int, in_flight_tokens: int
) -> int:
    """Pool blocks vLLM reserves for one request of seq_len tokens (summed over groups)."""
    _check_block_size(block_size)
    groups = kv_groups(spec)
    full = groups.full_groups * math.ceil(seq_len / block_size)
    sliding = 0
    if groups.sliding_groups:
        assert spec.sliding_window is not None
        held = min(spec.sliding_window - 1 + in_flight_tokens, seq_len)
        # +1: the window need not start on a block boundary.
        sliding = groups.sliding_groups * (math.ceil(held / block_size) + 1)
    return full + sliding


def kv_capacity_tokens(
    spec: ModelSpec,
    kv_bytes_budget: int,
    block_size: int,
    k_dtype: str = "auto",
    v_dtype: str | None = None,
    *,
    tensor_parallel_size: int = 1,
) -> int:
    """Tokens the budget holds in whole blocks if every layer keeps every token, as vLLM rounds."""
    if kv_bytes_budget < 0:
        raise EstimateInputError("kv_bytes_budget", f"must be >= 0, got {kv_bytes_budget}")
    _check_block_size(block_size)
    per_block = block_size * kv_bytes_per_token(
        spec, k_dtype, v_dtype, tensor_parallel_size=tensor_parallel_size
    )
    return (kv_bytes_budget // per_block) * block_size


def kv_pool_blocks(
    spec: ModelSpec,
    kv_bytes_budget: int,
    block_size: int,
    k_dtype: str = "auto",
    v_dtype: str | None = None,
    *,
    tensor_parallel_size: int = 1,
) -> int:
    """Whole blocks vLLM carves out of the KV budget (its num_gpu_blocks)."""
    if kv_bytes_budget < 0:
        raise EstimateInputError("kv_bytes_budget", f"must be >= 0, got {kv_bytes_budget}")
    per_block = kv_block_bytes(
        spec, block_size, k_dtype, v_dtype, tensor_parallel_size=tensor_parallel_size
    )
    return kv_bytes_budget // per_block


def vllm_kv_cache_size_tokens(
    spec: ModelSpec,
    kv_bytes_budget: int,
    block_size: int,
    max_model_len: int,
    k_dtype: str = "auto",
    v_dtype: str | None = None,
    *,
    in_flight_tokens: int,
    tensor_parallel_size: int = 1,
) -> int:
    """vLLM's reported kv_cache_size_tokens: concurrency at max_model_len x max_model_len."""
    blocks = kv_pool_blocks(
        spec,
        kv_bytes_budget,
        block_size,
        k_dtype,
        v_dtype,
        tensor_parallel_size=tensor_parallel_size,
    )
    per_request = kv_blocks_per_sequence(spec, max_model_len, block_size, in_flight_tokens)
    return int(blocks / per_request * max_model_len)


def vllm_block_size(
    spec: ModelSpec, device: Device, compute_capability: float | None = None
) -> int:
    """The block size vLLM 0.32 picks by default for this model on this device."""
    if device == "cpu":
        # CPU attention uses 128-token blocks; the reference CPU MLA kernel compiles only for 16.
        return 16 if spec.is_mla else 128
    if spec.is_mla:
        # FlashMLA (Hopper) takes 64; CUTLASS MLA (Blackwell, 10.x) takes 128.
        return 128 if compute_capability is not None and compute_capability >= 10 else 64
    return 16  # CacheConfig.DEFAULT_BLOCK_SIZE, which FlashAttention accepts


def block_size_rule_of_thumb(seq_len: int) -> int:
    """The issue's rule: 32-token blocks above 1024 tokens, else 64."""
    return 32 if seq_len > 1024 else 64


def vllm_default_max_num_batched_tokens(
    device: Device, device_memory_bytes: int, device_name: str = ""
) -> int:
    """vLLM's OpenAI-server default for max_num_batched_tokens on this device."""
    if device == "cpu":
        return 2048
    if device_memory_bytes >= 160 * GIB:
        return 16384
    if device_memory_bytes >= 70 * GIB and "a100" not in device_name.lower():
        return 8192
    return 2048


def vllm_default_max_num_seqs(
    device: Device, device_memory_bytes: int, device_name: str = ""
) -> int:
    """vLLM's OpenAI-server default for max_num_seqs on this device."""
    if device == "cpu":
        return 128
    if device_memory_bytes >= 160 * GIB or (
        device_memory_bytes >= 70 * GIB and "a100" not in device_name.lower()
    ):
        return 1024
    return 256


def estimated_param_count(spec: ModelSpec) -> int:
    """Parameters implied by the architecture (embeddings, attention, MLP or experts, norms)."""
    h = spec.hidden_size
    embed = spec.vocab_size * h * (1 if spec.tie_word_embeddings else 2)
    heads = spec.num_attention_heads
    if spec.is_mla:
        assert spec.kv_lora_rank is not None and spec.qk_rope_head_dim is not None
        nope = spec.qk_nope_head_dim or spec.head_dim
        v_dim = spec.v_head_dim or spec.head_dim
        q_head = nope + spec.qk_rope_head_dim
        if spec.q_lora_rank:
            q = h * spec.q_lora_rank + spec.q_lora_rank + spec.q_lora_rank * heads * q_head
        else:
            q = h * heads * q_head
        kv_a = h * (spec.kv_lora_rank + spec.qk_rope_head_dim) + spec.kv_lora_rank
        kv_b = spec.kv_lora_rank * heads * (nope + v_dim)
        attn = q + kv_a + kv_b + heads * v_dim * h
    else:
        q_dim = heads * spec.head_dim
        kv_dim = spec.num_kv_heads * spec.head_dim
        attn = 2 * h * q_dim + 2 * h * kv_dim
        if spec.qkv_bias:
            attn += q_dim + 2 * kv_dim
    dense_mlp = 3 * h * spec.intermediate_size
    if spec.num_experts:
        moe_mlp = (
            spec.num_experts * 3 * h * spec.moe_intermediate_size
            + 3 * h * spec.shared_expert_intermediate_size
            + h * spec.num_experts  # the router
        )
        n_dense = spec.num_dense_layers
    else:
        moe_mlp, n_dense = 0, spec.num_layers
    norms = spec.norms_per_layer * h
    layers = spec.num_layers * (attn + norms) + n_dense * dense_mlp
    layers += (spec.num_layers - n_dense) * moe_mlp
    return embed + layers + h  # + the final norm


def weights_bytes(spec: ModelSpec, dtype: str = "auto", tensor_parallel_size: int = 1) -> int:
    """Weight bytes on one GPU: exact from safetensors where known, else from the architecture."""
    _check_tp(tensor_parallel_size)
    if spec.quantized and spec.param_bytes is not None:
        # Packed low-bit weights: only the bytes on disk say what they occupy.
        total = spec.param_bytes
    else:
        # vLLM casts every tensor to the runtime dtype, so count x dtype is exact.
        count = spec.param_count if spec.param_count is not None else estimated_param_count(spec)
        total = count * DTYPE_BYTES[runtime_dtype(spec, dtype)]
    return math.ceil(total / tensor_parallel_size)


def weights_source(spec: ModelSpec) -> str:
    """Where the weight figure comes from, for the report."""
    if spec.quantized and spec.param_bytes is not None:
        return "safetensors headers (bytes)"
    if spec.param_count is not None:
        return "safetensors headers (parameter count)"
    return "estimated from config.json"


@dataclass(frozen=True)
class RuntimeBuffers:
    """Memory the forward pass and the sampler need besides weights and KV cache."""

    activation_bytes: int
    logits_bytes: int
    fixed_bytes: int

    @property
    def total_bytes(self) -> int:
        """All runtime buffers together."""
        return self.activation_bytes + self.logits_bytes + self.fixed_bytes


def runtime_buffers(
    spec: ModelSpec,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    device: Device,
    dtype: str = "auto",
    tensor_parallel_size: int = 1,
) -> RuntimeBuffers:
    """Peak activations for one batched step, float32 logits for the sampler, fixed overheads."""
    act = DTYPE_BYTES[runtime_dtype(spec, dtype)]
    tp = tensor_parallel_size
    q_dim = spec.num_attention_heads * spec.head_dim
    kv_dim = 0 if spec.is_mla else 2 * spec.num_kv_heads * spec.head_dim
    mlp_width = spec.intermediate_size if spec.num_dense_layers or not spec.num_experts else 0
    if spec.num_experts:
        routed = spec.num_experts_per_tok * spec.moe_intermediate_size
        mlp_width = max(mlp_width, routed + spec.shared_expert_intermediate_size)
    # Live at once in the widest step: residual + normed hidden, the QKV output, and the MLP's
    # gate, up and activated tensors; head-sharded parts divide by TP.
    per_token = 2 * spec.hidden_size + (q_dim + kv_dim + 3 * mlp_width) // tp
    activation = max_num_batched_tokens * per_token * act
    # The sampler holds float32 logits and probabilities for every running sequence.
    logits = max_num_seqs * spec.vocab_size * 4 * 2
    return RuntimeBuffers(activation, logits, RUNTIME_FIXED_BYTES[device])


def safety_margin_bytes(device_memory_bytes: int) -> int:
    """Memory kept free: max(2 GiB, 5 % of the device)."""
    return max(SAFETY_MARGIN_MIN_BYTES, math.ceil(device_memory_bytes * SAFETY_MARGIN_FRACTION))


def gpu_memory_utilization_for(
    device_memory_bytes: int, usable_fraction: float = DEFAULT_USABLE_FRACTION
) -> float:
    """vLLM's gpu_memory_utilization that keeps the engine within the cap less the margin."""
    usable = math.floor(device_memory_bytes * usable_fraction)
    engine = usable - safety_margin_bytes(device_memory_bytes)
    # Integer hundredths, floored: rounding up would break the cap by up to 1 %.
    return max((engine + SHARE_ROUNDING_SLACK_BYTES) * 100 // device_memory_bytes, 0) / 100


def usable_fraction_needed(device_memory_bytes: int, gpu_memory_utilization: float) -> float:
    """The cap a configured gpu_memory_utilization needs: its share plus the safety margin."""
    engine = math.floor(device_memory_bytes * gpu_memory_utilization)
    return (engine + safety_margin_bytes(device_memory_bytes)) / device_memory_bytes


def naive_kv_bytes(spec: ModelSpec, batch_size: int, seq_len: int, dtype: str = "auto") -> int:
    """The folk formula batch x seq x (2 x hidden x layers x dtype) x 1.15, for comparison."""
    b = DTYPE_BYTES[runtime_dtype(spec, dtype)]
    return math.ceil(
        batch_size * seq_len * 2 * spec.hidden_size * spec.num_layers * b * NAIVE_OVERHEAD
    )


@dataclass(frozen=True)
class BatchRow:
    """One line of the batch table: does this many sequences of this length fit?"""

    batch_size: int
    seq_len: int
    kv_cache_bytes: int
    total_bytes: int
    fits: bool
    headroom_bytes: int


@dataclass(frozen=True)
class MemoryPlan:
    """The plan: every component in bytes, whether the workload fits and why, and what to set."""

    model: str
    device: str
    device_memory_bytes: int
    tensor_parallel_size: int
    usable_fraction: float
    usable_bytes: int
    weights_bytes: int
    weights_source: str
    activation_bytes: int
    logits_bytes: int
    runtime_fixed_bytes: int
    runtime_buffers_bytes: int
    safety_margin_bytes: int
    kv_budget_bytes: int
    kv_budget_source: str
    weight_dtype: str
    k_dtype: str
    v_dtype: str
    kv_bytes_per_token: int
    kv_bytes_per_token_at_seq_len: int
    kv_bytes_per_sequence: int
    seq_len: int
    batch_size: int
    kv_cache_bytes: int
    total_bytes: int
    headroom_bytes: int
    fits: bool
    reason: str
    block_size: int
    vllm_block_size: int
    block_size_rule_of_thumb: int
    max_num_batched_tokens: int
    max_num_seqs: int
    num_kv_blocks: int
    kv_capacity_tokens: int
    vllm_kv_cache_size_tokens: int
    max_concurrent_seqs: int
    recommended_max_num_seqs: int
    recommended_gpu_memory_utilization: float
    recommended_max_model_len: int
    naive_kv_bytes: int
    naive_error_ratio: float
    batch_table: tuple[BatchRow, ...] = field(default_factory=tuple)
    notes: tuple[str, ...] = ()
    # The engine's configured share (vLLM's gpu_memory_utilization) when the plan checks one;
    # None when the plan is made from the cap alone.
    gpu_memory_utilization: float | None = None
    # What the engine allocates: its configured share, usable - margin, or (CPU) weights +
    # runtime + the fixed KV space.
    engine_memory_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the batch table as a list of dicts)."""
        out = asdict(self)
        out["batch_table"] = [asdict(row) for row in self.batch_table]
        out["notes"] = list(self.notes)
        return out


def _gib(n: int | float) -> str:
    return f"{n / GIB:.2f} GiB"


def _check_estimate_inputs(
    device_memory_bytes: int,
    seq_len: int,
    batch_size: int,
    usable_fraction: float,
    kv_cache_bytes_budget: int | None,
    max_num_batched_tokens: int | None,
    max_num_seqs: int | None,
    gpu_memory_utilization: float | None,
    device: str,
) -> None:
    if not isinstance(device_memory_bytes, int) or device_memory_bytes <= 0:
        raise EstimateInputError(
            "device_memory_bytes", f"must be a positive integer, got {device_memory_bytes!r}"
        )
    for name, value in (
        ("seq_len", seq_len),
        ("batch_size", batch_size),
        ("max_num_batched_tokens", max_num_batched_tokens),
        ("max_num_seqs", max_num_seqs),
    ):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise EstimateInputError(name, f"must be a positive integer, got {value!r}")
    if not 0 < usable_fraction <= 1:
        raise EstimateInputError("usable_fraction", f"must be in (0, 1], got {usable_fraction}")
    if kv_cache_bytes_budget is not None and kv_cache_bytes_budget <= 0:
        raise EstimateInputError(
            "kv_cache_bytes_budget", f"must be positive, got {kv_cache_bytes_budget}"
        )
    if gpu_memory_utilization is not None:
        if not 0 < gpu_memory_utilization <= 1:
            raise EstimateInputError(
                "gpu_memory_utilization", f"must be in (0, 1], got {gpu_memory_utilization}"
            )
        if device != "cuda":
            raise EstimateInputError(
                "gpu_memory_utilization",
                "only applies to device 'cuda' (the CPU engine takes a fixed KV space)",
            )
        if kv_cache_bytes_budget is not None:
            raise EstimateInputError(
                "gpu_memory_utilization", "give it or kv_cache_bytes_budget, not both"
            )


@dataclass(frozen=True)
class _Context:
    spec: ModelSpec
    k: str
    v: str
    tp: int
    block: int
    in_flight: int
    fixed_kv: int | None  # a KV budget set from outside (CPU space or the engine's share)
    base_bytes: int  # weights + runtime + margin
    kv_budget: int
    usable: int


def _kv_sequence_bytes(ctx: _Context, seq_len: int) -> int:
    blocks = kv_blocks_per_sequence(ctx.spec, seq_len, ctx.block, ctx.in_flight)
    return blocks * kv_block_bytes(ctx.spec, ctx.block, ctx.k, ctx.v, tensor_parallel_size=ctx.tp)


def _row(ctx: _Context, batch_size: int, seq_len: int) -> BatchRow:
    kv = batch_size * _kv_sequence_bytes(ctx, seq_len)
    headroom = ctx.kv_budget - kv
    allocated = ctx.base_bytes + (ctx.fixed_kv if ctx.fixed_kv is not None else kv)
    fits = (
        headroom >= 0
        and allocated <= ctx.usable + SHARE_ROUNDING_SLACK_BYTES
        and seq_len <= ctx.spec.max_position_embeddings
    )
    return BatchRow(batch_size, seq_len, kv, ctx.base_bytes + kv, fits, headroom)


def _longest_fitting_len(ctx: _Context, batch_size: int) -> int:
    """The longest length (whole blocks, within the model's limit) batch_size sequences fit at."""
    limit = ctx.spec.max_position_embeddings
    over_usable = (
        ctx.fixed_kv is not None
        and ctx.base_bytes + ctx.fixed_kv > ctx.usable + SHARE_ROUNDING_SLACK_BYTES
    )
    if over_usable or ctx.kv_budget <= 0 or batch_size * _kv_sequence_bytes(ctx, 1) > ctx.kv_budget:
        return 0
    lo, hi = 1, limit  # lo always fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if batch_size * _kv_sequence_bytes(ctx, mid) <= ctx.kv_budget:
            lo = mid
        else:
            hi = mid - 1
    return lo if lo < ctx.block or lo == limit else lo - lo % ctx.block


def _recommended_seqs(max_concurrent: int, device: Device) -> int:
    n = max(min(max_concurrent, MAX_RECOMMENDED_SEQS), 0)
    # CUDA-graph capture sizes step by 8, so a multiple of 8 wastes no captured batch.
    return n - n % 8 if device == "cuda" and n >= 8 else n


@dataclass(frozen=True)
class _Request:
    """estimate()'s arguments, with seq_len resolved."""

    spec: ModelSpec
    device_memory_bytes: int
    seq_len: int
    batch_size: int
    kv_dtype: str
    v_dtype: str | None
    weight_dtype: str
    device: Device
    device_name: str
    compute_capability: float | None
    usable_fraction: float
    tensor_parallel_size: int
    block_size: int | None
    max_num_batched_tokens: int | None
    max_num_seqs: int | None
    kv_cache_bytes_budget: int | None
    gpu_memory_utilization: float | None


@dataclass(frozen=True)
class _Engine:
    """What the engine runs with: dtypes, block size, batch sizes, tokens in flight."""

    k: str
    v: str
    weight_dtype: str
    block: int
    vllm_block: int
    batched: int
    seqs: int
    in_flight: int


@dataclass(frozen=True)
class _Budget:
    """Where the memory goes before the KV cache, and what the KV cache may have."""

    weights: int
    runtime: RuntimeBuffers
    margin: int
    usable: int
    base: int  # weights + runtime + margin
    engine_share: int | None  # the engine's bytes at a configured gpu_memory_utilization
    fixed_kv: int | None  # a KV budget set from outside (CPU space or the engine's share)
    kv_budget: int
    kv_source: str


@dataclass(frozen=True)
class _Fit:
    """The requested batch against the budget, and how many such sequences fit."""

    row: BatchRow
    per_seq: int
    pool_blocks: int
    over_usable: bool
    too_long: bool
    max_concurrent: int
    vllm_tokens: int


@dataclass(frozen=True)
class _Recommendation:
    gpu_memory_utilization: float
    max_num_seqs: int
    max_model_len: int


def estimate(
    spec: ModelSpec,
    *,
    device_memory_bytes: int,
    seq_len: int | None = None,
    batch_size: int = 1,
    kv_dtype: str = "auto",
    v_dtype: str | None = None,
    weight_dtype: str = "auto",
    device: Device = "cuda",
    device_name: str = "",
    compute_capability: float | None = None,
    usable_fraction: float = DEFAULT_USABLE_FRACTION,
    tensor_parallel_size: int = 1,
    block_size: int | None = None,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    kv_cache_bytes_budget: int | None = None,
    gpu_memory_utilization: float | None = None,
) -> MemoryPlan:
    """Plan memory for batch_size sequences of seq_len tokens on one device (one TP rank)."""
    seq = min(DEFAULT_SEQ_LEN, spec.max_position_embeddings) if seq_len is None else seq_len
    return _estimate(
        _Request(
            spec=spec,
            device_memory_bytes=device_memory_bytes,
            seq_len=seq,
            batch_size=batch_size,
            kv_dtype=kv_dtype,
            v_dtype=v_dtype,
            weight_dtype=weight_dtype,
            device=device,
            device_name=device_name,
            compute_capability=compute_capability,
            usable_fraction=usable_fraction,
            tensor_parallel_size=tensor_parallel_size,
            block_size=block_size,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            kv_cache_bytes_budget=kv_cache_bytes_budget,
            gpu_memory_utilization=gpu_memory_utilization,
        )
    )


def _estimate(req: _Request) -> MemoryPlan:
    _check_request(req)
    engine = _engine(req)
    budget = _budget(req, engine)
    ctx = _Context(
        req.spec,
        engine.k,
        engine.v,
        req.tensor_parallel_size,
        engine.block,
        engine.in_flight,
        budget.fixed_kv,
        budget.base,
        budget.kv_budget,
        budget.usable,
    )
    fit = _fit(req, engine, budget, ctx)
    return _memory_plan(req, engine, budget, fit, ctx)


def _check_request(req: _Request) -> None:
    if req.device not in RUNTIME_FIXED_BYTES:
        raise EstimateInputError("device", f"must be 'cuda' or 'cpu', got {req.device!r}")
    _check_estimate_inputs(
        req.device_memory_bytes,
        req.seq_len,
        req.batch_size,
        req.usable_fraction,
        req.kv_cache_bytes_budget,
        req.max_num_batched_tokens,
        req.max_num_seqs,
        req.gpu_memory_utilization,
        req.device,
    )
    _check_tp(req.tensor_parallel_size)


def _engine(req: _Request) -> _Engine:
    k, v = kv_dtypes(req.spec, req.kv_dtype, req.v_dtype)
    wdtype = runtime_dtype(req.spec, req.weight_dtype)
    vllm_block = vllm_block_size(req.spec, req.device, req.compute_capability)
    block = vllm_block if req.block_size is None else req.block_size
    _check_block_size(block)
    batched = req.max_num_batched_tokens or vllm_default_max_num_batched_tokens(
        req.device, req.device_memory_bytes, req.device_name
    )
    seqs_for_sampler = req.max_num_seqs or vllm_default_max_num_seqs(
        req.device, req.device_memory_bytes, req.device_name
    )
    # Async scheduling on CUDA keeps two batches in flight; the CPU engine schedules one.
    in_flight = batched * (2 if req.device == "cuda" else 1)
    return _Engine(k, v, wdtype, block, vllm_block, batched, seqs_for_sampler, in_flight)


def _budget(req: _Request, engine: _Engine) -> _Budget:
    # The KV budget is, in order of precedence: kv_cache_bytes_budget (the CPU engine's fixed
    # KV space); what vLLM reserves at a configured gpu_memory_utilization; else what the
    # usable share leaves after weights, runtime buffers and the safety margin.
    memory = req.device_memory_bytes
    weights = weights_bytes(req.spec, req.weight_dtype, req.tensor_parallel_size)
    runtime = runtime_buffers(
        req.spec,
        max_num_batched_tokens=engine.batched,
        max_num_seqs=engine.seqs,
        device=req.device,
        dtype=req.weight_dtype,
        tensor_parallel_size=req.tensor_parallel_size,
    )
    margin = safety_margin_bytes(memory)
    usable = math.floor(memory * req.usable_fraction)
    base = weights + runtime.total_bytes + margin
    engine_share: int | None = None
    fixed_kv: int | None = req.kv_cache_bytes_budget
    util = req.gpu_memory_utilization
    if util is not None:
        # vLLM profiles weights and activations, then gives the KV cache the rest of its share.
        engine_share = math.floor(memory * util)
        fixed_kv = engine_share - weights - runtime.total_bytes
        kv_budget = max(fixed_kv, 0)
        kv_source = f"gpu_memory_utilization {util:g} less weights and runtime"
    elif req.kv_cache_bytes_budget is None:
        kv_budget, kv_source = max(usable - base, 0), "remainder of usable memory"
    else:
        kv_budget, kv_source = req.kv_cache_bytes_budget, "fixed KV space"
    return _Budget(
        weights, runtime, margin, usable, base, engine_share, fixed_kv, kv_budget, kv_source
    )


def _fit(req: _Request, engine: _Engine, budget: _Budget, ctx: _Context) -> _Fit:
    spec, seq, tp = req.spec, req.seq_len, req.tensor_parallel_size
    pool_blocks = kv_pool_blocks(
        spec, budget.kv_budget, engine.block, engine.k, engine.v, tensor_parallel_size=tp
    )
    per_seq_blocks = kv_blocks_per_sequence(spec, seq, engine.block, engine.in_flight)
    # With a fixed KV budget the engine takes all of it up front, used or not.
    fixed = budget.fixed_kv if budget.fixed_kv is not None else 0
    over_usable = budget.base + fixed > budget.usable + SHARE_ROUNDING_SLACK_BYTES
    too_long = seq > spec.max_position_embeddings
    return _Fit(
        row=_row(ctx, req.batch_size, seq),
        per_seq=_kv_sequence_bytes(ctx, seq),
        pool_blocks=pool_blocks,
        over_usable=over_usable,
        too_long=too_long,
        max_concurrent=0 if over_usable or too_long else pool_blocks // per_seq_blocks,
        vllm_tokens=vllm_kv_cache_size_tokens(
            spec,
            budget.kv_budget,
            engine.block,
            seq,
            engine.k,
            engine.v,
            in_flight_tokens=engine.in_flight,
            tensor_parallel_size=tp,
        ),
    )


def _fit_reason(req: _Request, budget: _Budget, fit: _Fit) -> str:
    """Why the workload fits or not, with the numbers that decide it."""
    seq, memory, cap = req.seq_len, req.device_memory_bytes, req.usable_fraction
    util, fixed_kv = req.gpu_memory_utilization, req.kv_cache_bytes_budget
    weights, runtime, margin = budget.weights, budget.runtime.total_bytes, budget.margin
    usable, base, kv_budget = budget.usable, budget.base, budget.kv_budget
    if fit.too_long:
        return (
            f"does not fit: seq_len {seq} exceeds the model's max_position_embeddings "
            f"({req.spec.max_position_embeddings})"
        )
    if budget.engine_share is not None and fit.over_usable:
        assert util is not None
        return (
            f"does not fit: gpu_memory_utilization {util:g} lets the engine "
            f"take {_gib(budget.engine_share)}; with the {_gib(margin)} safety margin that is "
            f"{_gib(budget.engine_share + margin)}, over the {cap:.0%} cap "
            f"({_gib(usable)} of {_gib(memory)}): set gpu_memory_utilization to "
            f"at most {gpu_memory_utilization_for(memory, cap):.2f}"
        )
    if budget.engine_share is not None and kv_budget <= 0:
        return (
            f"does not fit: weights {_gib(weights)} + runtime {_gib(runtime)} = "
            f"{_gib(weights + runtime)} leave nothing for the KV cache within the "
            f"engine's {_gib(budget.engine_share)} (gpu_memory_utilization {util:g} "
            f"of {_gib(memory)})"
        )
    if fixed_kv is None and usable - base <= 0:
        return (
            f"does not fit: weights {_gib(weights)} + runtime {_gib(runtime)} + "
            f"margin {_gib(margin)} = {_gib(base)} leave nothing for the KV cache within "
            f"{_gib(usable)} ({cap:.0%} of {_gib(memory)})"
        )
    if fixed_kv is not None and fit.over_usable:
        return (
            f"does not fit: KV space {_gib(fixed_kv)} + weights {_gib(weights)} + "
            f"runtime {_gib(runtime)} + margin {_gib(margin)} = "
            f"{_gib(base + fixed_kv)} exceed {_gib(usable)} "
            f"({cap:.0%} of {_gib(memory)})"
        )
    row = fit.row
    if not row.fits:
        return (
            f"does not fit: {req.batch_size} x {seq} tokens need {_gib(row.kv_cache_bytes)} of KV "
            f"cache but {_gib(kv_budget)} is available ({fit.max_concurrent} such sequences fit)"
        )
    return (
        f"fits: {req.batch_size} x {seq} tokens need {_gib(row.kv_cache_bytes)} of "
        f"{_gib(kv_budget)} KV cache; {fit.max_concurrent} sequences of this length fit"
    )


def _recommend(req: _Request, ctx: _Context, fit: _Fit) -> _Recommendation:
    """What to set: the share that keeps to the cap, and what fits at that share."""
    util = gpu_memory_utilization_for(req.device_memory_bytes, req.usable_fraction)
    if req.gpu_memory_utilization not in (None, util) and util > 0:
        # The recommendations are one setting: what fits at the recommended share, not at the
        # configured one (which may break the cap and fit nothing).
        at_util = _estimate(replace(req, gpu_memory_utilization=util, kv_cache_bytes_budget=None))
        return _Recommendation(
            util, at_util.recommended_max_num_seqs, at_util.recommended_max_model_len
        )
    return _Recommendation(
        util,
        _recommended_seqs(fit.max_concurrent, req.device),
        _longest_fitting_len(ctx, req.batch_size),
    )


def _engine_memory(req: _Request, budget: _Budget) -> int:
    """What the engine allocates: its configured share, weights + runtime + the fixed KV
    space (CPU), or the usable share less the margin."""
    if budget.engine_share is not None:
        return budget.engine_share
    if req.kv_cache_bytes_budget is not None:
        return budget.weights + budget.runtime.total_bytes + req.kv_cache_bytes_budget
    return budget.usable - budget.margin


def _notes(req: _Request, engine: _Engine) -> tuple[str, ...]:
    spec, tp = req.spec, req.tensor_parallel_size
    notes: list[str] = []
    if spec.is_mla:
        notes.append(
            "MLA: the cache holds the compressed latent and rope key, not K and V per head"
        )
    if spec.num_sliding_layers:
        notes.append(
            f"{spec.num_sliding_layers} of {spec.num_layers} layers keep only a "
            f"{spec.sliding_window}-token window (+{engine.in_flight} in-flight tokens, "
            "as vLLM reserves)"
        )
    if not spec.is_mla and spec.num_kv_heads < tp:
        notes.append(f"{spec.num_kv_heads} KV heads < TP {tp}: vLLM replicates KV heads per GPU")
    if engine.k != engine.v:
        notes.append(
            f"K cached as {engine.k}, V as {engine.v}: vLLM itself takes one kv_cache_dtype"
        )
    return tuple(notes)


def _memory_plan(
    req: _Request, engine: _Engine, budget: _Budget, fit: _Fit, ctx: _Context
) -> MemoryPlan:
    spec, seq, tp, k, v = req.spec, req.seq_len, req.tensor_parallel_size, engine.k, engine.v
    row = fit.row
    rec = _recommend(req, ctx, fit)
    naive = naive_kv_bytes(spec, req.batch_size, seq, req.weight_dtype)
    return MemoryPlan(
        model=spec.name,
        device=req.device,
        device_memory_bytes=req.device_memory_bytes,
        tensor_parallel_size=tp,
        usable_fraction=req.usable_fraction,
        usable_bytes=budget.usable,
        weights_bytes=budget.weights,
        weights_source=weights_source(spec),
        activation_bytes=budget.runtime.activation_bytes,
        logits_bytes=budget.runtime.logits_bytes,
        runtime_fixed_bytes=budget.runtime.fixed_bytes,
        runtime_buffers_bytes=budget.runtime.total_bytes,
        safety_margin_bytes=budget.margin,
        kv_budget_bytes=budget.kv_budget,
        kv_budget_source=budget.kv_source,
        weight_dtype=engine.weight_dtype,
        k_dtype=k,
        v_dtype=v,
        kv_bytes_per_token=kv_bytes_per_token(spec, k, v, tensor_parallel_size=tp),
        kv_bytes_per_token_at_seq_len=round(
            kv_bytes_for_tokens(spec, seq, k, v, tensor_parallel_size=tp) / seq
        ),
        kv_bytes_per_sequence=fit.per_seq,
        seq_len=seq,
        batch_size=req.batch_size,
        kv_cache_bytes=row.kv_cache_bytes,
        total_bytes=row.total_bytes,
        headroom_bytes=row.headroom_bytes,
        fits=row.fits,
        reason=_fit_reason(req, budget, fit),
        block_size=engine.block,
        vllm_block_size=engine.vllm_block,
        block_size_rule_of_thumb=block_size_rule_of_thumb(seq),
        max_num_batched_tokens=engine.batched,
        max_num_seqs=engine.seqs,
        num_kv_blocks=fit.pool_blocks,
        kv_capacity_tokens=kv_capacity_tokens(
            spec, budget.kv_budget, engine.block, k, v, tensor_parallel_size=tp
        ),
        vllm_kv_cache_size_tokens=fit.vllm_tokens,
        max_concurrent_seqs=fit.max_concurrent,
        recommended_max_num_seqs=rec.max_num_seqs,
        recommended_gpu_memory_utilization=rec.gpu_memory_utilization,
        recommended_max_model_len=rec.max_model_len,
        naive_kv_bytes=naive,
        naive_error_ratio=naive / row.kv_cache_bytes,
        batch_table=tuple(_row(ctx, b, TABLE_SEQ_LEN) for b in TABLE_BATCH_SIZES),
        notes=_notes(req, engine),
        gpu_memory_utilization=req.gpu_memory_utilization,
        engine_memory_bytes=_engine_memory(req, budget),
    )
