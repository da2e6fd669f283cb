"""Telemetry service: sample the GPUs off the event loop, run the thermal policy, report.

`build_telemetry` picks the adapter for a `telemetry:` config section; `TelemetryLoop` owns
the periodic task. Neither raises out of the loop: a failed sample, policy step or callback
is logged and the next tick runs as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from appliance.adapters.nvml import NvmlTelemetry
from appliance.adapters.replay import ReplayTelemetry
from appliance.adapters.simgpu import SimGpu
from appliance.config.telemetry import TelemetryConfig
from appliance.domain import thermal
from appliance.domain.energy import EnergyPerToken
from appliance.domain.gpu_sample import GpuSample, Telemetry
from appliance.domain.thermal import ThermalDecision, ThermalPolicyConfig, ThermalState

log = logging.getLogger(__name__)


def build_telemetry(
    cfg: TelemetryConfig,
    *,
    load_fn: Callable[[], float] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Telemetry:
    """The adapter for `cfg.source`; `auto` is NVML when it opens with a GPU, else the sim."""
    if cfg.source == "sim":
        return SimGpu(cfg.sim, load_fn=load_fn, clock=clock)
    if cfg.source == "replay":
        rc = cfg.replay
        assert rc.path is not None  # TelemetryConfig's validator guarantees it
        return ReplayTelemetry(rc.path, mode=rc.mode, speed=rc.speed, loop=rc.loop, clock=clock)
    nvml = NvmlTelemetry(pcie_throughput_interval_s=cfg.pcie_throughput_interval_s)
    if cfg.source == "nvml":
        # Asked for explicitly: keep it even when unavailable, so the state says why.
        return nvml
    if nvml.available and nvml.gpu_count > 0:
        return nvml
    why = nvml.error or "NVML found no GPU"
    nvml.close()
    log.warning("telemetry: %s; using the simulated GPU (samples say SIMULATED)", why)
    return SimGpu(cfg.sim, load_fn=load_fn, clock=clock)


class TelemetryLoop:
    """Samples every `interval_s`, steps the thermal policy, calls back with both."""

    def __init__(
        self,
        telemetry: Telemetry,
        policy_cfg: ThermalPolicyConfig,
        interval_s: float,
        on_sample: Callable[[list[GpuSample]], None] | None = None,
        on_decision: Callable[[ThermalDecision], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        initial_state: ThermalState | None = None,
        tokens_fn: Callable[[], int] | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.telemetry = telemetry
        self.policy_cfg = policy_cfg  # replaceable at runtime, e.g. after recalibration
        self.interval_s = interval_s
        self._on_sample = on_sample
        self._on_decision = on_decision
        self._clock = clock
        self.thermal_state: ThermalState = (
            initial_state if initial_state is not None else thermal.initial_state(clock())
        )
        self.latest_samples: list[GpuSample] = []
        self.latest_decision: ThermalDecision | None = None
        self.last_sample_at_s: float | None = None  # on `clock`
        self.last_sample_duration_s: float | None = None
        # Sum of positive energy-counter steps over all GPUs since the loop started: the
        # source for appliance_energy_joules_total.
        self.energy_total_j = 0.0
        # Generated tokens so far (the API's counter), for joules per token.
        self._tokens_fn = tokens_fn
        self.energy_per_token = EnergyPerToken(window_s=60.0)
        self.samples_taken = 0
        self.errors = 0
        self.consecutive_errors = 0
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True while the periodic task is alive."""
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Take a first sample now, then keep sampling in a background task."""
        if self.running:
            return
        await self.tick()
        self._task = asyncio.create_task(self._run(), name="telemetry-loop")

    async def stop(self) -> None:
        """Cancel the periodic task and wait for it; the telemetry's owner closes it."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def __aenter__(self) -> TelemetryLoop:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time() + self.interval_s
        while True:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            # Fixed-rate schedule; if a tick overran, start again from now instead of
            # firing a burst to catch up.
            next_at = max(next_at + self.interval_s, loop.time())
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # tick() guards itself; this is the last line of defence
                log.exception("telemetry loop: unexpected error")

    # -- one round ----------------------------------------------------------------------

    @property
    def any_lost(self) -> bool:
        """Some GPU in the latest samples has fallen off the bus."""
        return any(s.lost for s in self.latest_samples)

    async def tick(self) -> ThermalDecision | None:
        """Sample once and step the policy; None when the sample failed."""
        started = time.perf_counter()
        try:
            samples = await asyncio.to_thread(self.telemetry.sample)
        except Exception as e:
            self.errors += 1
            self.consecutive_errors += 1
            self.last_error = repr(e)
            # Log the first of a run of failures in full, then only count them.
            if self.consecutive_errors == 1:
                log.exception("telemetry: %s sample failed", self.telemetry.name)
            return None
        self.last_sample_duration_s = time.perf_counter() - started
        now = self._clock()
        self.consecutive_errors = 0
        self.samples_taken += 1
        delta = thermal.energy_delta_j(self.latest_samples, samples)
        if delta is not None:
            self.energy_total_j += delta
        if self._tokens_fn is not None:
            try:
                self.energy_per_token.add(now, self.energy_total_j, self._tokens_fn())
            except Exception:
                log.exception("telemetry: token count failed")
        self.latest_samples = list(samples)
        self.last_sample_at_s = now
        self._call(self._on_sample, list(samples), "on_sample")
        try:
            decision = thermal.step(self.thermal_state, samples, now, self.policy_cfg)
        except Exception as e:
            self.errors += 1
            self.last_error = repr(e)
            log.exception("telemetry: thermal policy step failed; state held")
            return None
        before = self.thermal_state
        self.thermal_state = decision.state
        self.latest_decision = decision
        if decision.changed:
            log.warning(
                "thermal %s -> %s, factor %.2f -> %.2f: %s",
                before.level.value,
                decision.level.value,
                before.factor,
                decision.factor,
                decision.reason,
            )
        self._call(self._on_decision, decision, "on_decision")
        return decision

    def _call(self, fn: Callable[[Any], None] | None, arg: object, what: str) -> None:
        if fn is None:
            return
        try:
            fn(arg)
        except Exception:
            log.exception("telemetry: %s callback failed", what)


def hottest(samples: Sequence[GpuSample]) -> GpuSample | None:
    """The sample with the highest core temperature (lost GPUs and blanks skipped)."""
    readable = [s for s in samples if not s.lost and s.core_temp_c is not None]
    return max(readable, key=lambda s: s.core_temp_c or 0.0, default=None)
