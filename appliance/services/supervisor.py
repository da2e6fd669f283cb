"""Engine supervisor: start, health watch, graceful restart, drain; the one owner of the engine."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from enum import StrEnum

from appliance.config import EngineConfig
from appliance.domain.engine_types import EngineInfo, EngineStats
from appliance.domain.step_latency import StepLatency
from appliance.errors import EngineDead, EngineStartError, NotReady
from appliance.ports import Engine, EngineFactory, OpenAIFrontend
from appliance.services.admission import AdmissionQueue
from appliance.services.events import EventBus

log = logging.getLogger("appliance.supervisor")


class EngineState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    PAUSED = "paused"
    RESTARTING = "restarting"
    DRAINING = "draining"
    ENGINE_DEAD = "engine_dead"
    STOPPED = "stopped"


# States in which new requests join the queue (they run once the engine admits again).
_QUEUEING_STATES = {EngineState.READY, EngineState.PAUSED, EngineState.RESTARTING}


class EngineSupervisor:
    """Owns the engine's lifecycle and tells the API whether to admit."""

    def __init__(
        self,
        factory: EngineFactory,
        admission: AdmissionQueue,
        events: EventBus,
        cfg: EngineConfig,
        retry_after_s: int,
    ) -> None:
        self._factory = factory
        self._admission = admission
        self._events = events
        self._cfg = cfg
        self._retry_after_s = retry_after_s
        self._engine: Engine | None = None
        self._state = EngineState.STOPPED
        self._lock = asyncio.Lock()  # one lifecycle change at a time
        self._health_task: asyncio.Task[None] | None = None
        self.info: EngineInfo | None = None
        self.restarts_total: dict[str, int] = {}
        self.started_at_s: float | None = None
        self.last_error: str | None = None

    @property
    def state(self) -> EngineState:
        return self._state

    @property
    def engine(self) -> Engine:
        """The running engine; only valid while holding an admission slot."""
        if self._engine is None:
            raise EngineDead("no engine is running")
        return self._engine

    def step_latency(
        self,
        since_s: float,
        *,
        min_steps: int = 0,
        floor_s: float = -math.inf,
        request_floor_s: float | None = None,
    ) -> StepLatency | None:
        """The running engine's steps since since_s (Engine.step_latency); None while there
        is no engine."""
        if self._engine is None:
            return None
        try:
            return self._engine.step_latency(
                since_s, min_steps=min_steps, floor_s=floor_s, request_floor_s=request_floor_s
            )
        except Exception:  # an engine going down mid-call is the same as none
            return None

    def stats(self) -> EngineStats | None:
        """The running engine's figures; None while there is no engine or it cannot answer
        (starting, restarting, dead): readers then keep or leave out the engine's values."""
        if self._engine is None:
            return None
        try:
            return self._engine.stats()
        except Exception:  # an engine going down mid-call is the same as none
            return None

    def counters(self) -> tuple[float, dict[str, int]] | None:
        """The running engine's totals (Engine.counters) with its start time, which tells one
        engine's totals from the next one's; None while there is no engine."""
        if self._engine is None or self.started_at_s is None:
            return None
        try:
            return self.started_at_s, self._engine.counters()
        except Exception:  # an engine going down mid-call is the same as none
            return None

    def frontend(self) -> OpenAIFrontend:
        """The running engine's OpenAI serving layer; 503 while there is none."""
        if self._engine is None:
            raise NotReady(
                f"the engine is {self._state.value}; retry later",
                reason=self._state.value,
                retry_after_s=self._retry_after_s,
            )
        return self._engine.frontend

    def _set_state(self, state: EngineState, reason: str) -> None:
        if state is self._state:
            return
        previous, self._state = self._state, state
        self._events.emit("engine_state", reason, state=state.value, previous=previous.value)

    def check_admitting(self) -> None:
        """Raise NotReady unless new requests may join the queue now."""
        if self._state not in _QUEUEING_STATES:
            raise NotReady(
                f"the engine is {self._state.value}; retry later",
                reason=self._state.value,
                retry_after_s=self._retry_after_s,
            )

    def engine_alive(self) -> bool:
        """An engine is up and answers (what vLLM's own GET /health reports)."""
        return self._engine is not None and not self._engine.is_dead

    def readiness(self) -> tuple[bool, str]:
        """(ready, reason) for /health/ready."""
        return self._state is EngineState.READY, self._state.value

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """First start; raises EngineStartError when the engine cannot come up."""
        async with self._lock:
            self._set_state(EngineState.STARTING, "starting the engine")
            await self._start_engine()
            self._set_state(EngineState.READY, "engine ready")
            self._admission.open()
        self._health_task = asyncio.create_task(self._health_loop(), name="engine-health")

    async def _start_engine(self) -> None:
        engine = self._factory()
        started = time.monotonic()
        try:
            self.info = await asyncio.wait_for(engine.start(), timeout=self._cfg.start_timeout_s)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await engine.shutdown()
            if isinstance(exc, TimeoutError):
                raise EngineStartError(
                    "engine did not start within "
                    f"engine.start_timeout_s={self._cfg.start_timeout_s:g}"
                ) from exc
            raise
        self._engine = engine
        self.started_at_s = time.time()
        self._events.emit(
            "engine_started",
            f"engine started in {time.monotonic() - started:.1f} s",
            seconds=round(time.monotonic() - started, 1),
            kv_cache_tokens=self.info.kv_cache_tokens if self.info else None,
        )

    async def restart(self, reason: str, *, cause: str = "manual") -> float:
        """Graceful restart: hold new requests, finish running ones, swap the engine."""
        async with self._lock:
            if self._state in (EngineState.DRAINING, EngineState.STOPPED):
                raise NotReady(
                    "the daemon is shutting down",
                    reason=self._state.value,
                    retry_after_s=self._retry_after_s,
                )
            started = time.monotonic()
            was_paused = self._state is EngineState.PAUSED
            self._admission.close()
            self._set_state(EngineState.RESTARTING, f"restart: {reason}")
            await self._drain_in_flight()
            await self._stop_engine()
            await self._start_with_backoff(cause)
            self._back_in_service("engine ready after restart", paused=was_paused)
            seconds = time.monotonic() - started
            self._events.emit(
                "engine_restarted",
                f"restart done in {seconds:.1f} s: {reason}",
                cause=cause,
                seconds=round(seconds, 1),
            )
            return seconds

    def _back_in_service(self, reason: str, *, paused: bool = False) -> None:
        """After a restart or recovery: READY and dispatching, unless something overrode it.

        An operator's pause outlives a restart (the queue stays held), and a SIGTERM that
        arrived meanwhile (DRAINING) is not undone: the drain opens the queue itself.
        """
        if self._state is EngineState.DRAINING:
            return
        if paused:
            self._set_state(EngineState.PAUSED, f"{reason}; still paused by operator")
            return
        self._set_state(EngineState.READY, reason)
        self._admission.open()

    async def _start_with_backoff(self, cause: str) -> None:
        delay = self._cfg.restart_backoff_initial_s
        while True:
            self.restarts_total[cause] = self.restarts_total.get(cause, 0) + 1
            try:
                await self._start_engine()
                return
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                if self._state is EngineState.DRAINING:
                    # Shutting down: retrying would hold the lifecycle lock from the drain.
                    raise EngineStartError(f"engine start failed during shutdown: {exc}") from exc
                self._events.emit(
                    "engine_start_failed",
                    f"engine start failed, retry in {delay:g} s: {exc}",
                    retry_in_s=delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._cfg.restart_backoff_max_s)

    async def _drain_in_flight(self) -> None:
        ok = await self._admission.wait_until(
            lambda: self._admission.in_flight == 0, self._cfg.drain_timeout_s
        )
        if not ok:
            self._events.emit(
                "drain_timeout",
                f"{self._admission.in_flight} request(s) still running after "
                f"engine.drain_timeout_s={self._cfg.drain_timeout_s:g}; they are cut off",
                in_flight=self._admission.in_flight,
            )

    async def _stop_engine(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            await engine.shutdown()

    def pause(self) -> None:
        """Stop dispatching; requests queue until resume."""
        if self._state is not EngineState.READY:
            raise NotReady(
                f"cannot pause while {self._state.value}",
                reason=self._state.value,
                retry_after_s=self._retry_after_s,
            )
        self._admission.close()
        self._set_state(EngineState.PAUSED, "paused by operator")

    def resume(self) -> None:
        """Dispatch again after pause."""
        if self._state is not EngineState.PAUSED:
            raise NotReady(
                f"cannot resume while {self._state.value}",
                reason=self._state.value,
                retry_after_s=self._retry_after_s,
            )
        self._set_state(EngineState.READY, "resumed by operator")
        self._admission.open()

    async def drain_and_stop(self, timeout_s: float) -> bool:
        """SIGTERM path: refuse new requests, let admitted ones finish (bounded), stop."""
        deadline = time.monotonic() + timeout_s
        self._set_state(EngineState.DRAINING, "draining for shutdown")
        if self._health_task is not None:
            self._health_task.cancel()
        # A restart or recovery in progress owns the engine: let it finish, so the queued
        # requests (admitted ones too) have an engine to run on, then let them run.
        try:
            await asyncio.wait_for(self._lock.acquire(), timeout=max(0.0, timeout_s))
        except TimeoutError:
            locked = False
        else:
            locked = True
        try:
            if locked and self._engine is not None:
                self._admission.open()
        finally:
            if locked:
                self._lock.release()
        drained = await self._admission.wait_until(
            lambda: self._admission.in_flight == 0 and self._admission.queued() == 0,
            max(0.0, deadline - time.monotonic()),
        )
        if not drained:
            self._events.emit(
                "drain_timeout",
                "shutdown drain timed out",
                in_flight=self._admission.in_flight,
                queued=self._admission.queued(),
            )
        await self.stop()
        return drained

    async def stop(self) -> None:
        """Stop the engine now (the cleanup path)."""
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
            self._health_task = None
        async with self._lock:
            self._admission.close()
            await self._stop_engine()
            self._set_state(EngineState.STOPPED, "engine stopped")

    # -- health ----------------------------------------------------------------------

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self._cfg.health_interval_s)
            if self._lock.locked() or self._engine is None:
                continue  # a lifecycle change owns the engine right now
            try:
                if self._engine.is_dead:
                    raise EngineDead("engine core process is gone")
                await self._engine.check_health()
            except EngineDead as exc:
                await self._recover(str(exc))

    async def _recover(self, why: str) -> None:
        async with self._lock:
            if self._state in (EngineState.DRAINING, EngineState.STOPPED):
                return
            self.last_error = why
            self._admission.close()
            self._set_state(EngineState.ENGINE_DEAD, f"engine dead: {why}")
            with contextlib.suppress(Exception):
                await self._stop_engine()
            await self._start_with_backoff("engine_dead")
            self._back_in_service("engine ready after crash recovery")
