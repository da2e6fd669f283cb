"""Hardware advice: which GPU class and how many cards fit a model and a workload."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from appliance.domain.estimator import GIB, MIB, EstimateInputError, ModelSpec
from appliance.domain.hardware import (
    GPU_CLASSES,
    GpuClass,
    HardwareAdvice,
    HardwareOption,
    advise,
    valid_tp_sizes,
)
from appliance.model_info import load_model_spec

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "model_configs"


def spec(name: str) -> ModelSpec:
    return load_model_spec(CONFIGS / f"{name}.json")


def by_gpu(advice: HardwareAdvice) -> dict[str, HardwareOption]:
    return {o.gpu: o for o in advice.options}


# Llama 3 70B geometry (not shipped as a file: only its shape matters here).
LLAMA_70B = replace(
    spec("llama3_8b"),
    name="llama3_70b",
    num_layers=80,
    hidden_size=8192,
    num_attention_heads=64,
    num_kv_heads=8,
    intermediate_size=28672,
)


def test_catalogue_covers_the_issue_classes() -> None:
    names = {g.name for g in GPU_CLASSES}
    assert names == {"T4 16GB", "A100 40GB", "A100 80GB", "H100 80GB", "H200 141GB", "L40S 48GB"}
    h200 = next(g for g in GPU_CLASSES if g.name.startswith("H200"))
    assert 140 * GIB < h200.memory_bytes < 141 * GIB  # 141 GB marketed, 140.4 GiB seen
    fp8 = {g.name for g in GPU_CLASSES if g.fp8}
    assert fp8 == {"L40S 48GB", "H100 80GB", "H200 141GB"}


@pytest.mark.parametrize(
    ("name", "sizes"),
    [
        ("smollm2_135m_instruct", (1,)),  # 9 heads: only TP 1 splits them evenly
        ("llama3_8b", (1, 2, 4, 8)),
        ("qwen2_5_7b_instruct", (1, 2, 4)),  # 28 heads
        ("deepseek_v2_lite", (1, 2, 4, 8)),
    ],
)
def test_valid_tp_sizes(name: str, sizes: tuple[int, ...]) -> None:
    assert valid_tp_sizes(spec(name)) == sizes


def test_small_workload_one_card_or_two_t4() -> None:
    advice = advise(spec("llama3_8b"), seq_len=2048, concurrency=1)
    opts = by_gpu(advice)
    # 15 GiB of bf16 weights do not fit 80 % of a 15 GiB T4; two of them do.
    assert (opts["T4 16GB"].count, opts["T4 16GB"].fits) == (2, True)
    assert any("float16" in n for n in opts["T4 16GB"].notes)
    assert any("PCIe" in n for n in opts["T4 16GB"].notes)
    assert opts["A100 40GB"].count == 1 and opts["A100 40GB"].fits
    assert advice.recommended is not None and advice.recommended.count == 1
    # Fewest cards, then the least memory: the 40 GB A100.
    assert advice.recommended.gpu == "A100 40GB"


def test_a_70b_model_needs_tensor_parallelism() -> None:
    advice = advise(LLAMA_70B, seq_len=8192, concurrency=16)
    opts = by_gpu(advice)
    # 141 GB of bf16 weights: two H100s hold 70.5 GB each, over 80 % of 80 GB; four do it.
    assert opts["H100 80GB"].count == 4 and opts["H100 80GB"].fits
    assert opts["H200 141GB"].count == 2 and opts["H200 141GB"].fits
    assert opts["H100 80GB"].weights_per_gpu_bytes == pytest.approx(
        opts["H200 141GB"].weights_per_gpu_bytes / 2, rel=1e-6
    )
    assert advice.recommended is not None
    assert (advice.recommended.gpu, advice.recommended.count) == ("H200 141GB", 2)
    assert not opts["T4 16GB"].fits and opts["T4 16GB"].count == 8


def test_mla_cache_does_not_shrink_with_tp() -> None:
    ds = spec("deepseek_v2_lite")
    small = (GpuClass("tiny 24GB", 24576 * MIB, 9.0, nvlink=True),)
    advice = advise(ds, seq_len=4096, concurrency=4, gpus=small)
    (opt,) = advice.options
    assert opt.fits and opt.count == 2  # 31 GB of weights need two 24 GB cards
    assert opt.kv_cache_per_gpu_bytes == 4 * 4096 * 27 * 576 * 2  # the whole latent per rank


def test_fp8_kv_on_gpus_without_fp8_is_noted() -> None:
    advice = advise(spec("llama3_8b"), seq_len=4096, concurrency=8, kv_dtype="fp8")
    opts = by_gpu(advice)
    assert any("FP8" in n for n in opts["A100 80GB"].notes)
    assert not any("FP8" in n for n in opts["H100 80GB"].notes)
    assert advice.kv_dtype == "fp8"


def test_nothing_fits_gives_no_recommendation() -> None:
    advice = advise(LLAMA_70B, seq_len=8192, concurrency=4096)
    assert advice.recommended is None
    assert all(not o.fits and o.count == 8 for o in advice.options)
    assert all("does not fit" in o.reason for o in advice.options)


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(EstimateInputError) as err:
        advise(spec("llama3_8b"), seq_len=2048, concurrency=0)
    assert err.value.field == "concurrency"
    with pytest.raises(EstimateInputError) as err:
        advise(spec("smollm2_135m_instruct"), seq_len=2048, concurrency=1, tp_sizes=(2, 4))
    assert err.value.field == "tensor_parallel_size"


def test_advice_to_dict_is_json() -> None:
    doc = json.loads(
        json.dumps(advise(spec("qwen2_5_7b_instruct"), seq_len=32768, concurrency=64).to_dict())
    )
    assert len(doc["options"]) == len(GPU_CLASSES)
    assert doc["recommended"]["fits"] is True
    assert isinstance(doc["options"][0]["notes"], list)
