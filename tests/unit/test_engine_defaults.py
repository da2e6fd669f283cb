"""The appliance's block size and KV dtype: table over devices, contexts and configs."""

from __future__ import annotations

import pytest

from appliance.domain.engine_defaults import engine_defaults


@pytest.mark.parametrize(
    ("device", "cc", "max_len", "mla", "kv", "block_cfg", "want_block", "want_kv", "words"),
    [
        ("cuda", 9.0, 4096, False, "auto", None, 32, "fp8", "above 1024"),
        ("cuda", 9.0, 1024, False, "auto", None, 64, "fp8", "at or below 1024"),
        ("cuda", 8.9, 2048, False, "auto", None, 32, "fp8", "8.9 >= 8.9"),
        ("cuda", 8.0, 2048, False, "auto", None, 32, "auto", "8.0 < 8.9"),
        ("cuda", None, 2048, False, "auto", None, 32, "auto", "unknown"),
        ("cuda", 9.0, 2048, False, "bfloat16", None, 32, "bfloat16", "set in engine.kv_cache"),
        ("cuda", 9.0, 2048, False, "auto", 16, None, "fp8", "16: set in engine.vllm"),
        ("cuda", 9.0, 2048, True, "auto", None, None, "fp8", "MLA"),
        ("cpu", None, 2048, False, "auto", None, None, "auto", "CPU engine"),
    ],
)
def test_defaults_table(device, cc, max_len, mla, kv, block_cfg, want_block, want_kv, words):
    d = engine_defaults(
        device=device,
        compute_capability=cc,
        max_model_len=max_len,
        is_mla=mla,
        configured_kv_cache_dtype=kv,
        configured_block_size=block_cfg,
    )
    assert (d.block_size, d.kv_cache_dtype) == (want_block, want_kv)
    assert len(d.reasons) == 2 and any(words in r for r in d.reasons), d.reasons
