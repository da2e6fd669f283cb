"""config.json and safetensors headers into ModelSpec: families, nesting, errors."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from appliance.domain.estimator import ModelConfigError
from appliance.model_info import (
    load_model_spec,
    read_config_json,
    read_safetensors_header,
    spec_from_config,
    tokenizer_files,
    weight_files,
    weight_totals,
)

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "model_configs"


def cfg(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> None:
    """A real safetensors file: header length, JSON header, then zeroed tensor bytes."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape, itemsize) in tensors.items():
        size = itemsize
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


# (file, model_type, layers, kv_heads, head_dim, vocab, max_pos, window, sliding layer count)
FAMILIES = [
    ("llama3_8b", "llama", 32, 8, 128, 128256, 8192, None, 0),
    ("qwen2_5_7b_instruct", "qwen2", 28, 4, 128, 152064, 32768, None, 0),
    ("mistral_7b_v0_1", "mistral", 32, 8, 128, 32000, 32768, 4096, 32),
    ("deepseek_v2_lite", "deepseek_v2", 27, 16, 192, 102400, 163840, None, 0),
    ("gemma2_9b_it", "gemma2", 42, 8, 256, 256000, 8192, 4096, 21),
    ("gemma3_4b_it", "gemma3_text", 34, 4, 256, 262208, 131072, 1024, 29),
    ("smollm2_135m_instruct", "llama", 30, 3, 64, 49152, 8192, None, 0),
]


@pytest.mark.parametrize(
    ("name", "family", "layers", "kv", "head_dim", "vocab", "max_pos", "window", "n_sliding"),
    FAMILIES,
)
def test_shipped_configs(
    name: str,
    family: str,
    layers: int,
    kv: int,
    head_dim: int,
    vocab: int,
    max_pos: int,
    window: int | None,
    n_sliding: int,
) -> None:
    s = load_model_spec(CONFIGS / f"{name}.json")
    assert (s.model_type, s.num_layers, s.num_kv_heads, s.head_dim) == (
        family,
        layers,
        kv,
        head_dim,
    )
    assert (s.vocab_size, s.max_position_embeddings) == (vocab, max_pos)
    assert (s.sliding_window, s.num_sliding_layers) == (window, n_sliding)
    assert s.name == name and s.param_count is None  # no weights beside a bare config


def test_family_details() -> None:
    assert spec_from_config(cfg("qwen2_5_7b_instruct")).qkv_bias  # Qwen2 biases q/k/v
    assert not spec_from_config(cfg("llama3_8b")).qkv_bias
    gemma2 = spec_from_config(cfg("gemma2_9b_it"))
    assert gemma2.sliding_layers == tuple(range(0, 42, 2))  # even layers slide
    assert gemma2.tie_word_embeddings and gemma2.norms_per_layer == 4
    ds = spec_from_config(cfg("deepseek_v2_lite"))
    assert (ds.kv_lora_rank, ds.qk_rope_head_dim, ds.v_head_dim, ds.q_lora_rank) == (
        512,
        64,
        128,
        None,
    )
    assert (ds.num_experts, ds.moe_intermediate_size, ds.shared_expert_intermediate_size) == (
        64,
        1408,
        2 * 1408,
    )
    assert ds.num_dense_layers == 1 and ds.num_experts_per_tok == 6


def test_nested_text_config_and_family_defaults() -> None:
    s = spec_from_config(cfg("gemma3_4b_it"))
    # gemma-3-4b-it names only hidden/MLP/layers/window; Gemma3TextConfig supplies the rest.
    assert (s.hidden_size, s.intermediate_size, s.num_layers) == (2560, 10240, 34)
    assert (s.num_attention_heads, s.num_kv_heads, s.head_dim) == (8, 4, 256)
    assert s.dtype == "bfloat16"  # from the wrapper
    full = [i for i in range(34) if i not in s.sliding_layers]
    assert full == [5, 11, 17, 23, 29]  # every 6th layer is global


def test_nested_text_config_overrides_wrapper_keys() -> None:
    inner = cfg("llama3_8b")
    wrapped = {
        "model_type": "llava",
        "hidden_size": 1024,
        "text_config": inner,
        "torch_dtype": "float16",
    }
    s = spec_from_config(wrapped)
    assert s.hidden_size == 4096 and s.dtype == "bfloat16"  # the text model's own dtype wins


def test_qwen_sliding_only_when_enabled() -> None:
    c = cfg("qwen2_5_7b_instruct") | {
        "use_sliding_window": True,
        "sliding_window": 4096,
        "max_window_layers": 20,
    }
    s = spec_from_config(c)
    assert s.sliding_layers == tuple(range(20, 28)) and s.sliding_window == 4096


def test_explicit_layer_types() -> None:
    types = ["sliding_attention", "full_attention"] * 16
    s = spec_from_config(cfg("mistral_7b_v0_1") | {"layer_types": types})
    assert s.sliding_layers == tuple(range(0, 32, 2))
    with pytest.raises(ModelConfigError) as err:
        spec_from_config(cfg("mistral_7b_v0_1") | {"layer_types": types[:3]})
    assert err.value.key == "layer_types"


def test_transformers_5_dtype_key_and_defaults() -> None:
    c = cfg("llama3_8b")
    del c["torch_dtype"]
    assert spec_from_config(c).dtype == "float32"  # transformers' assumption when unnamed
    assert spec_from_config(c | {"dtype": "float16"}).dtype == "float16"
    del c["num_key_value_heads"]
    assert spec_from_config(c).num_kv_heads == 32  # plain multi-head attention


