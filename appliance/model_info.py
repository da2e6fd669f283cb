"""Read a model folder (or a bare config.json) into a ModelSpec; weights counted from headers."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.domain.estimator import DTYPE_BYTES, ModelConfigError, ModelSpec

# What transformers fills in when a family's shipped config leaves a key out (read from
# Gemma2Config / Gemma3TextConfig in transformers 5.19). Geometry that must be stated
# (layers, hidden size, MLP width) is deliberately absent: missing, it is an error.
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma2": {
        "vocab_size": 256000,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 8192,
        "sliding_window": 4096,
        "tie_word_embeddings": True,
    },
    "gemma3_text": {
        "vocab_size": 262208,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "tie_word_embeddings": True,
    },
    "gemma": {"tie_word_embeddings": True},
}
# Families whose q/k/v projections carry a bias without saying so in the config.
_QKV_BIAS_FAMILIES = {"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"}
# Gemma 2/3 norm before and after both attention and MLP.
_FOUR_NORM_FAMILIES = {"gemma2", "gemma3_text", "gemma3"}

_ALIASES: dict[str, tuple[str, ...]] = {
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "vocab_size": ("vocab_size",),
    "intermediate_size": ("intermediate_size", "ffn_dim", "n_inner"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "max_sequence_length"),
}

# safetensors dtype names -> bytes; only used to name the checkpoint's dtype.
_ST_DTYPES = {
    "BF16": "bfloat16",
    "F16": "float16",
    "F32": "float32",
    "F8_E4M3": "fp8_e4m3",
    "F8_E5M2": "fp8_e5m2",
    "I8": "int8",
}
_MAX_HEADER_BYTES = 100 * 1024 * 1024  # the format's own limit


@dataclass(frozen=True)
class WeightTotals:
    """Exact parameter count and bytes summed over a folder's safetensors headers."""

    param_count: int
    param_bytes: int
    files: int
    dominant_dtype: str | None


def _get(cfg: dict[str, Any], key: str, default: Any = None) -> Any:
    for alias in _ALIASES.get(key, (key,)):
        value = cfg.get(alias)
        if value is not None:
            return value
    return default


def _require_int(cfg: dict[str, Any], key: str) -> int:
    value = _get(cfg, key)
    if value is None:
        raise ModelConfigError(key, "missing from config.json")
    return _as_int(key, value)


def _as_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ModelConfigError(key, f"must be an integer, got {value!r}")
    return int(value)


