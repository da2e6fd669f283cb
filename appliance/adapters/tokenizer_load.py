"""Load a model folder's tokenizer offline, as the daemon will; report its vocabulary size."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LoadedVocab:
    """Which loader read the tokenizer, and its vocabulary size."""

    loader: str  # "tokenizer.json" or "AutoTokenizer"
    size: int


def load_vocab(model_dir: Path) -> LoadedVocab:
    """Load the folder's tokenizer without the network; raise whatever the loader raises."""
    tokenizer_json = model_dir / "tokenizer.json"
    if tokenizer_json.is_file():
        # The fast tokenizer AutoTokenizer wraps, parsed by the same Rust library in ~0.1 s;
        # AutoTokenizer itself first imports torch and transformers (~3 s on 2 cores).
        from tokenizers import Tokenizer

        return LoadedVocab(
            "tokenizer.json", Tokenizer.from_file(str(tokenizer_json)).get_vocab_size()
        )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    return LoadedVocab("AutoTokenizer", len(tokenizer))
