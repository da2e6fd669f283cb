"""The estimator's KV capacity against what the real CPU vLLM engine allocates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from appliance.domain.estimator import (
    GIB,
    kv_capacity_tokens,
    kv_pool_blocks,
    vllm_block_size,
    vllm_kv_cache_size_tokens,
)
from appliance.model_info import load_model_spec
from tests.conftest import TEST_DTYPE

pytestmark = pytest.mark.engine

TOLERANCE = 0.01  # the bar: within 1 % of vLLM's own figure
TINY_KV_SPACE_GIB = 1
# Not a multiple of vLLM's 128-token CPU block, so the group-aware rounding is exercised.
TINY_MAX_MODEL_LEN = 2000
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")

# Builds a tiny random Llama next to a copied tokenizer, starts vLLM on it and prints what the
# engine allocated. vLLM spawns its workers, hence the __main__ guard.
_SCRIPT = textwrap.dedent(
    """
    import json, shutil, sys
    from pathlib import Path

    def build(model_dir, tokenizer_dir, files):
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        cfg = LlamaConfig(
            vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            max_position_embeddings=2048, tie_word_embeddings=True,
            bos_token_id=1, eos_token_id=2, pad_token_id=2,
        )
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
        model.save_pretrained(model_dir, safe_serialization=True)
        for name in files:
            src = Path(tokenizer_dir) / name
            if src.is_file():
                shutil.copy(src, Path(model_dir) / name)

    def measure(model_dir, max_model_len):
        from vllm import LLM

        llm = LLM(model=model_dir, max_model_len=max_model_len, dtype="bfloat16",
                  enforce_eager=True, max_num_seqs=8, seed=0)
        cache = llm.llm_engine.vllm_config.cache_config
        out = llm.generate(["Hello"], use_tqdm=False)
        return {
            "num_gpu_blocks": cache.num_gpu_blocks,
            "block_size": cache.block_size,
            "kv_cache_size_tokens": cache.kv_cache_size_tokens,
            "kv_cache_memory_bytes": cache.kv_cache_memory_bytes,
            "generated": len(out[0].outputs[0].token_ids),
        }

    if __name__ == "__main__":
        model_dir, tokenizer_dir, max_model_len = sys.argv[1], sys.argv[2], int(sys.argv[3])
        build(model_dir, tokenizer_dir, sys.argv[4].split(","))
        print("RESULT " + json.dumps(measure(model_dir, max_model_len)), flush=True)
    """
)


def _within(predicted: int, measured: int) -> bool:
    return abs(predicted - measured) <= TOLERANCE * measured


def _admin_status(daemon: Any) -> dict[str, Any]:
    req = urllib.request.Request(
        f"{daemon.url}/admin/status", headers={"Authorization": f"Bearer {daemon.token}"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def test_smollm2_kv_capacity_matches_the_running_engine(daemon: Any) -> None:
    engine = _admin_status(daemon)["engine"]
    spec = load_model_spec(Path(daemon.model_dir))
    budget = round(float(engine["kv_cache_space_gib"]) * GIB)
    block = int(engine["block_size"])
    # The test daemon runs in TEST_DTYPE, so its KV cache holds that dtype too.
    predicted = kv_capacity_tokens(spec, budget, block, TEST_DTYPE)
    measured = int(engine["kv_cache_tokens"])
    print(f"SmolLM2: predicted {predicted} tokens, vLLM {measured} (block {block})")
    assert block == vllm_block_size(spec, "cpu")
    assert _within(predicted, measured), (predicted, measured)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    default = Path(__file__).resolve().parents[2] / "state" / "models" / "SmolLM2-135M-Instruct"
    smol = Path(os.environ.get("APPLIANCE_SMOLLM2_DIR", default))
    if not (smol / "tokenizer.json").is_file():
        pytest.skip(f"needs the prepared SmolLM2 tokenizer at {smol} (run model preparation)")
    model_dir = tmp_path_factory.mktemp("tiny-llama")
    script = model_dir.parent / "tiny_llama_probe.py"
    script.write_text(_SCRIPT, encoding="utf-8")
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(TINY_KV_SPACE_GIB))
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            str(script),
            str(model_dir),
            str(smol.resolve()),
            str(TINY_MAX_MODEL_LEN),
            ",".join(TOKENIZER_FILES),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    measured = json.loads(lines[-1].removeprefix("RESULT "))
    measured["subprocess_s"] = round(time.monotonic() - started, 1)
    return model_dir, measured


def test_tiny_llama_blocks_and_tokens_match_vllm(tiny_llama: tuple[Path, dict[str, Any]]) -> None:
    model_dir, measured = tiny_llama
    spec = load_model_spec(model_dir)
    budget = TINY_KV_SPACE_GIB * GIB
    block = measured["block_size"]
    assert measured["generated"] > 0
    assert measured["kv_cache_memory_bytes"] == budget
    assert block == vllm_block_size(spec, "cpu")
    assert kv_pool_blocks(spec, budget, block) == measured["num_gpu_blocks"]
    # vLLM reports concurrency at max_model_len x max_model_len; 2000 is not whole blocks.
    predicted = vllm_kv_cache_size_tokens(
        spec, budget, block, TINY_MAX_MODEL_LEN, in_flight_tokens=2048
    )
    print(f"tiny Llama: predicted {predicted} tokens, vLLM {measured}")
    assert _within(predicted, measured["kv_cache_size_tokens"]), (predicted, measured)
    assert _within(kv_capacity_tokens(spec, budget, block), measured["num_gpu_blocks"] * block)


def test_tiny_llama_weights_are_read_from_the_safetensors_header(
    tiny_llama: tuple[Path, dict[str, Any]],
) -> None:
    model_dir, _ = tiny_llama
    spec = load_model_spec(model_dir)
    # Tied embeddings: 49152 x 128 once, two layers, final norm.
    layer = 2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 256 + 2 * 128
    assert spec.param_count == 49152 * 128 + 2 * layer + 128
    assert spec.param_bytes == 2 * spec.param_count
