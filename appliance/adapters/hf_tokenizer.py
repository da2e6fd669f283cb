"""The model's Hugging Face tokenizer: token counts and chat prompts before the engine."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from appliance.errors import EngineStartError


class HfTokenizer:
    """The model's own tokenizer and chat template, used before the engine sees a request."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(model_dir))
        if not getattr(self._tok, "chat_template", None):
            raise EngineStartError(f"{model_dir}: tokenizer has no chat template")

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        return str(
            self._tok.apply_chat_template(
                list(messages), tokenize=False, add_generation_prompt=True
            )
        )

    @property
    def vocab_size(self) -> int:
        return len(self._tok)
