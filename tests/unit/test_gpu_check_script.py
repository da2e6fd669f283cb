"""The GPU check's CPU path, in-process: the estimator against a model built for real.

The check lives in appliance/adapters/gpu_memory_check.py (scripts/gpu_check.py runs it).

The script's GPU sections cannot run here; this runs what it does without a GPU (--cpu, so a
GPU box takes the same path): SmolLM2-135M allocated on the CPU, the other configs counted on
the meta device, and SmolLM2's KV pool allocated as vLLM lays it out.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("torch", reason="the check builds models with torch")
pytest.importorskip("transformers", reason="the check builds models with transformers")

SMOL_PARAMS = 134_515_008  # SmolLM2-135M's safetensors total (embeddings tied, stored once)


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("gpu_check") / "gpu_check.json"
    from appliance.adapters.gpu_memory_check import main

    assert main(["--cpu", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_cpu_path_runs_every_section_and_says_gpu_false(result: dict[str, Any]) -> None:
    assert result["gpu"] is False and result["finished"] is True
    assert result["errors"] == []
    sections = result["sections"]
    assert sections["nvml"]["status"] == "ok"
    for name in ("cuda_context", "activation", "estimate", "after_load"):
        assert sections[name]["gpu"] is False and sections[name]["status"] == "skipped"


def test_smollm2_weights_equal_its_parameters_x2(result: dict[str, Any]) -> None:
    smol = result["sections"]["weights"]["models"]["SmolLM2-135M-Instruct"]
    assert smol["status"] == "ok" and smol["device"] == "cpu"
    assert smol["hf_param_dtypes"] == ["bfloat16"]
    # Tied embeddings: one tensor in the built model, counted once by the estimator.
    assert smol["hf_tied_embeddings"] is True and smol["spec_tie_word_embeddings"] is True
    assert smol["hf_param_count"] == smol["estimator_param_count"] == SMOL_PARAMS
    assert smol["estimator_weights_bytes"] == smol["hf_numel_x2_bytes"] == 2 * SMOL_PARAMS
    assert smol["estimator_vs_numel_x2"]["estimate_over_measured"] == 1.0


def test_every_config_counts_as_transformers_builds_it(result: dict[str, Any]) -> None:
    models = result["sections"]["weights"]["models"]
    assert len(models) == 5
    for name, entry in models.items():
        assert entry["status"] == "ok", name
        assert entry["estimator_param_count"] == entry["hf_param_count"], name
        assert entry["estimator_count_equals_published"] is True, name


def test_smollm2_kv_pool_matches_the_allocated_tensors(result: dict[str, Any]) -> None:
    kv = result["sections"]["kv_cache"]["models"]["SmolLM2-135M-Instruct"]
    assert kv["status"] == "ok" and kv["block_size"] == 128  # vLLM's CPU block
    assert kv["estimator_pool_bytes"] == kv["tensor_bytes"] <= kv["budget_bytes"]
    assert kv["measured_kv_bytes_per_token"] == kv["estimator_kv_bytes_per_token"] == 23_040
    assert kv["capacity_tokens"] == kv["estimator_kv_capacity_tokens"]
    assert kv["spec_geometry_matches_config"] is True
