"""A vLLM general plugin (entry point `vllm.general_plugins`): fixes the appliance's engine
processes need from vLLM 0.32, applied in every process vLLM starts (the workers too).

Active only where the appliance's engine adapter set APPLIANCE_VLLM_FIXES=1 in the
environment before it built the engine (spawned workers inherit it), so a `vllm serve` from
the same virtual environment, the peer in the benchmarks, runs as vLLM ships it.

The fix: a seeded request crashed the CPU engine when its prompt was prefilled in chunks.
vLLM's model runner rewinds a request's generator after a partial-prefill step
(`gen.set_offset(gen.get_offset() - 4)`, GPUModelRunner._bookkeeping_sync), which only a CUDA
(Philox) generator supports; a CPU generator raises "CPU Generator does not use offset", the
worker dies and every request in flight fails. Any client that sends `seed` with a long
prompt next to others triggers it (evaluation harnesses send `seed` by default). On the CPU
the rewind is skipped: the discarded draws stay consumed, so a seeded answer whose prompt
was chunked is still reproducible for the same chunking but may differ from an unchunked
run of the same request. The GPU path is untouched.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

ENV_FLAG = "APPLIANCE_VLLM_FIXES"
log = logging.getLogger("appliance.engine")


def enable_in_engine_processes() -> None:
    """Called by the engine adapter before it builds the engine: its processes get the fixes."""
    os.environ[ENV_FLAG] = "1"


def register() -> None:
    """vLLM's plugin hook; runs in every vLLM process, maybe more than once: idempotent."""
    if os.environ.get(ENV_FLAG) != "1":
        return
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        _skip_cpu_generator_rewind()


def _skip_cpu_generator_rewind() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner._bookkeeping_sync
    if getattr(original, "_appliance_fix", False):
        return

    @functools.wraps(original)
    def _bookkeeping_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        batch = self.input_batch
        generators = batch.generators
        if not generators or getattr(self.device, "type", None) != "cpu":
            return original(self, *args, **kwargs)
        # The generators are read there only for the rewind: hide them for the call.
        batch.generators = {}
        try:
            return original(self, *args, **kwargs)
        finally:
            batch.generators = generators

    _bookkeeping_sync._appliance_fix = True  # type: ignore[attr-defined]
    GPUModelRunner._bookkeeping_sync = _bookkeeping_sync  # type: ignore[method-assign]
    log.debug("vLLM fix applied: no generator rewind after a partial prefill on the CPU")