def _optional_int(cfg: dict[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    return None if value is None else _as_int(key, value)


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's own config: nested text_config wins over the wrapper's keys."""
    nested = cfg.get("text_config")
    if nested is not None and not isinstance(nested, dict):
        raise ModelConfigError("text_config", f"must be a mapping, got {type(nested).__name__}")
    merged = dict(cfg)
    merged.pop("text_config", None)
    if nested:
        merged.update(nested)
        # The wrapper's dtype applies to the text model when it does not state its own.
        for key in ("torch_dtype", "dtype"):
            if key not in nested and key in cfg:
                merged[key] = cfg[key]
    family = str(merged.get("model_type", ""))
    for key, value in _FAMILY_DEFAULTS.get(family, {}).items():
        merged.setdefault(key, value)
    return merged


def _sliding_layers(cfg: dict[str, Any], num_layers: int, window: int | None) -> tuple[int, ...]:
    if window is None:
        return ()
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise ModelConfigError("layer_types", f"must list one type per layer ({num_layers})")
        return tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention")
    family = str(cfg.get("model_type", ""))
    if cfg.get("use_sliding_window") is False:
        return ()
    if family.startswith("qwen2") or family.startswith("qwen3"):
        if not cfg.get("use_sliding_window"):
            return ()
        # Qwen slides only from max_window_layers upward.
        first = _as_int("max_window_layers", cfg.get("max_window_layers", num_layers))
        return tuple(range(first, num_layers))
    pattern = cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern"))
    if family == "gemma2":
        pattern = 2
    if pattern is not None:
        pattern = _as_int("sliding_window_pattern", pattern)
        if pattern < 1:
            raise ModelConfigError("sliding_window_pattern", f"must be >= 1, got {pattern}")
        # Every pattern-th layer is global; the rest slide (transformers' own rule).
        return tuple(i for i in range(num_layers) if (i + 1) % pattern)
    return tuple(range(num_layers))  # Mistral-style: one window for every layer


def _dtype(cfg: dict[str, Any]) -> str:
    raw = cfg.get("torch_dtype", cfg.get("dtype"))
    if raw is None:
        return "float32"  # what transformers assumes when a config names none
    name = str(raw).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise ModelConfigError("torch_dtype", f"unknown dtype {raw!r}")
    return name


@dataclass(frozen=True)
class _Attention:
    """Head geometry: plain attention, or multi-head latent attention's compressed KV."""

    head_dim: int
    kv_lora_rank: int | None
    qk_rope_head_dim: int | None
    qk_nope_head_dim: int | None


@dataclass(frozen=True)
class _Experts:
    """Mixture-of-experts geometry; all zero for a dense model."""

    num_experts: int = 0
    per_token: int = 0
    intermediate_size: int = 0
    shared_intermediate_size: int = 0
    dense_layers: int = 0


def _attention(text: dict[str, Any], hidden: int, heads: int) -> _Attention:
    kv_lora = _optional_int(text, "kv_lora_rank")
    rope_dim = _optional_int(text, "qk_rope_head_dim")
    nope_dim = _optional_int(text, "qk_nope_head_dim")
    if kv_lora is not None and (rope_dim is None or nope_dim is None):
        missing = "qk_rope_head_dim" if rope_dim is None else "qk_nope_head_dim"
        raise ModelConfigError(missing, "missing from config.json (needed with kv_lora_rank)")
    if kv_lora is not None:
        assert rope_dim is not None and nope_dim is not None
        return _Attention(nope_dim + rope_dim, kv_lora, rope_dim, nope_dim)
    if text.get("head_dim") is not None:
        return _Attention(_as_int("head_dim", text["head_dim"]), None, None, None)
    if hidden % heads:
        raise ModelConfigError(
            "head_dim", f"missing, and hidden_size {hidden} is not a multiple of {heads} heads"
        )
    return _Attention(hidden // heads, None, None, None)


def _experts(text: dict[str, Any], intermediate: int) -> _Experts:
    experts = _as_int(
        "n_routed_experts",
        text.get("n_routed_experts")
        or text.get("num_local_experts")
        or text.get("num_experts")
        or 0,
    )
    if not experts:
        return _Experts()
    per_tok = _as_int("num_experts_per_tok", text.get("num_experts_per_tok", 0))
    moe_inter = _as_int("moe_intermediate_size", text.get("moe_intermediate_size") or intermediate)
    if text.get("n_shared_experts"):
        shared = _as_int("n_shared_experts", text["n_shared_experts"]) * moe_inter
    else:
        shared = _as_int(
            "shared_expert_intermediate_size", text.get("shared_expert_intermediate_size", 0)
        )
    dense = _as_int("first_k_dense_replace", text.get("first_k_dense_replace", 0))
    if isinstance(text.get("mlp_only_layers"), list):
        dense = max(dense, len(text["mlp_only_layers"]))
    return _Experts(experts, per_tok, moe_inter, shared, dense)


def spec_from_config(
    cfg: dict[str, Any], name: str = "", weights: WeightTotals | None = None
) -> ModelSpec:
    """Build a ModelSpec from a parsed config.json; ModelConfigError names a bad key."""
    if not isinstance(cfg, dict):
        raise ModelConfigError("config.json", "must hold a JSON object")
    text = _text_config(cfg)
    layers = _require_int(text, "num_hidden_layers")
    hidden = _require_int(text, "hidden_size")
    heads = _require_int(text, "num_attention_heads")
    kv_heads = _as_int("num_key_value_heads", text.get("num_key_value_heads") or heads)
    att = _attention(text, hidden, heads)
    mla = att.kv_lora_rank is not None
    intermediate = _get(text, "intermediate_size")
    intermediate = (
        4 * hidden if intermediate is None else _as_int("intermediate_size", intermediate)
    )
    window = _optional_int(text, "sliding_window")
    sliding = _sliding_layers(text, layers, window)
    family = str(text.get("model_type", ""))
    moe = _experts(text, intermediate)
    stored_dtype = _dtype(text)
    quantized = bool(cfg.get("quantization_config") or text.get("quantization_config"))
    tie = text.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
    return ModelSpec(
        name=name or str(cfg.get("_name_or_path") or family or "model"),
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=att.head_dim,
        vocab_size=_require_int(text, "vocab_size"),
        intermediate_size=intermediate,
        max_position_embeddings=_require_int(text, "max_position_embeddings"),
        model_type=family,
        dtype=stored_dtype,
        tie_word_embeddings=bool(tie),
        qkv_bias=bool(text.get("attention_bias", False)) or family in _QKV_BIAS_FAMILIES,
        sliding_window=window if sliding else None,
        sliding_layers=sliding,
        kv_lora_rank=att.kv_lora_rank,
        qk_rope_head_dim=att.qk_rope_head_dim,
        qk_nope_head_dim=att.qk_nope_head_dim,
        v_head_dim=_optional_int(text, "v_head_dim") if mla else None,
        q_lora_rank=_optional_int(text, "q_lora_rank") if mla else None,
        num_experts=moe.num_experts,
        num_experts_per_tok=moe.per_token,
        moe_intermediate_size=moe.intermediate_size,
        shared_expert_intermediate_size=moe.shared_intermediate_size,
        num_dense_layers=moe.dense_layers,
        norms_per_layer=4 if family in _FOUR_NORM_FAMILIES else 2,
        param_count=weights.param_count if weights else None,
        param_bytes=weights.param_bytes if weights else None,
        quantized=quantized,
    )


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of one .safetensors file: 8-byte little-endian length, then JSON."""
    with path.open("rb") as fh:
        prefix = fh.read(8)
        if len(prefix) != 8:
            raise ModelConfigError(path.name, "too short to be a safetensors file")
        (length,) = struct.unpack("<Q", prefix)
        size = path.stat().st_size
        if length > _MAX_HEADER_BYTES or 8 + length > size:
            raise ModelConfigError(
                path.name, f"header length {length} exceeds the file ({size} bytes) or 100 MiB"
            )
        raw = fh.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelConfigError(path.name, f"header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ModelConfigError(path.name, "header must be a JSON object")
    return header


def weight_totals(model_dir: Path) -> WeightTotals | None:
    """Sum parameter counts and bytes over the folder's safetensors headers; None if none."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    count = nbytes = 0
    by_dtype: dict[str, int] = {}
    for path in files:
        for tensor, info in read_safetensors_header(path).items():
            if tensor == "__metadata__":
                continue
            try:
                start, end = info["data_offsets"]
                shape = info["shape"]
                dtype = info["dtype"]
            except (TypeError, KeyError, ValueError):
                raise ModelConfigError(
                    path.name, f"tensor {tensor!r} lacks shape/offsets"
                ) from None
            count += math.prod(shape)
            nbytes += end - start
            by_dtype[dtype] = by_dtype.get(dtype, 0) + (end - start)
    dominant = max(by_dtype, key=lambda d: by_dtype[d]) if by_dtype else None
    return WeightTotals(count, nbytes, len(files), _ST_DTYPES.get(dominant or "", dominant))


def _config_path(path: Path) -> Path:
    return path / "config.json" if path.is_dir() else path


def read_config_json(path: str | Path) -> dict[str, Any]:
    """Parse a model folder's config.json (or the given JSON file)."""
    cfg_path = _config_path(Path(path).expanduser())
    try:
        text = cfg_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelConfigError("config.json", f"not found at {cfg_path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelConfigError("config.json", f"unreadable at {cfg_path}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelConfigError("config.json", f"not valid JSON at {cfg_path}: {exc}") from None
    if not isinstance(data, dict):
        raise ModelConfigError("config.json", f"must hold a JSON object ({cfg_path})")
    return data


def load_model_spec(path: str | Path) -> ModelSpec:
    """ModelSpec for a model folder or a config.json; exact weight bytes when weights are there."""
    p = Path(path).expanduser()
    cfg = read_config_json(p)
    folder = p if p.is_dir() else p.parent
    weights = weight_totals(folder)
    name = p.name if p.is_dir() else (p.parent.name if p.name == "config.json" else p.stem)
    return spec_from_config(cfg, name=name, weights=weights)


def tokenizer_files(model_dir: Path) -> list[str]:
    """The tokenizer files a folder holds (tokenizer.json, a sentencepiece model, or BPE)."""
    found = [n for n in ("tokenizer.json", "tokenizer.model") if (model_dir / n).is_file()]
    if (model_dir / "vocab.json").is_file() and (model_dir / "merges.txt").is_file():
        found += ["vocab.json", "merges.txt"]
    return found


def weight_files(model_dir: Path) -> list[str]:
    """Weight files in a folder: safetensors, else PyTorch .bin."""
    names = sorted(p.name for p in model_dir.glob("*.safetensors"))
    return names or sorted(p.name for p in model_dir.glob("*.bin"))
