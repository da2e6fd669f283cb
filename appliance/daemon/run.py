"""`appliance serve`: run the daemon in the foreground until SIGTERM, then drain and exit."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from appliance.adapters.nvml import Inventory, read_inventory
from appliance.api.keys import SERVICES
from appliance.config import DEFAULT_MODEL, Config, resolve_model_dir
from appliance.daemon.app import build_app
from appliance.daemon.lifecycle import FATAL
from appliance.domain.estimator import EstimateInputError, ModelConfigError
from appliance.errors import EngineStartError
from appliance.ports import Tokenizer
from appliance.precheck import CheckResult, Probes, plan_for_config, run_prechecks
from appliance.services.events import Event
from appliance.services.sdnotify import SdNotifier, watchdog_loop

log = logging.getLogger("appliance.serve")


class BadModelConfig(EngineStartError):
    """engine.model or the model's config.json is unusable: a bad config, exit status 2."""


def _model_problem(model_dir: Path, exc: ModelConfigError) -> str:
    """The problem with the file it lies in: config.json for a field, else the named file."""
    named = model_dir / exc.key
    if named.is_file():  # the key is a file: config.json itself or a weights file
        return f"{named}: {str(exc).removeprefix(f'{exc.key}: ')}"
    return f"{model_dir / 'config.json'}: {exc}"


def _ensure_model(cfg: Config) -> None:
    model_dir = resolve_model_dir(cfg)
    if cfg.engine.model == DEFAULT_MODEL:
        from appliance.model_prep import is_prepared, prepare_default_model

        if not is_prepared(model_dir):
            log.info("preparing the default model (once)", extra={"path": str(model_dir)})
            prepare_default_model(model_dir)
    if not (model_dir / "config.json").is_file():
        raise BadModelConfig(f"engine.model: {model_dir} is not a model folder (no config.json)")


def _to_systemd(notifier: SdNotifier, event: Event) -> None:
    """READY=1 when the engine is ready (again), STATUS= on every engine state change."""
    if event.kind != "engine_state":
        return
    line = f"engine {event.data['state']}: {event.reason}"
    if event.data["state"] == "ready":
        notifier.ready(line)
    else:
        notifier.status(line)


def preflight(
    cfg: Config,
    *,
    nvml: Callable[[], Inventory] = read_inventory,
    probes: Probes | None = None,
) -> list[CheckResult]:
    """Pre-check the machine and refuse a memory plan that cannot fit, with the numbers."""
    probes = probes or Probes()
    inventory = nvml()
    model_dir = resolve_model_dir(cfg)
    try:
        plan = plan_for_config(cfg, inventory=inventory, host_memory=probes.host_memory_bytes())
    except ModelConfigError as exc:
        raise BadModelConfig(f"bad model config: {_model_problem(model_dir, exc)}") from None
    except EstimateInputError as exc:  # a config value or a model value outside its limits
        raise BadModelConfig(
            f"bad memory plan input (engine.* or {model_dir / 'config.json'}): {exc}"
        ) from None
    if not plan.fits:
        raise EngineStartError(f"memory plan: {plan.reason}")
    # The port is ours to bind in a moment, so the pre-check must not test it.
    results = run_prechecks(cfg, nvml=lambda: inventory, probes=probes, include_port=False)
    for r in results:
        if r.status in ("fail", "warn"):
            log.warning(
                "precheck %s: %s", r.name, r.detail, extra={"check": r.name, "status": r.status}
            )
    return results


def _load_tokenizer(model_dir: Path) -> Tokenizer:
    from appliance.adapters.hf_tokenizer import HfTokenizer

    try:
        return HfTokenizer(model_dir)
    except Exception as exc:  # transformers raises OSError, ValueError and more for a bad folder
        raise EngineStartError(
            f"{model_dir}: tokenizer does not load: {type(exc).__name__}: {exc}"
        ) from None


async def run_daemon(cfg: Config) -> int:
    """Serve until SIGTERM/SIGINT; 0 after a clean drain, 1 when the engine cannot start."""
    from appliance.adapters.vllm_engine import VllmEngine

    _ensure_model(cfg)
    prechecks = await asyncio.to_thread(preflight, cfg)
    tokenizer = await asyncio.to_thread(_load_tokenizer, resolve_model_dir(cfg))
    app = build_app(cfg, lambda: VllmEngine(cfg), tokenizer, prechecks=prechecks)
    svc = app[SERVICES]
    notifier = SdNotifier.from_env()
    svc.events.add_sink(lambda ev: _to_systemd(notifier, ev))
    # Pings come from the event loop itself: a stalled loop stops them and systemd restarts us.
    watchdog = asyncio.create_task(watchdog_loop(notifier), name="sd-watchdog")
    # handler_cancellation: a client that disconnects cancels its handler, which removes it
    # from the queue or aborts its engine request.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=5)
    await runner.setup()
    site = web.TCPSite(runner, cfg.server.host, cfg.server.port, reuse_address=True)
    await site.start()
    log.info("listening", extra={"host": cfg.server.host, "port": cfg.server.port})

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stop_wait = asyncio.ensure_future(stop.wait())
    fatal = app[FATAL]
    await asyncio.wait({stop_wait, fatal}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    notifier.stopping(f"draining (up to {cfg.engine.drain_timeout_s:g} s)")
    if fatal.done():
        log.error("engine failed to start: %s", fatal.exception())
        code = 1
    else:
        # The listener stays open while draining so late requests get 503 + Retry-After.
        drained = await svc.supervisor.drain_and_stop(cfg.engine.drain_timeout_s)
        log.info("drained" if drained else "drain timed out")
    stop_wait.cancel()
    svc.events.close()  # open /admin/events streams end now rather than hold up the exit
    await runner.cleanup()
    watchdog.cancel()
    notifier.close()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
    return code
