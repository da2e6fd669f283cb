"""Convert a GGUF checkpoint to bf16 safetensors and its tokenizer, with transformers."""

from __future__ import annotations

from pathlib import Path


def convert_gguf(src: Path, out_dir: Path) -> None:
    """Write src's dequantised weights (bf16 safetensors), config and tokenizer into out_dir."""
    # Heavy imports stay here: the daemon never needs them once the folder exists.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(
        src.parent, gguf_file=src.name, dtype=torch.bfloat16
    )
    # The weights are dequantised now; saving with the GGUF quantizer attached would
    # write a config that claims a quantisation the safetensors do not have.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
