"""Estimator tables against hand-computed figures, and the properties the plan must keep."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.commands import estimate as estimate_cmd
from appliance.domain.estimator import (
    GIB,
    MIB,
    EstimateInputError,
    KvGroups,
    ModelConfigError,
    ModelSpec,
    estimate,
    estimated_param_count,
    gpu_memory_utilization_for,
    kv_blocks_per_sequence,
    kv_bytes_for_tokens,
    kv_bytes_per_token,
    kv_capacity_tokens,
    kv_groups,
    kv_heads_per_gpu,
    kv_pool_blocks,
    naive_kv_bytes,
    safety_margin_bytes,
    usable_fraction_needed,
    vllm_block_size,
    vllm_kv_cache_size_tokens,
    weights_bytes,
)
from appliance.model_info import load_model_spec

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "model_configs"
SHIPPED = sorted(p.stem for p in CONFIGS.glob("*.json"))


def spec(name: str) -> ModelSpec:
    return load_model_spec(CONFIGS / f"{name}.json")


# KV bytes per token, every layer, bf16: 2 x layers x KV heads x head_dim x 2 bytes, except
# MLA, which caches (kv_lora_rank + qk_rope_head_dim) x 2 bytes per layer.
KV_PER_TOKEN = {
    "llama3_8b": 2 * 32 * 8 * 128 * 2,  # 131,072
    "qwen2_5_7b_instruct": 2 * 28 * 4 * 128 * 2,  # 57,344
    "mistral_7b_v0_1": 2 * 32 * 8 * 128 * 2,  # 131,072
    "deepseek_v2_lite": 27 * (512 + 64) * 2,  # 31,104
    "gemma2_9b_it": 2 * 42 * 8 * 256 * 2,  # 344,064
    "gemma3_4b_it": 2 * 34 * 4 * 256 * 2,  # 139,264
    "smollm2_135m_instruct": 2 * 30 * 3 * 64 * 2,  # 23,040 (30 layers, 3 KV heads of 64)
}

# Parameters from the architecture, summed by hand (model cards: 8.03B, 7.62B, 7.24B, 15.7B,
# 9.24B, 135M).
PARAMS = {
    "llama3_8b": 2 * 128256 * 4096
    + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096)
    + 4096,
    "qwen2_5_7b_instruct": 2 * 152064 * 3584
    + 28 * (2 * 3584 * 3584 + 2 * 3584 * 512 + (3584 + 2 * 512) + 3 * 3584 * 18944 + 2 * 3584)
    + 3584,
    "mistral_7b_v0_1": 2 * 32000 * 4096
    + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096)
    + 4096,
    "deepseek_v2_lite": 2 * 102400 * 2048
    + 27 * (2048 * 16 * 192 + 2048 * 576 + 512 + 512 * 16 * 256 + 16 * 128 * 2048 + 2 * 2048)
    + 3 * 2048 * 10944
    + 26 * (64 * 3 * 2048 * 1408 + 3 * 2048 * 2816 + 2048 * 64)
    + 2048,
    "gemma2_9b_it": 256000 * 3584
    + 42 * (2 * 3584 * 4096 + 2 * 3584 * 2048 + 3 * 3584 * 14336 + 4 * 3584)
    + 3584,
    "smollm2_135m_instruct": 49152 * 576
    + 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536 + 2 * 576)
    + 576,
}


@pytest.mark.parametrize("name", sorted(KV_PER_TOKEN))
def test_kv_bytes_per_token_table(name: str) -> None:
    assert kv_bytes_per_token(spec(name)) == KV_PER_TOKEN[name]


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_param_count_table(name: str) -> None:
    assert estimated_param_count(spec(name)) == PARAMS[name]


def test_published_totals_are_reproduced() -> None:
    assert PARAMS["llama3_8b"] == 8_030_261_248
    assert PARAMS["qwen2_5_7b_instruct"] == 7_615_616_512
    assert PARAMS["gemma2_9b_it"] == 9_241_705_984
    assert round(PARAMS["deepseek_v2_lite"] / 1e9, 1) == 15.7
    assert PARAMS["smollm2_135m_instruct"] == 134_515_008


def test_every_shipped_config_has_a_table_row() -> None:
    assert set(SHIPPED) == set(KV_PER_TOKEN)


def test_grouped_query_attention_is_not_the_hidden_size_formula() -> None:
    smol = spec("smollm2_135m_instruct")
    naive_per_token = 2 * 576 * 30 * 2
    assert naive_per_token == 3 * kv_bytes_per_token(smol)  # 9 query heads share 3 KV heads


def test_mla_caches_latent_and_rope_only() -> None:
    ds = spec("deepseek_v2_lite")
    assert ds.is_mla
    # A per-head cache of the same model would hold 2 x 16 heads x 192 per layer.
    per_head_equivalent = 27 * 2 * 16 * 192 * 2
    assert kv_bytes_per_token(ds) * 20 < per_head_equivalent * 2
    assert kv_bytes_per_token(ds, "fp8") == 27 * 576


def test_mla_cache_is_not_split_by_tensor_parallelism() -> None:
    ds = spec("deepseek_v2_lite")
    assert kv_bytes_per_token(ds, tensor_parallel_size=8) == kv_bytes_per_token(ds)


def test_gqa_heads_split_by_tp_then_replicate() -> None:
    llama = spec("llama3_8b")
    assert kv_heads_per_gpu(llama, 2) == 4
    assert kv_bytes_per_token(llama, tensor_parallel_size=2) == 131072 // 2
    assert kv_heads_per_gpu(llama, 16) == 1  # 8 KV heads on 16 ranks: one replica each


def test_mixed_k_and_v_dtypes_are_computed() -> None:
    llama = spec("llama3_8b")
    assert kv_bytes_per_token(llama, "fp8", "bfloat16") == 32 * 8 * 128 * (1 + 2)
    assert kv_bytes_per_token(llama, "fp8", "fp8") == 131072 // 2
    plan = estimate(llama, device_memory_bytes=80 * GIB, kv_dtype="fp8", v_dtype="bfloat16")
    assert plan.k_dtype == "fp8" and plan.v_dtype == "bfloat16"
    assert any("one kv_cache_dtype" in n for n in plan.notes)


def test_sliding_layers_are_capped_at_the_window() -> None:
    gemma = spec("gemma2_9b_it")
    layer = 8 * 256 * 2 * 2
    assert kv_bytes_for_tokens(gemma, 8192) == layer * (21 * 8192 + 21 * 4096)
    assert kv_bytes_for_tokens(gemma, 1000) == layer * 42 * 1000  # inside the window
    mistral = spec("mistral_7b_v0_1")
    assert kv_bytes_for_tokens(mistral, 32768) == 32 * 4096 * 4096  # every layer slides
    assert kv_bytes_for_tokens(spec("llama3_8b"), 32768) == 32768 * 131072


def test_kv_groups_follow_vllm() -> None:
    assert kv_groups(spec("llama3_8b")) == KvGroups(32, 1, 0)
    assert kv_groups(spec("mistral_7b_v0_1")) == KvGroups(32, 0, 1)
    assert kv_groups(spec("gemma2_9b_it")) == KvGroups(21, 1, 1)
    assert kv_groups(spec("gemma3_4b_it")) == KvGroups(5, 1, 6)  # 5 full, 29 sliding
    base = spec("llama3_8b")
    near_even = replace(base, num_layers=25, sliding_window=128, sliding_layers=tuple(range(12)))
    assert kv_groups(near_even) == KvGroups(13, 1, 1)  # 12 sw + 13 full: padded, not split


def test_sliding_blocks_per_sequence_as_vllm_reserves() -> None:
    gemma = spec("gemma2_9b_it")
    # full: 8192 / 16 = 512; sliding: cdiv(min(4095 + 2048, 8192), 16) + 1 = 385
    assert kv_blocks_per_sequence(gemma, 8192, 16, 2048) == 512 + 385
    assert kv_blocks_per_sequence(spec("llama3_8b"), 8193, 16, 2048) == 513


def test_smollm2_capacity_matches_vllm_measurement() -> None:
    smol = spec("smollm2_135m_instruct")
    # Measured on the CPU engine: a 2 GiB KV cache -> 728 blocks of 128 = 93,184 tokens.
    assert kv_pool_blocks(smol, 2 * GIB, 128) == 728
    assert kv_capacity_tokens(smol, 2 * GIB, 128) == 93184
    assert vllm_kv_cache_size_tokens(smol, 2 * GIB, 128, 2048, in_flight_tokens=2048) == 93184
    # 2000 is not whole blocks: 16 blocks per request, 728 / 16 x 2000.
    assert vllm_kv_cache_size_tokens(smol, 2 * GIB, 128, 2000, in_flight_tokens=2048) == 91000


def test_block_size_vllm_would_pick() -> None:
    assert vllm_block_size(spec("llama3_8b"), "cpu") == 128
    assert vllm_block_size(spec("llama3_8b"), "cuda") == 16
    assert vllm_block_size(spec("deepseek_v2_lite"), "cuda", 9.0) == 64
    assert vllm_block_size(spec("deepseek_v2_lite"), "cuda", 10.0) == 128
    assert vllm_block_size(spec("deepseek_v2_lite"), "cpu") == 16
    plan = estimate(spec("llama3_8b"), device_memory_bytes=80 * GIB, seq_len=4096)
    assert (plan.block_size, plan.vllm_block_size, plan.block_size_rule_of_thumb) == (16, 16, 32)
    assert (
        estimate(
            spec("llama3_8b"), device_memory_bytes=80 * GIB, seq_len=512
        ).block_size_rule_of_thumb
        == 64
    )


def test_safety_margin_is_max_of_2_gib_and_5_percent() -> None:
    assert safety_margin_bytes(16 * GIB) == 2 * GIB
    assert safety_margin_bytes(80 * GIB) == 4 * GIB
    assert safety_margin_bytes(141 * GIB) == math.ceil(141 * GIB * 0.05)


def test_llama_on_an_80_gib_gpu_hand_computed() -> None:
    llama = spec("llama3_8b")
    plan = estimate(llama, device_memory_bytes=80 * GIB, seq_len=8192, batch_size=16)
    assert plan.usable_bytes == 64 * GIB
    assert plan.weights_bytes == PARAMS["llama3_8b"] * 2
    assert plan.safety_margin_bytes == 4 * GIB
    # vLLM's defaults on an 80 GiB non-A100 GPU: 8192 batched tokens, 1024 sequences.
    assert (plan.max_num_batched_tokens, plan.max_num_seqs) == (8192, 1024)
    assert plan.logits_bytes == 1024 * 128256 * 4 * 2
    base = plan.weights_bytes + plan.runtime_buffers_bytes + plan.safety_margin_bytes
    assert plan.kv_budget_bytes == 64 * GIB - base
    assert plan.kv_cache_bytes == 16 * 8192 * 131072  # 16 GiB; 8192 is whole 16-blocks
    assert plan.total_bytes == base + 16 * GIB
    assert plan.headroom_bytes == plan.kv_budget_bytes - 16 * GIB
    assert plan.fits and plan.reason.startswith("fits")
    assert plan.max_concurrent_seqs == plan.kv_budget_bytes // (8192 * 131072)
    assert plan.recommended_max_num_seqs == plan.max_concurrent_seqs // 8 * 8
    assert plan.recommended_gpu_memory_utilization == 0.75  # (64 - 4) / 80
    assert plan.recommended_max_model_len == 8192  # the model's own limit


# -- the cap, the margin and vLLM's gpu_memory_utilization -----------------------------------------


@pytest.mark.parametrize(
    ("memory", "cap", "util"),
    [
        (80 * GIB, 0.8, 0.75),  # 64 usable - 4 margin = 60 of 80
        (81559 * MIB, 0.8, 0.75),  # an H100 as NVML reports it: byte rounding must not cost 1 %
        (16 * GIB, 0.8, 0.67),  # the 2 GiB floor: (12.8 - 2) / 16 = 0.675, floored
        (141 * GIB, 0.9, 0.85),
        (4 * GIB, 0.5, 0.0),  # the margin alone takes the whole cap
    ],
)
def test_gpu_memory_utilization_for_the_cap(memory: int, cap: float, util: float) -> None:
    assert gpu_memory_utilization_for(memory, cap) == util


def test_configured_share_sets_the_kv_budget_as_vllm_does() -> None:
    llama = spec("llama3_8b")
    plan = estimate(llama, device_memory_bytes=80 * GIB, seq_len=8192, gpu_memory_utilization=0.7)
    # vLLM: its share (0.7 x 80 = 56 GiB) less weights and the profiled runtime buffers.
    assert plan.gpu_memory_utilization == 0.7
    assert plan.engine_memory_bytes == math.floor(80 * GIB * 0.7)
    assert plan.kv_budget_bytes == (
        plan.engine_memory_bytes - plan.weights_bytes - plan.runtime_buffers_bytes
    )
    assert plan.kv_budget_source.startswith("gpu_memory_utilization 0.7")
    assert plan.fits and plan.reason.startswith("fits")
    # Planned from the cap alone, the engine gets usable - margin: 60 of the 64 usable GiB.
    capped = estimate(llama, device_memory_bytes=80 * GIB, seq_len=8192)
    assert capped.gpu_memory_utilization is None
    assert capped.engine_memory_bytes == 60 * GIB
    at_recommended = estimate(
        llama,
        device_memory_bytes=80 * GIB,
        seq_len=8192,
        gpu_memory_utilization=capped.recommended_gpu_memory_utilization,
    )
    assert at_recommended.kv_budget_bytes == capped.kv_budget_bytes
    assert at_recommended.max_concurrent_seqs == capped.max_concurrent_seqs


def test_share_over_the_cap_does_not_fit_and_says_what_to_set() -> None:
    plan = estimate(
        spec("smollm2_135m_instruct"), device_memory_bytes=80 * GIB, gpu_memory_utilization=0.9
    )
    assert not plan.fits and plan.max_concurrent_seqs == 0
    # The recommendations stay one usable setting: what fits at the recommended 0.75.
    at_075 = estimate(
        spec("smollm2_135m_instruct"), device_memory_bytes=80 * GIB, gpu_memory_utilization=0.75
    )
    assert at_075.fits and plan.recommended_gpu_memory_utilization == 0.75
    assert plan.recommended_max_num_seqs == at_075.recommended_max_num_seqs > 0
    assert plan.recommended_max_model_len == at_075.recommended_max_model_len == 8192  # its limit
    assert plan.reason == (
        "does not fit: gpu_memory_utilization 0.9 lets the engine take 72.00 GiB; with the "
        "4.00 GiB safety margin that is 76.00 GiB, over the 80% cap (64.00 GiB of 80.00 GiB): "
        "set gpu_memory_utilization to at most 0.75"
    )
    assert not any(row.fits for row in plan.batch_table)
    # A higher cap admits it: 0.9 + 5 % margin needs 95 %.
    assert usable_fraction_needed(80 * GIB, 0.9) == pytest.approx(0.95)
    assert estimate(
        spec("smollm2_135m_instruct"),
        device_memory_bytes=80 * GIB,
        gpu_memory_utilization=0.9,
        usable_fraction=0.95,
    ).fits


def test_share_too_small_for_the_weights() -> None:
    plan = estimate(spec("llama3_8b"), device_memory_bytes=80 * GIB, gpu_memory_utilization=0.15)
    assert not plan.fits and plan.kv_budget_bytes == 0
    assert "leave nothing for the KV cache within the engine's 12.00 GiB" in plan.reason
    assert "gpu_memory_utilization 0.15 of 80.00 GiB" in plan.reason


def test_naive_formula_and_its_error() -> None:
    llama = spec("llama3_8b")
    plan = estimate(llama, device_memory_bytes=80 * GIB, seq_len=2048, batch_size=4)
    assert plan.naive_kv_bytes == math.ceil(4 * 2048 * 2 * 4096 * 32 * 2 * 1.15)
    assert plan.naive_error_ratio == pytest.approx(4.6)  # hidden 4096 vs 8 KV heads x 128
    ds = estimate(spec("deepseek_v2_lite"), device_memory_bytes=80 * GIB, seq_len=2048)
    assert ds.naive_error_ratio == pytest.approx(2 * 2048 * 27 * 2 * 1.15 / (27 * 576 * 2))
    assert naive_kv_bytes(llama, 1, 1) == math.ceil(2 * 4096 * 32 * 2 * 1.15)


def test_batch_table_rows() -> None:
    plan = estimate(spec("llama3_8b"), device_memory_bytes=24 * GIB, seq_len=8192)
    assert [r.batch_size for r in plan.batch_table] == [1, 2, 4, 8, 16, 32]
    assert {r.seq_len for r in plan.batch_table} == {2048}
    # 24 GiB: 19.2 usable - 14.96 weights - buffers - 2 margin leaves room for 2, not 4.
    assert [r.fits for r in plan.batch_table] == [True, True, False, False, False, False]
    for row in plan.batch_table:
        assert row.kv_cache_bytes == row.batch_size * 2048 * 131072
        assert row.headroom_bytes == plan.kv_budget_bytes - row.kv_cache_bytes


def test_too_big_a_model_gives_the_reason_with_numbers() -> None:
    plan = estimate(spec("llama3_8b"), device_memory_bytes=16 * GIB)
    assert not plan.fits
    assert "leave nothing for the KV cache" in plan.reason and "GiB" in plan.reason
    assert plan.max_concurrent_seqs == 0 and plan.recommended_max_num_seqs == 0
    assert plan.recommended_max_model_len == 0


def test_too_long_a_sequence_does_not_fit() -> None:
    plan = estimate(spec("llama3_8b"), device_memory_bytes=80 * GIB, seq_len=8193)
    assert not plan.fits
    assert "max_position_embeddings (8192)" in plan.reason


def test_cpu_engine_fixed_kv_space() -> None:
    smol = spec("smollm2_135m_instruct")
    plan = estimate(
        smol,
        device_memory_bytes=24 * GIB,
        device="cpu",
        kv_cache_bytes_budget=2 * GIB,
        seq_len=2048,
        batch_size=8,
    )
    assert plan.kv_budget_bytes == 2 * GIB and plan.kv_budget_source == "fixed KV space"
    assert plan.block_size == 128
    assert plan.kv_capacity_tokens == 93184 == plan.vllm_kv_cache_size_tokens
    assert plan.max_concurrent_seqs == 45  # 728 blocks // 16 per sequence
    assert plan.fits
    over = estimate(smol, device_memory_bytes=4 * GIB, device="cpu", kv_cache_bytes_budget=3 * GIB)
    assert not over.fits and "KV space 3.00 GiB" in over.reason
    short = estimate(
        smol,
        device_memory_bytes=24 * GIB,
        device="cpu",
        kv_cache_bytes_budget=GIB // 8,
        seq_len=8192,
        batch_size=1,
    )
    assert not short.fits and "need" in short.reason


def test_recommended_max_model_len_is_the_longest_that_fits() -> None:
    qwen = spec("qwen2_5_7b_instruct")
    plan = estimate(qwen, device_memory_bytes=24 * GIB, seq_len=32768, batch_size=4)
    n = plan.recommended_max_model_len
    assert 0 < n < 32768 and n % plan.block_size == 0
    assert estimate(qwen, device_memory_bytes=24 * GIB, seq_len=n, batch_size=4).fits
    assert not estimate(
        qwen, device_memory_bytes=24 * GIB, seq_len=n + plan.block_size, batch_size=4
    ).fits


def test_weights_exact_when_headers_are_known() -> None:
    smol = replace(spec("smollm2_135m_instruct"), param_count=1000, param_bytes=2000)
    assert weights_bytes(smol) == 2000
    fp32 = replace(smol, dtype="float32", param_bytes=4000)
    assert weights_bytes(fp32) == 2000  # vLLM's auto dtype runs float32 checkpoints in bf16
    packed = replace(smol, quantized=True, param_count=4000, param_bytes=600)
    assert weights_bytes(packed) == 600  # int4 packed: the bytes, not the count
    assert weights_bytes(smol, tensor_parallel_size=2) == 1000


def test_plan_to_dict_is_json() -> None:
    plan = estimate(spec("gemma2_9b_it"), device_memory_bytes=48 * GIB, seq_len=8192)
    doc = json.loads(json.dumps(plan.to_dict()))
    assert doc["fits"] is plan.fits
    assert len(doc["batch_table"]) == 6 and doc["batch_table"][0]["batch_size"] == 1
    assert doc["kv_bytes_per_token"] == 344064
    assert doc["kv_bytes_per_token_at_seq_len"] == 258048  # 8192 B x (21 + 21 x 4096 / 8192)
    assert any("window" in n for n in doc["notes"])


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"num_layers": 0}, "num_hidden_layers"),
        ({"num_kv_heads": 64}, "num_key_value_heads"),
        ({"dtype": "float13"}, "torch_dtype"),
        ({"sliding_layers": (1,)}, "sliding_window"),
        ({"sliding_window": 8, "sliding_layers": (40,)}, "layer_types"),
        ({"kv_lora_rank": 512}, "kv_lora_rank"),
        ({"num_experts": 8}, "moe_intermediate_size"),
    ],
)
def test_bad_spec_names_the_key(changes: dict, key: str) -> None:
    with pytest.raises(ModelConfigError) as err:
        replace(spec("llama3_8b"), **changes)
    assert err.value.key == key and key in str(err.value)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"seq_len": 0}, "seq_len"),
        ({"batch_size": -1}, "batch_size"),
        ({"usable_fraction": 1.5}, "usable_fraction"),
        ({"device_memory_bytes": 0}, "device_memory_bytes"),
        ({"kv_dtype": "fp7"}, "kv_dtype"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"block_size": 0}, "block_size"),
        ({"device": "tpu"}, "device"),
        ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 1.2}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 0.5, "device": "cpu"}, "gpu_memory_utilization"),
        (
            {"gpu_memory_utilization": 0.5, "kv_cache_bytes_budget": GIB},
            "gpu_memory_utilization",
        ),
    ],
)
def test_bad_estimate_input_names_the_field(kwargs: dict, field: str) -> None:
    args = {"device_memory_bytes": 80 * GIB, **kwargs}
    with pytest.raises(EstimateInputError) as err:
        estimate(spec("llama3_8b"), **args)
    assert err.value.field == field


# -- properties -------------------------------------------------------------------------------

SHIPPED_SPECS = [spec(n) for n in SHIPPED]


@st.composite
def specs(draw: st.DrawFn) -> ModelSpec:
    if draw(st.booleans()):
        return draw(st.sampled_from(SHIPPED_SPECS))
    kv = draw(st.sampled_from([1, 2, 4, 8]))
    heads = kv * draw(st.sampled_from([1, 2, 4]))
    layers = draw(st.integers(1, 48))
    window = draw(st.none() | st.integers(16, 8192))
    sliding = tuple(sorted(draw(st.sets(st.integers(0, layers - 1))))) if window else ()
    return ModelSpec(
        name="random",
        num_layers=layers,
        hidden_size=heads * 64,
        num_attention_heads=heads,
        num_kv_heads=kv,
        head_dim=draw(st.sampled_from([32, 64, 128, 256])),
        vocab_size=draw(st.integers(1000, 200_000)),
        intermediate_size=draw(st.integers(64, 30000)),
        max_position_embeddings=32768,
        sliding_window=window if sliding else None,
        sliding_layers=sliding,
    )


devices = st.sampled_from([16, 24, 40, 48, 80, 141]).map(lambda g: g * GIB)


@settings(max_examples=60, deadline=None)
@given(specs(), devices, st.integers(1, 64), st.integers(1, 64), st.integers(1, 16384))
def test_monotone_in_batch(s: ModelSpec, mem: int, b1: int, b2: int, seq: int) -> None:
    lo, hi = sorted((b1, b2))
    a = estimate(s, device_memory_bytes=mem, seq_len=seq, batch_size=lo)
    b = estimate(s, device_memory_bytes=mem, seq_len=seq, batch_size=hi)
    assert a.kv_cache_bytes <= b.kv_cache_bytes and a.total_bytes <= b.total_bytes
    assert a.headroom_bytes >= b.headroom_bytes
    assert a.fits or not b.fits


@settings(max_examples=60, deadline=None)
@given(specs(), devices, st.integers(1, 32), st.integers(1, 32768), st.integers(1, 32768))
def test_monotone_in_length(s: ModelSpec, mem: int, batch: int, l1: int, l2: int) -> None:
    lo, hi = sorted((l1, l2))
    a = estimate(s, device_memory_bytes=mem, seq_len=lo, batch_size=batch)
    b = estimate(s, device_memory_bytes=mem, seq_len=hi, batch_size=batch)
    assert a.kv_cache_bytes <= b.kv_cache_bytes and a.total_bytes <= b.total_bytes
    assert a.fits or not b.fits
    assert kv_bytes_for_tokens(s, lo) <= kv_bytes_for_tokens(s, hi)


@settings(max_examples=60, deadline=None)
@given(specs(), devices, st.integers(1, 32), st.integers(1, 32768))
def test_fp8_kv_halves_the_kv_part(s: ModelSpec, mem: int, batch: int, seq: int) -> None:
    bf16 = estimate(s, device_memory_bytes=mem, seq_len=seq, batch_size=batch, kv_dtype="bfloat16")
    fp8 = estimate(s, device_memory_bytes=mem, seq_len=seq, batch_size=batch, kv_dtype="fp8")
    assert 2 * fp8.kv_cache_bytes == bf16.kv_cache_bytes
    assert 2 * fp8.kv_bytes_per_token == bf16.kv_bytes_per_token
    # Everything else in the plan is untouched.
    assert fp8.weights_bytes == bf16.weights_bytes
    assert fp8.runtime_buffers_bytes == bf16.runtime_buffers_bytes
    assert fp8.max_concurrent_seqs >= bf16.max_concurrent_seqs


@settings(max_examples=80, deadline=None)
@given(specs(), st.integers(0, 64 * GIB), st.sampled_from([16, 32, 64, 128]))
def test_capacity_is_whole_blocks(s: ModelSpec, budget: int, block: int) -> None:
    tokens = kv_capacity_tokens(s, budget, block)
    per_token = kv_bytes_per_token(s)
    assert tokens % block == 0
    assert tokens * per_token <= budget < (tokens + block) * per_token


@settings(max_examples=60, deadline=None)
@given(specs(), st.integers(GIB // 4, 32 * GIB), st.integers(1, 64))
def test_vllm_tokens_equal_blocks_for_full_attention(
    s: ModelSpec, budget: int, blocks: int
) -> None:
    full = replace(s, sliding_window=None, sliding_layers=())
    length = blocks * 128
    reported = vllm_kv_cache_size_tokens(full, budget, 128, length, in_flight_tokens=2048)
    assert abs(reported - kv_capacity_tokens(full, budget, 128)) <= 1


@settings(max_examples=80, deadline=None)
@given(
    specs(),
    st.integers(8 * GIB, 192 * GIB),
    st.floats(0.5, 0.95),
)
def test_recommended_share_keeps_to_the_cap_and_one_percent_more_breaks_it(
    s: ModelSpec, mem: int, cap: float
) -> None:
    util = gpu_memory_utilization_for(mem, cap)
    if util <= 0:
        return
    ok = estimate(s, device_memory_bytes=mem, usable_fraction=cap, gpu_memory_utilization=util)
    assert "cap" not in ok.reason
    assert ok.engine_memory_bytes + ok.safety_margin_bytes <= ok.usable_bytes + MIB
    over = round(util + 0.01, 2)
    if over <= 1:
        breach = estimate(
            s, device_memory_bytes=mem, usable_fraction=cap, gpu_memory_utilization=over
        )
        assert not breach.fits and f"cap ({_gib_text(breach.usable_bytes)}" in breach.reason


def _gib_text(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


# -- the command ----------------------------------------------------------------------------------


def _run_estimate(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    estimate_cmd.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["estimate", *argv])
    return args.func(args)


def test_estimate_command_table_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    llama = str(CONFIGS / "llama3_8b.json")
    assert _run_estimate(["--model", llama, "--gpu-memory-gib", "80", "--seq-len", "8192"]) == 0
    out = capsys.readouterr().out
    assert "fits" in out and "Batch table at 2048 tokens" in out and "Hardware for" in out
    assert _run_estimate(["--model", llama, "--gpu-memory-gib", "16"]) == 1
    assert "does not fit" in capsys.readouterr().out
    assert _run_estimate(["--model", "/nonexistent", "--gpu-memory-gib", "16"]) == 2
    assert "config.json" in capsys.readouterr().err
    assert _run_estimate(["--model", llama, "--gpu-memory-gib", "80", "--kv-dtype", "fp7"]) == 2


def test_estimate_command_json(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(CONFIGS / "deepseek_v2_lite.json")
    code = _run_estimate(
        [
            "--model",
            path,
            "--gpu-memory-gib",
            "80",
            "--seq-len",
            "4096",
            "--batch-size",
            "8",
            "--kv-dtype",
            "fp8",
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["plan"]["fits"]
    assert doc["plan"]["kv_bytes_per_token"] == 27 * 576
    assert doc["plan"]["block_size"] == 64
    assert doc["hardware"]["recommended"]["count"] >= 1


def test_estimate_command_cpu_engine(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(CONFIGS / "smollm2_135m_instruct.json")
    code = _run_estimate(
        [
            "--model",
            path,
            "--gpu-memory-gib",
            "24",
            "--device",
            "cpu",
            "--kv-cache-space-gib",
            "2",
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["plan"]["kv_capacity_tokens"] == 93184
    assert doc["hardware"] is None


def test_estimate_command_checks_a_configured_share(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(CONFIGS / "smollm2_135m_instruct.json")
    base = ["--model", path, "--gpu-memory-gib", "80"]
    assert _run_estimate([*base, "--gpu-memory-utilization", "0.9"]) == 1
    out = capsys.readouterr().out
    assert "over the 80% cap" in out and "at most 0.75" in out
    assert "gpu_memory_utilization 0.9 (configured)" in out
    assert _run_estimate([*base, "--gpu-memory-utilization", "0.75", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plan"]["gpu_memory_utilization"] == 0.75
    assert doc["plan"]["engine_memory_bytes"] == 60 * GIB
    # Without a share the plan is made from the cap: usable - margin, and that is what it advises.
    assert _run_estimate(base) == 0
    out = capsys.readouterr().out
    assert "usable - safety margin" in out and "gpu_memory_utilization 0.75" in out
    assert _run_estimate([*base, "--device", "cpu", "--gpu-memory-utilization", "0.5"]) == 2
    assert "gpu_memory_utilization" in capsys.readouterr().err