@pytest.mark.parametrize(
    ("drop_or_set", "key"),
    [
        ({"num_hidden_layers": None}, "num_hidden_layers"),
        ({"hidden_size": None}, "hidden_size"),
        ({"vocab_size": None}, "vocab_size"),
        ({"max_position_embeddings": None}, "max_position_embeddings"),
        ({"num_hidden_layers": "32"}, "num_hidden_layers"),
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
        ({"torch_dtype": "int3"}, "torch_dtype"),
        ({"num_attention_heads": 30}, "head_dim"),  # 4096 / 30 is no head size
    ],
)
def test_bad_config_names_the_key(drop_or_set: dict[str, Any], key: str) -> None:
    c = cfg("mistral_7b_v0_1")
    for k, v in drop_or_set.items():
        if v is None:
            c.pop(k)
        else:
            c[k] = v
    with pytest.raises(ModelConfigError) as err:
        spec_from_config(c)
    assert err.value.key == key
    assert key in str(err.value)


def test_mla_without_rope_dim_names_it() -> None:
    c = cfg("deepseek_v2_lite")
    del c["qk_rope_head_dim"]
    with pytest.raises(ModelConfigError, match="qk_rope_head_dim"):
        spec_from_config(c)


def test_unreadable_configs(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="not found"):
        read_config_json(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match="not valid JSON"):
        load_model_spec(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelConfigError, match="JSON object"):
        load_model_spec(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(cfg("llama3_8b") | {"text_config": 3}))
    with pytest.raises(ModelConfigError) as err:
        load_model_spec(tmp_path)
    assert err.value.key == "text_config"


def tiny_folder(path: Path) -> Path:
    c = cfg("smollm2_135m_instruct") | {"num_hidden_layers": 2, "vocab_size": 1000}
    (path / "config.json").write_text(json.dumps(c))
    (path / "tokenizer.json").write_text("{}")
    write_safetensors(
        path / "model-00001-of-00002.safetensors",
        {
            "model.embed_tokens.weight": ("BF16", [1000, 576], 2),
            "model.norm.weight": ("F32", [576], 4),
        },
    )
    write_safetensors(
        path / "model-00002-of-00002.safetensors",
        {
            "model.layers.0.mlp.up_proj.weight": ("BF16", [1536, 576], 2),
        },
    )
    return path


@pytest.fixture
def tmp_model(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny-model"
    folder.mkdir()
    return tiny_folder(folder)


def test_folder_weights_from_headers(tmp_model: Path) -> None:
    folder = tmp_model
    totals = weight_totals(folder)
    assert totals is not None and totals.files == 2
    assert totals.param_count == 1000 * 576 + 576 + 1536 * 576
    assert totals.param_bytes == 2 * 1000 * 576 + 4 * 576 + 2 * 1536 * 576
    assert totals.dominant_dtype == "bfloat16"
    s = load_model_spec(folder)
    assert s.name == "tiny-model" and s.param_count == totals.param_count
    assert load_model_spec(folder / "config.json").param_bytes == totals.param_bytes
    assert tokenizer_files(folder) == ["tokenizer.json"]
    assert weight_files(folder) == sorted(p.name for p in folder.glob("*.safetensors"))


def test_header_is_read_without_the_tensors(tmp_path: Path) -> None:
    # The header claims 1 TB of data the file does not have: only the header is read.
    raw = json.dumps(
        {"w": {"dtype": "BF16", "shape": [2**20, 2**19], "data_offsets": [0, 2**40]}}
    ).encode()
    path = tmp_path / "huge.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    assert read_safetensors_header(path)["w"]["shape"] == [2**20, 2**19]
    totals = weight_totals(tmp_path)
    assert totals is not None and totals.param_bytes == 2**40


def test_bad_safetensors_name_the_file(tmp_path: Path) -> None:
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01\x02")
    with pytest.raises(ModelConfigError) as err:
        read_safetensors_header(short)
    assert err.value.key == "short.safetensors"
    liar = tmp_path / "liar.safetensors"
    liar.write_bytes(struct.pack("<Q", 10_000) + b"{}")
    with pytest.raises(ModelConfigError, match="header length"):
        read_safetensors_header(liar)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{}")
    with pytest.raises(ModelConfigError, match="not valid JSON"):
        read_safetensors_header(garbage)


def test_our_reader_agrees_with_the_safetensors_library(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    st_numpy = pytest.importorskip("safetensors.numpy")
    st_numpy.save_file(
        {"a": np.zeros((3, 5), dtype=np.float16), "b": np.zeros((7,), dtype=np.float32)},
        str(tmp_path / "model.safetensors"),
    )
    totals = weight_totals(tmp_path)
    assert totals is not None
    assert (totals.param_count, totals.param_bytes) == (15 + 7, 30 + 28)


def test_no_weights_no_totals(tmp_path: Path) -> None:
    assert weight_totals(tmp_path) is None
    assert weight_files(tmp_path) == [] and tokenizer_files(tmp_path) == []
    (tmp_path / "vocab.json").write_text("{}")
    (tmp_path / "merges.txt").write_text("")
    assert tokenizer_files(tmp_path) == ["vocab.json", "merges.txt"]


def test_prepared_smollm2_if_present() -> None:
    folder = Path(__file__).resolve().parents[2] / "state" / "models" / "SmolLM2-135M-Instruct"
    if not (folder / "model.safetensors").is_file():
        pytest.skip("the default model is not prepared here")
    s = load_model_spec(folder)
    # The converted checkpoint stores the tied embedding once: 134,515,008 parameters.
    assert s.param_count == 134_515_008 and s.param_bytes == 2 * s.param_count
