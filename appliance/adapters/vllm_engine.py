"""The real engine: vLLM's AsyncLLM in this process, engine core in child processes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import gc
import logging
import math
import multiprocessing
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import psutil

from appliance.adapters.vllm_frontend import VllmFrontend
from appliance.config import Config, resolve_model_dir
from appliance.domain.engine_types import (
    EngineInfo,
    EngineStats,
    GenerationDelta,
    GenerationRequest,
)
from appliance.domain.step_latency import StepLatency, StepLatencyLog
from appliance.errors import EngineDead, EngineStartError

log = logging.getLogger("appliance.engine")
T = TypeVar("T")

# Every engine start and stop runs on this one thread. On the event loop's shared pool each
# restart could land on another worker thread, and glibc gives each thread its own malloc
# arena: the tokenizers and serving objects of successive engines then fragment several
# arenas that malloc_trim cannot shrink, and the daemon's RSS creeps up restart by restart.
_ENGINE_THREAD = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="engine-life")


async def _on_engine_thread(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(_ENGINE_THREAD, fn, *args)


class _StatsSink:
    """Holds the newest scheduler stats; vLLM's stat logger writes, the daemon reads."""

    def __init__(self) -> None:
        self.latest = EngineStats()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        # Prompt tokens the scheduler looked up in the prefix cache, and those it found there
        # (vLLM's PrefixCacheStats, per stats update): a replayed prompt skips its prefill.
        self.prefix_cache_queried_tokens_total = 0
        self.prefix_cache_hit_tokens_total = 0
        self.steps = StepLatencyLog()


