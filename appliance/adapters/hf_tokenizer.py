"""The model's Hugging Face tokenizer: token counts and chat prompts before the engine."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from appliance.errors import BadRequest


class HfTokenizer:
    """The model's own tokenizer and chat template, used before the engine sees a request."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(model_dir))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        if not getattr(self._tok, "chat_template", None):
            # A base or pooling model: vLLM's chat endpoint answers this itself; only a
            # document read in parts renders chat prompts here.
            raise BadRequest(
                "messages: the served model has no chat template (engine.vllm.chat_template)",
                param="messages",
            )
        return str(
            self._tok.apply_chat_template(
                list(messages), tokenize=False, add_generation_prompt=True
            )
        )

    @property
    def vocab_size(self) -> int:
        return len(self._tok)
