"""How the services feed each other: thermal decisions into admission, lost GPUs into
events, engine figures into the metrics, metric history into the load forecast."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from appliance.domain.gpu_sample import GpuSample
from appliance.domain.lanes import LANE_NAMES
from appliance.domain.thermal import ThermalDecision, ThermalLevel
from appliance.services.admission import AdmissionQueue
from appliance.services.events import EventBus
from appliance.services.metric_history import HistorySampler
from appliance.services.metrics import Metrics
from appliance.services.supervisor import EngineState, EngineSupervisor

# The load forecast reads this much recent metric history.
FORECAST_HISTORY_S = 300


def thermal_to_admission(
    admission: AdmissionQueue, events: EventBus
) -> Callable[[ThermalDecision], None]:
    """Derate (or protect) admission on every thermal decision; an event when it changes."""

    def on_decision(d: ThermalDecision) -> None:
        admission.set_derate(d.factor, protect=d.level is ThermalLevel.PROTECT)
        if d.changed:
            events.emit(
                "thermal",
                d.reason,
                level=d.level.value,
                factor=round(d.factor, 3),
                gpu=d.gpu_index,
                temp_c=d.temp_c,
                limit=admission.limit,
            )

    return on_decision


def lost_gpu_watch(events: EventBus) -> Callable[[list[GpuSample]], None]:
    """An event when a GPU falls off the bus and when it is back (the policy protects)."""
    lost: set[str] = set()

    def on_sample(samples: list[GpuSample]) -> None:
        now = {s.uuid for s in samples if s.lost}
        for s in samples:
            if s.lost and s.uuid not in lost:
                events.emit(
                    "gpu_lost",
                    f"{s.label} ({s.uuid}) is lost: PROTECT, readiness 503, realtime only",
                    gpu=s.index,
                    uuid=s.uuid,
                )
        for s in samples:
            if s.uuid in lost and s.uuid not in now:
                events.emit("gpu_recovered", f"{s.label} ({s.uuid}) answers again", gpu=s.index)
        lost.clear()
        lost.update(now)

    return on_sample


def readiness_reason(
    supervisor: EngineSupervisor, admission: AdmissionQueue
) -> Callable[[], str]:
    """What /health/ready would say now: "ready", the engine's state, or "protect" (the
    thermal policy admits realtime only), for the availability SLO."""

    def reason() -> str:
        ok, state = supervisor.readiness()
        if ok and admission.protect:
            return "protect"
        return state

    return reason


def kv_usage(supervisor: EngineSupervisor) -> float:
    """The engine's KV-cache usage, 0 while there is no engine to ask."""
    stats = supervisor.stats()
    return 0.0 if stats is None else stats.kv_cache_usage_ratio


def engine_load(supervisor: EngineSupervisor, admission: AdmissionQueue) -> float:
    """0..1: sequences running now over the most allowed; drives the simulated GPU's power."""
    stats = supervisor.stats()
    if stats is None:
        return 0.0
    running = stats.running
    return min(1.0, max(running, admission.in_flight) / max(1, admission.base_limit))


def forecaster(
    history: HistorySampler, model_path: Path, horizon_s: float
) -> Callable[[], object]:
    """Pending requests expected soon, from the last five minutes of metric history."""

    def forecast() -> object:
        from appliance.predict.runtime import load_forecast

        rows = history.history(time.time() - FORECAST_HISTORY_S)
        return load_forecast(
            rows, model_path if model_path.exists() else None, horizon_s=horizon_s
        )

    return forecast


def admission_metrics(
    metrics: Metrics, admission: AdmissionQueue, supervisor: EngineSupervisor
) -> Callable[[], None]:
    """A scrape-time refresher: admission, engine state, restarts and engine figures."""
    restarts_seen: dict[str, int] = {}
    shed_seen: dict[str, int] = {}
    # Engine totals restart from 0 with each engine; its start time tells them apart. (What
    # an engine counted after the last scrape before its restart is not carried over.)
    engine_started_at_s: float | None = None
    engine_seen: dict[str, int] = {}

    def refresh() -> None:
        nonlocal engine_started_at_s
        m = metrics
        snap = admission.snapshot()
        m.requests_in_flight.set(snap.in_flight)
        m.concurrency_limit.set(snap.limit)
        m.prefill_outstanding_tokens.set(snap.prefill_outstanding_tokens)
        m.prefill_budget_tokens.set(snap.prefill_budget_tokens or 0)
        for lane in LANE_NAMES:
            m.queue_depth.labels(lane).set(snap.queued[lane])
            shed = snap.shed_total.get(lane, 0)
            if shed > shed_seen.get(lane, 0):
                m.admission_shed_total.labels(lane).inc(shed - shed_seen.get(lane, 0))
                shed_seen[lane] = shed
        m.engine_ready.set(1 if supervisor.state is EngineState.READY else 0)
        for cause, count in supervisor.restarts_total.items():
            delta = count - restarts_seen.get(cause, 0)
            if delta > 0:
                m.engine_restarts_total.labels(cause).inc(delta)
                restarts_seen[cause] = count
        totals = supervisor.counters()
        if totals is not None:
            started_at_s, counters = totals
            if started_at_s != engine_started_at_s:
                engine_seen.clear()
                engine_started_at_s = started_at_s
            for name, counter in (
                ("prefix_cache_queried_tokens_total", m.prefix_cache_queried_tokens_total),
                ("prefix_cache_hit_tokens_total", m.prefix_cache_hit_tokens_total),
            ):
                value = counters.get(name)
                if value is not None and value > engine_seen.get(name, 0):
                    counter.inc(value - engine_seen.get(name, 0))
                    engine_seen[name] = value
        stats = supervisor.stats()
        if stats is None:  # no engine right now: the engine gauges keep their last value
            return
        m.kv_cache_usage_ratio.set(stats.kv_cache_usage_ratio)
        m.engine_running.set(stats.running)
        m.engine_waiting.set(stats.waiting)

    return refresh