def _stat_logger_factory(sink: _StatsSink) -> Any:
    """A per-engine StatLoggerBase factory bound to sink (vLLM constructs the logger)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class ApplianceStatLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            if scheduler_stats is not None:
                sink.latest = EngineStats(
                    running=int(scheduler_stats.num_running_reqs),
                    waiting=int(scheduler_stats.num_waiting_reqs),
                    kv_cache_usage_ratio=float(scheduler_stats.kv_cache_usage),
                    updated_at_s=time.time(),
                )
                prefix = getattr(scheduler_stats, "prefix_cache_stats", None)
                if prefix is not None:
                    sink.prefix_cache_queried_tokens_total += int(prefix.queries)
                    sink.prefix_cache_hit_tokens_total += int(prefix.hits)
            if iteration_stats is not None:
                sink.prompt_tokens_total += int(getattr(iteration_stats, "num_prompt_tokens", 0))
                sink.generation_tokens_total += int(
                    getattr(iteration_stats, "num_generation_tokens", 0)
                )
                # Stamped on the daemon's monotonic clock, the one the controller ticks on.
                sink.steps.add(
                    time.monotonic(),
                    getattr(iteration_stats, "inter_token_latencies_iter", ()),
                    getattr(iteration_stats, "time_to_first_tokens_iter", ()),
                )

        def log_engine_initialized(self) -> None:
            pass

    return lambda vllm_config, engine_index: ApplianceStatLogger(vllm_config, engine_index)


class VllmEngine:
    """Engine port over vllm.v1 AsyncLLM; one instance per engine start."""

    def __init__(self, cfg: Config) -> None:
        self._cfg = cfg
        self._model_dir = resolve_model_dir(cfg)
        self._llm: Any = None
        self._sink = _StatsSink()
        self._children: list[int] = []
        self._device = "cpu"
        # vLLM's argument namespace (engine and frontend), set by _build.
        self._namespace: Any = None
        self._frontend: VllmFrontend | None = None

    async def start(self) -> EngineInfo:
        """Build AsyncLLM off the event loop (it blocks for the whole load and profile)."""
        if not (self._model_dir / "config.json").is_file():
            raise EngineStartError(f"engine.model: {self._model_dir} has no config.json")
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        try:
            self._llm = await _on_engine_thread(self._build)
        except EngineStartError:
            raise
        except Exception as exc:  # vLLM raises many types; the cause is in the message
            raise EngineStartError(f"vLLM failed to start: {type(exc).__name__}: {exc}") from exc
        finally:
            _drop_stored_import_tracebacks()
        # The multiprocessing resource tracker is shared by every engine start and exits
        # with this process; only the engine's own processes belong to this instance.
        self._children = [
            p.pid
            for p in psutil.Process().children(recursive=True)
            if p.pid not in before and not _is_resource_tracker(p)
        ]
        try:
            self._frontend = await VllmFrontend.build(self._llm, self._namespace)
        except Exception as exc:
            raise EngineStartError(
                f"vLLM's serving layer failed to start: {type(exc).__name__}: {exc}"
            ) from exc
        return self.info()

    @property
    def frontend(self) -> VllmFrontend:
        """vLLM's OpenAI serving layer over this engine."""
        if self._frontend is None:
            raise EngineDead("the engine has not started")
        return self._frontend

    def _device_defaults(self) -> dict[str, Any]:
        """The appliance's block size and KV dtype for this GPU (none on the CPU engine)."""
        if self._device == "cpu":
            return {}
        import torch

        from appliance.domain.engine_defaults import engine_defaults
        from appliance.model_info import load_model_spec

        major, minor = torch.cuda.get_device_capability(0)
        chosen = engine_defaults(
            device="cuda",
            compute_capability=major + minor / 10,
            max_model_len=self._cfg.engine.max_model_len,
            is_mla=load_model_spec(self._model_dir).is_mla,
            configured_kv_cache_dtype=self._cfg.engine.kv_cache_dtype,
            configured_block_size=self._cfg.engine.vllm_block_size,
        )
        for reason in chosen.reasons:
            log.info("engine default", extra={"reason": reason})
        out: dict[str, Any] = {"kv_cache_dtype": chosen.kv_cache_dtype}
        if chosen.block_size is not None:
            out["block_size"] = chosen.block_size
        return out

    def _gpu_share(self) -> float:
        """engine.gpu_memory_utilization, or the share the memory cap leaves on the smallest
        GPU the engine uses (the same arithmetic as the start check)."""
        e = self._cfg.engine
        if e.gpu_memory_utilization is not None:
            return e.gpu_memory_utilization
        if self._device == "cpu":
            return 0.9  # unused by the CPU engine (its KV budget is in bytes); vLLM's default
        import torch

        from appliance.domain.estimator import gpu_memory_utilization_for

        smallest = min(
            torch.cuda.get_device_properties(i).total_memory
            for i in range(min(e.tensor_parallel_size, torch.cuda.device_count()))
        )
        return gpu_memory_utilization_for(smallest, e.usable_memory_fraction)

    def _build(self) -> Any:
        from vllm.platforms import current_platform
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        from appliance.adapters.vllm_args import build_namespace, engine_args_from
        from appliance.adapters.vllm_plugins import enable_in_engine_processes

        # Before any engine process starts: they inherit the flag that turns the fixes on.
        enable_in_engine_processes()
        e = self._cfg.engine
        self._device = "cpu" if current_platform.is_cpu() else current_platform.device_name
        kv_bytes = None
        if self._device == "cpu":
            # An explicit byte budget is exact; VLLM_CPU_KVCACHE_SPACE takes whole GiB only
            # and would override it, so it must not leak in from the environment.
            os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
            kv_bytes = round(e.kv_cache_space_gib * 2**30)
        # vLLM's own parser over engine.* and engine.vllm: the namespace `vllm serve` would
        # have, which vLLM's serving layer is built from too.
        self._namespace = build_namespace(
            self._cfg,
            self._model_dir,
            gpu_memory_utilization=self._gpu_share(),
            kv_cache_memory_bytes=kv_bytes,
            defaults=self._device_defaults(),
        )
        return AsyncLLM.from_engine_args(
            engine_args_from(self._namespace),
            usage_context=UsageContext.OPENAI_API_SERVER,
            stat_loggers=[_stat_logger_factory(self._sink)],
        )

    def info(self) -> EngineInfo:
        """Limits and the KV profile that vLLM settled on."""
        import vllm

        vc = self._llm.vllm_config
        blocks = vc.cache_config.num_gpu_blocks
        block_size = vc.cache_config.block_size
        tokens = vc.cache_config.kv_cache_size_tokens or (blocks * block_size if blocks else None)
        return EngineInfo(
            model_dir=str(self._model_dir),
            max_model_len=int(vc.model_config.max_model_len),
            kv_cache_tokens=int(tokens) if tokens else None,
            block_size=int(block_size) if block_size else None,
            num_blocks=int(blocks) if blocks else None,
            kv_cache_space_gib=self._cfg.engine.kv_cache_space_gib
            if self._device == "cpu"
            else None,
            device=self._device,
            version=vllm.__version__,
        )

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        """Stream deltas; cancelling the consumer aborts the engine request."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

        s = request.sampling
        params = SamplingParams(
            n=1,
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            seed=s.seed,
            stop=list(s.stop) or None,
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
            output_kind=RequestOutputKind.DELTA,
        )
        prompt = {"prompt_token_ids": list(request.prompt_token_ids)}
        gen = self._llm.generate(prompt, params, request.request_id, priority=request.priority)
        try:
            async for out in gen:
                c = out.outputs[0]
                yield GenerationDelta(
                    text=c.text,
                    new_tokens=len(c.token_ids),
                    finish_reason=c.finish_reason if out.finished else None,
                )
        except EngineDeadError as exc:
            raise EngineDead("the engine died while serving this request") from exc
        except EngineGenerateError as exc:
            if self.is_dead:
                raise EngineDead("the engine died while serving this request") from exc
            raise
        finally:
            # Closing vLLM's generator on an early exit (deadline, disconnect) aborts it there.
            await gen.aclose()

    async def abort(self, request_id: str) -> None:
        await self._llm.abort(request_id)

    async def check_health(self) -> None:
        try:
            await self._llm.check_health()
        except Exception as exc:
            raise EngineDead(f"engine health check failed: {type(exc).__name__}") from exc

    @property
    def is_dead(self) -> bool:
        return self._llm is None or bool(self._llm.errored)

    def stats(self) -> EngineStats:
        return self._sink.latest

    def step_latency(
        self,
        since_s: float,
        *,
        min_steps: int = 0,
        floor_s: float = -math.inf,
        request_floor_s: float | None = None,
    ) -> StepLatency:
        return self._sink.steps.since(
            since_s, min_steps=min_steps, floor_s=floor_s, request_floor_s=request_floor_s
        )

    def num_unfinished(self) -> int:
        return int(self._llm.get_num_unfinished_requests()) if self._llm else 0

    def counters(self) -> dict[str, int]:
        return {
            "prompt_tokens_total": self._sink.prompt_tokens_total,
            "generation_tokens_total": self._sink.generation_tokens_total,
            "prefix_cache_queried_tokens_total": self._sink.prefix_cache_queried_tokens_total,
            "prefix_cache_hit_tokens_total": self._sink.prefix_cache_hit_tokens_total,
        }

    def child_pids(self) -> list[int]:
        return list(self._children)

    async def shutdown(self) -> None:
        """Stop the engine core processes; wait until they are gone; let go of everything
        the engine held, so a restart costs no memory and no open file."""
        if self._llm is None:
            return
        llm, self._llm = self._llm, None
        self._frontend = None
        await _on_engine_thread(llm.shutdown)
        await _on_engine_thread(_reap, self._children, 10.0)
        _forget_engine_memos()
        gc.collect()
        _give_memory_back()


def _is_resource_tracker(proc: psutil.Process) -> bool:
    try:
        return any("resource_tracker" in part for part in proc.cmdline())
    except psutil.Error:
        return False


def _reap(pids: list[int], timeout_s: float) -> None:
    """Wait for the engine's processes to exit, killing any that will not.

    The engine core processes are multiprocessing children: they are joined through
    multiprocessing. Reaping them any other way (waitpid through psutil) takes their exit
    status from multiprocessing, which then keeps them in its list of live children
    forever, each with its sentinel pipe open: two open files per restart. Joined, they
    leave that list, and the pipe closes with the process object (not closed here: vLLM's
    liveness thread may still be watching it for a second)."""
    mine = set(pids)
    for proc in multiprocessing.active_children():
        if proc.pid not in mine:
            continue
        mine.discard(proc.pid)
        proc.join(timeout_s)
        if proc.exitcode is None:
            log.warning(
                "engine process still alive after shutdown; killing", extra={"pid": proc.pid}
            )
            proc.kill()
            proc.join(timeout_s)
    # Anything else the engine started (not a multiprocessing child of ours).
    others = []
    for pid in mine:
        with contextlib.suppress(psutil.NoSuchProcess):
            others.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(others, timeout=timeout_s)
    for proc in alive:
        log.warning("engine child still alive after shutdown; killing", extra={"pid": proc.pid})
        proc.kill()


def _give_memory_back() -> None:
    """Hand the freed heap back to the OS (glibc keeps it in its arenas otherwise): the old
    engine's tokenizers and serving objects are tens of MiB, and a daemon that restarts
    weekly, or whose engine flaps, must not look bigger after each restart."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _drop_stored_import_tracebacks() -> None:
    """Cut the tracebacks off import errors that vLLM keeps in module globals.

    vLLM imports optional packages lazily, the first time an engine is built, and keeps the
    error of a missing one to re-raise on use (vllm.multimodal.media.audio keeps torchcodec's
    ModuleNotFoundError). Its traceback holds every frame of that import, up to the
    worker thread that built the engine, and with it the engine itself: one whole engine
    (its tokenizers and serving objects, about 50 MiB) outlived every restart. The error
    and its message stay; only the frames go."""
    for name, module in list(sys.modules.items()):
        if not name.startswith("vllm") or module is None:
            continue
        for value in list(getattr(module, "__dict__", {}).values()):
            if isinstance(value, BaseException) and value.__traceback__ is not None:
                value.with_traceback(None)


def _forget_engine_memos() -> None:
    """Clear vLLM's memo of which callables take which keyword. It is keyed by function, and
    every engine start makes new functions (the renderer's thread-safe tokenizer pool is a
    class defined per start, its methods closing over deep copies of the tokenizer): the
    memo would keep every old engine's tokenizers alive, tens of MiB per restart. It is a
    pure cache, rebuilt on the next call."""
    try:
        from vllm.utils.func_utils import _supports_kw
    except ImportError:  # another vLLM version: nothing of this kind to clear
        return
    _supports_kw.cache_clear()
