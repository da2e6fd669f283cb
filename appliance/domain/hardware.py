"""Which GPU class and how many (tensor parallel) fit a model and a workload. Pure."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from appliance.domain.estimator import (
    DEFAULT_USABLE_FRACTION,
    MIB,
    EstimateInputError,
    MemoryPlan,
    ModelSpec,
    estimate,
    kv_dtypes,
    runtime_dtype,
)

FP8_MIN_COMPUTE_CAPABILITY = 8.9
BF16_MIN_COMPUTE_CAPABILITY = 8.0
TP_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class GpuClass:
    """A GPU model as NVML reports it: memory total, compute capability, NVLink or PCIe only."""

    name: str
    memory_bytes: int
    compute_capability: float
    nvlink: bool

    @property
    def fp8(self) -> bool:
        """Native FP8 tensor cores (Ada and Hopper onwards)."""
        return self.compute_capability >= FP8_MIN_COMPUTE_CAPABILITY

    @property
    def bf16(self) -> bool:
        """Native bfloat16 (Ampere onwards)."""
        return self.compute_capability >= BF16_MIN_COMPUTE_CAPABILITY


# Memory totals as nvidia-smi shows them (MiB), which is what vLLM's budget starts from.
GPU_CLASSES: tuple[GpuClass, ...] = (
    GpuClass("T4 16GB", 15360 * MIB, 7.5, nvlink=False),
    GpuClass("A100 40GB", 40960 * MIB, 8.0, nvlink=True),
    GpuClass("L40S 48GB", 46068 * MIB, 8.9, nvlink=False),
    GpuClass("A100 80GB", 81920 * MIB, 8.0, nvlink=True),
    GpuClass("H100 80GB", 81559 * MIB, 9.0, nvlink=True),
    GpuClass("H200 141GB", 143771 * MIB, 9.0, nvlink=True),
)


@dataclass(frozen=True)
class HardwareOption:
    """The smallest tensor-parallel count of one GPU class for the workload (or why none fits)."""

    gpu: str
    count: int
    fits: bool
    reason: str
    memory_per_gpu_bytes: int
    total_memory_bytes: int
    weights_per_gpu_bytes: int
    kv_cache_per_gpu_bytes: int
    headroom_per_gpu_bytes: int
    max_concurrent_seqs: int
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class HardwareAdvice:
    """Options per GPU class for one workload, and the smallest one that fits."""

    model: str
    seq_len: int
    concurrency: int
    kv_dtype: str
    options: tuple[HardwareOption, ...]
    recommended: HardwareOption | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "model": self.model,
            "seq_len": self.seq_len,
            "concurrency": self.concurrency,
            "kv_dtype": self.kv_dtype,
            "options": [_option_dict(o) for o in self.options],
            "recommended": _option_dict(self.recommended) if self.recommended else None,
        }


def _option_dict(option: HardwareOption) -> dict[str, Any]:
    out = asdict(option)
    out["notes"] = list(option.notes)
    return out


def valid_tp_sizes(spec: ModelSpec, sizes: tuple[int, ...] = TP_SIZES) -> tuple[int, ...]:
    """TP sizes vLLM accepts: heads split evenly; KV heads split evenly or replicated evenly."""
    ok = []
    for tp in sizes:
        if spec.num_attention_heads % tp:
            continue
        kv = spec.num_kv_heads
        if not spec.is_mla and kv % tp and tp % kv:
            continue
        ok.append(tp)
    return tuple(ok)


def _notes(gpu: GpuClass, tp: int, k_dtype: str, weight_dtype: str) -> tuple[str, ...]:
    notes = []
    if k_dtype.startswith("fp8") and not gpu.fp8:
        notes.append(f"FP8 KV cache is not native below compute {FP8_MIN_COMPUTE_CAPABILITY}")
    if weight_dtype == "bfloat16" and not gpu.bf16:
        notes.append("no bfloat16 on this GPU: vLLM runs it in float16 (same bytes)")
    if tp > 1 and not gpu.nvlink:
        notes.append("tensor parallel over PCIe only: expect lower throughput than NVLink")
    return tuple(notes)


def _option(gpu: GpuClass, tp: int, plan: MemoryPlan, notes: tuple[str, ...]) -> HardwareOption:
    return HardwareOption(
        gpu=gpu.name,
        count=tp,
        fits=plan.fits,
        reason=plan.reason,
        memory_per_gpu_bytes=gpu.memory_bytes,
        total_memory_bytes=gpu.memory_bytes * tp,
        weights_per_gpu_bytes=plan.weights_bytes,
        kv_cache_per_gpu_bytes=plan.kv_cache_bytes,
        headroom_per_gpu_bytes=plan.headroom_bytes,
        max_concurrent_seqs=plan.max_concurrent_seqs,
        notes=notes,
    )


def advise(
    spec: ModelSpec,
    *,
    seq_len: int,
    concurrency: int,
    kv_dtype: str = "auto",
    weight_dtype: str = "auto",
    usable_fraction: float = DEFAULT_USABLE_FRACTION,
    gpus: tuple[GpuClass, ...] = GPU_CLASSES,
    tp_sizes: tuple[int, ...] = TP_SIZES,
) -> HardwareAdvice:
    """For each GPU class the fewest GPUs (TP 1/2/4/8) that hold concurrency x seq_len tokens."""
    if concurrency < 1:
        raise EstimateInputError("concurrency", f"must be >= 1, got {concurrency}")
    sizes = valid_tp_sizes(spec, tp_sizes)
    if not sizes:
        raise EstimateInputError(
            "tensor_parallel_size",
            f"none of {tp_sizes} divides {spec.num_attention_heads} attention heads evenly",
        )
    k, _ = kv_dtypes(spec, kv_dtype)
    wdtype = runtime_dtype(spec, weight_dtype)
    options = []
    for gpu in gpus:
        chosen: HardwareOption | None = None
        for tp in sizes:
            plan = estimate(
                spec,
                device_memory_bytes=gpu.memory_bytes,
                seq_len=seq_len,
                batch_size=concurrency,
                kv_dtype=kv_dtype,
                weight_dtype=weight_dtype,
                device="cuda",
                device_name=gpu.name,
                compute_capability=gpu.compute_capability,
                usable_fraction=usable_fraction,
                tensor_parallel_size=tp,
            )
            chosen = _option(gpu, tp, plan, _notes(gpu, tp, k, wdtype))
            if plan.fits:
                break
        assert chosen is not None
        options.append(chosen)
    fitting = [o for o in options if o.fits]
    # Fewest cards first (no cross-GPU traffic), then the least memory bought.
    best = min(fitting, key=lambda o: (o.count, o.total_memory_bytes)) if fitting else None
    return HardwareAdvice(spec.name, seq_len, concurrency, k, tuple(options), best)
