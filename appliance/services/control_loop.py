"""The batch controller loop: every tick, the pure policy picks the base concurrency limit
from live latency, KV usage, queue depth, derating and the benchmark's knee."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from appliance.domain.controller import (
    ControlDecision,
    ControlInputs,
    ControllerConfig,
    ControlMode,
    decide,
    initial_state,
    let_breaking_point_go,
)
from appliance.domain.latency_window import LatencyWindow
from appliance.domain.prefill import PrefillBudget, budget_moved, prefill_budget
from appliance.domain.step_latency import StepLatency
from appliance.services.admission import AdmissionQueue
from appliance.services.events import EventBus
from appliance.services.periodic import Periodic

log = logging.getLogger("appliance.controller")

# How far back (x live_min_steps x the TPOT SLO) the engine's steps are judged where fewer
# than live_min_steps fit in the span: a breach up to this many times the SLO is seen.
LIVE_REACH_SLO_MULTIPLE = 4


class StepLatencySource(Protocol):
    """Engine.step_latency, or None while no engine runs (Supervisor.step_latency)."""

    def __call__(
        self,
        since_s: float,
        *,
        min_steps: int = ...,
        floor_s: float = ...,
        request_floor_s: float | None = ...,
    ) -> StepLatency | None: ...


class ControlLoop:
    """The one owner of the controller's settings: mode, limits, SLO and ceiling.

    Whoever changes them (an operator through the admin API, recalibration, a benchmark)
    goes through configure() or set_ceiling(), which validate, reset what the change makes
    stale and emit the event; the settings are read back from here and nowhere else.
    """

    def __init__(
        self,
        cfg: ControllerConfig,
        mode: ControlMode,
        admission: AdmissionQueue,
        latency: LatencyWindow,
        kv_usage: Callable[[], float],
        events: EventBus,
        record: Callable[[float, int, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        forecast: Callable[[], Any] | None = None,
        keep_ceiling: Callable[[int | None, str], None] | None = None,
        step_latency: StepLatencySource | None = None,
    ) -> None:
        self._cfg = cfg
        self.mode = mode
        self.manual_limit = admission.base_limit
        self._admission = admission
        self._latency = latency
        self._kv_usage = kv_usage
        # The engine's steps since a moment (vLLM's stat logger): live evidence for probes.
        self._step_latency = step_latency
        # The throughput knee of the last applied benchmark: the limit is never above it.
        self.ceiling: int | None = None
        # Where each ceiling change is kept, so a restarted daemon steers by the same one.
        self._keep_ceiling = keep_ceiling
        self._events = events
        self._record = record
        self._clock = clock
        self.state = initial_state()
        self.last: ControlDecision | None = None
        self.prefill: PrefillBudget | None = None
        self.live: StepLatency | None = None  # the engine's steps the last tick judged
        self.decisions: list[dict[str, Any]] = []  # the recent changes, for status views
        self._periodic = Periodic("controller", self.tick, lambda: self.cfg.tick_s, log)
        # The load predictor runs off the loop (loading its model imports torch) on its own
        # beat; a tick uses the latest forecast, whatever its age within two ticks.
        self._forecast_fn = forecast
        self.forecast: Any = None
        self._forecast_at_s: float | None = None
        self._forecaster = Periodic(
            "load-forecast", self.refresh_forecast, lambda: self.cfg.tick_s, log
        )

    @property
    def cfg(self) -> ControllerConfig:
        """The policy in force (read-only: change it through configure())."""
        return self._cfg

    def configure(
        self,
        *,
        source: str = "the admin API",
        mode: str | None = None,
        limit: int | None = None,
        min_limit: int | None = None,
        max_limit: int | None = None,
        slo_ttft_p99_s: float | None = None,
        slo_tpot_p99_s: float | None = None,
    ) -> None:
        """Change mode, manual limit, bounds or SLOs (validated by ControllerConfig); tick now.

        `source` says who asked (the event carries it): the admin API, recalibration, ...
        """
        changes: dict[str, Any] = {}
        if min_limit is not None:
            changes["min_limit"] = min_limit
        if max_limit is not None:
            changes["max_limit"] = max_limit
        if slo_ttft_p99_s is not None:
            changes["slo_ttft_p99_s"] = slo_ttft_p99_s
        if slo_tpot_p99_s is not None:
            changes["slo_tpot_p99_s"] = slo_tpot_p99_s
        new_cfg = dataclasses.replace(self.cfg, **changes) if changes else self.cfg
        slo_changed = (new_cfg.slo_ttft_p99_s, new_cfg.slo_tpot_p99_s) != (
            self.cfg.slo_ttft_p99_s,
            self.cfg.slo_tpot_p99_s,
        )
        new_mode = ControlMode(mode) if mode is not None else self.mode
        if limit is not None and limit < 1:
            raise ValueError(f"limit: must be >= 1, got {limit}")
        to_auto = new_mode is ControlMode.AUTO and self.mode is ControlMode.MANUAL
        self._cfg, self.mode = new_cfg, new_mode
        if limit is not None:
            self.manual_limit = limit
        if to_auto:
            # Auto starts afresh from the limit in force: where the SLO broke before a manual
            # spell says little about the load after it (and held a later probe down).
            self.state = dataclasses.replace(initial_state(), last_change_s=self._clock())
        elif slo_changed:
            # Latency judged against the old SLO says nothing about the new one: forget where
            # it broke and judge only what comes after this change.
            self.state = dataclasses.replace(
                let_breaking_point_go(self.state),
                breach_base=None,
                breach_tick=None,
                retry_ticks=None,
                last_change_s=self._clock(),
            )
        self._events.emit(
            "controller_config",
            f"controller set to {self.mode.value}, limit "
            f"{self.manual_limit}, bounds [{self.cfg.min_limit}, {self.cfg.max_limit}], "
            f"SLO p99 TTFT {self.cfg.slo_ttft_p99_s:g} s, TPOT {self.cfg.slo_tpot_p99_s} s "
            f"(by {source})",
            source=source,
            mode=self.mode.value,
            limit=self.manual_limit,
            min=self.cfg.min_limit,
            max=self.cfg.max_limit,
            slo_ttft_p99_s=self.cfg.slo_ttft_p99_s,
            slo_tpot_p99_s=self.cfg.slo_tpot_p99_s,
        )
        self.tick()

    def set_ceiling(
        self, limit: int, source: str = "the benchmark knee", keep: bool = True
    ) -> None:
        """Hand a benchmark's knee on as the concurrency ceiling (the next tick applies it).

        keep=False: the ceiling came from where it is kept (a restart); keep it as it was."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"ceiling: must be a whole number >= 1, got {limit!r}")
        self.ceiling = limit
        if keep and self._keep_ceiling is not None:
            self._keep_ceiling(limit, source)
        self._events.emit(
            "ceiling", f"concurrency ceiling set to {limit} from {source}", ceiling=limit
        )

    @contextlib.contextmanager
    def opened(self, limit: int, source: str) -> Iterator[None]:
        """Hold a manual limit of `limit` (manual mode ignores the ceiling; the bounds are
        widened to it) for the block, then put mode, manual limit and bounds back. For a
        benchmark that must measure the engine, not this daemon's limit."""
        mode, manual, max_limit = self.mode, self.manual_limit, self.cfg.max_limit
        base = self._admission.base_limit
        self.configure(source=source, mode="manual", limit=limit, max_limit=max(limit, max_limit))
        try:
            yield
        finally:
            # Auto mode steers on from the limit in force: give it back the one it had, not
            # the opened one.
            self._admission.set_limit(base)
            self.configure(
                source=f"{source}, ended", mode=mode.value, limit=manual, max_limit=max_limit
            )

    def clear_ceiling(self, source: str) -> None:
        """Drop the ceiling: a newer benchmark showed throughput still rising past it."""
        if self._keep_ceiling is not None:
            self._keep_ceiling(None, source)
        if self.ceiling is None:
            return
        old, self.ceiling = self.ceiling, None
        self._events.emit(
            "ceiling", f"concurrency ceiling {old} lifted by {source}", ceiling=None, previous=old
        )

    def tick(self) -> ControlDecision:
        """One decision, applied to the admission queue when it changes the limit."""
        now = self._clock()
        since = self.state.last_change_s
        stats = self._latency.stats(now, min_samples=self.cfg.min_samples, since_s=since)
        # What ran wholly under the limit in force: admitted after the last change.
        fresh = self._latency.stats(
            now,
            min_samples=self.cfg.min_samples,
            admitted_since_s=since if since is not None else now - self.cfg.window_s,
        )
        # The engine's steps since the last change, and no older than live_span_s: a probe
        # needs what ran under the limit in force, a cut what runs now. Where fewer than
        # live_min_steps fit in the span (slow steps: a TPOT over its SLO), back to that
        # many, as far as they take at LIVE_REACH_SLO_MULTIPLE x the TPOT SLO. A request's
        # TPOT reaches back over as many steps as a request decodes, however long they
        # took, to the last change: every step since ran under the limit in force. Held to
        # the reach, a request's decode (32 steps of 0.3-0.5 s) was never there, its TPOT
        # was a dozen steps, and a burst of slow steps (a CPU neighbour's spike in
        # thermal's hot room) read as every request missing (docs/benchmarks.md,
        # goodput_trace_history_thermal).
        floor = since if since is not None else now - self.cfg.window_s
        # Nor from before the requests admitted under the old limit finished: draining,
        # the engine prefills nothing and its steps run fast (after a cut from 64 to 37 on
        # thermal they read "far below the SLO", and a +50 % probe went straight back up).
        if self.state.over_limit_s is not None:
            floor = max(floor, self.state.over_limit_s)
        live = self.live = self._live(
            max(floor, now - self.cfg.live_span_s), max(floor, now - self._live_reach_s()), floor
        )
        snap = self._admission.snapshot()
        inputs = ControlInputs(
            now_s=now,
            current_limit=snap.base_limit,
            ttft_p99_s=stats.ttft_p99_s,
            tpot_p99_s=stats.tpot_p99_s,
            requests_in_window=stats.count,
            fresh_requests=fresh.count,
            fresh_ttft_p99_s=fresh.ttft_p99_s,
            fresh_tpot_p99_s=fresh.tpot_p99_s,
            **_live_inputs(live),
            kv_cache_usage_ratio=min(1.0, max(0.0, self._kv_usage())),
            queue_depth=snap.queued,
            in_flight=snap.in_flight,
            derate_factor=snap.derate_factor,
            protect=snap.protect,
            knee_limit=self.ceiling,
            mode=self.mode,
            manual_limit=self.manual_limit if self.mode is ControlMode.MANUAL else None,
            **self._forecast_inputs(now),
        )
        d = decide(self.cfg, inputs, self.state)
        self.state, self.last = d.state, d
        if d.base_limit != snap.base_limit:
            self._admission.set_limit(d.base_limit)
        self._steer_prefill(now)
        if d.changed:
            entry = {
                "ts_s": time.time(),
                "limit": d.limit,
                "base_limit": d.base_limit,
                "action": d.action.value,
                "reason": d.reason,
            }
            self.decisions = [*self.decisions[-19:], entry]
            self._events.emit(
                "controller",
                d.reason,
                limit=d.limit,
                base_limit=d.base_limit,
                action=d.action.value,
            )
            if self._record is not None:
                self._record(entry["ts_s"], d.limit, d.reason)
        return d

    def _live_reach_s(self) -> float:
        """How far back the live steps may go to find live_min_steps of them: as long as
        they take at LIVE_REACH_SLO_MULTIPLE x the TPOT SLO, and never less than
        live_span_s. At 2x, steps slower than 1 s (a 0.5 s SLO) were never judged at all:
        in thermal's hot room 5-7 steps of 1.2-1.4 s fit in 8 s, and a limit of 39 held
        three ticks while they ran (docs/benchmarks.md, goodput_trace_fresh_thermal, seed 2)."""
        cfg = self.cfg
        if cfg.slo_tpot_p99_s is None:
            return cfg.live_span_s
        return max(
            cfg.live_span_s, LIVE_REACH_SLO_MULTIPLE * cfg.live_min_steps * cfg.slo_tpot_p99_s
        )

    def _live(self, since_s: float, floor_s: float, request_floor_s: float) -> StepLatency | None:
        """The engine's steps since since_s, back to live_min_steps of them but not before
        floor_s, and a request's TPOT not before request_floor_s; None when no engine
        reports them."""
        if self._step_latency is None:
            return None
        return self._step_latency(
            since_s,
            min_steps=self.cfg.live_min_steps,
            floor_s=floor_s,
            request_floor_s=request_floor_s,
        )

    def _steer_prefill(self, now_s: float) -> None:
        """The prefill budget for this tick; an event when it switches or moves by > 25 %."""
        budget = prefill_budget(
            self._admission.prefill.rate_tok_s(now_s),
            self.cfg.slo_ttft_p99_s,
            self.cfg.prefill_ttft_share,
            auto=self.mode is ControlMode.AUTO,
        )
        self._steer_shedding()
        old = self._admission.prefill_budget
        self.prefill = budget
        if budget.tokens != old:
            self._admission.set_prefill_budget(budget.tokens)
        if budget_moved(old, budget.tokens):
            self._events.emit(
                "prefill_budget",
                budget.reason,
                tokens=budget.tokens,
                previous=old,
                rate_tok_s=None if budget.rate_tok_s is None else round(budget.rate_tok_s, 1),
            )

    def _steer_shedding(self) -> None:
        """Auto mode: interactive requests whose first token would come past
        shed_above_ttft_ratio x the TTFT SLO are refused at admission. Manual: never; the
        operator's limit and the queue's bounds alone, as the operator set them."""
        ratio = self.cfg.shed_above_ttft_ratio
        auto = self.mode is ControlMode.AUTO
        seconds = self.cfg.slo_ttft_p99_s * ratio if auto and ratio is not None else None
        if seconds != self._admission.shed_above_s:
            self._admission.set_shed_above(seconds)

    async def refresh_forecast(self) -> None:
        """Ask the load predictor (in a thread) for the pending requests it expects."""
        if self._forecast_fn is None:
            return
        self.forecast = await asyncio.to_thread(self._forecast_fn)
        self._forecast_at_s = self._clock()

    def _forecast_inputs(self, now_s: float) -> dict[str, Any]:
        f = self.forecast
        at = self._forecast_at_s
        if f is None or at is None or now_s - at > 2 * self.cfg.tick_s:
            return {}
        return {
            "forecast_pending": max(0.0, float(f.pending_expected)),
            "forecast_horizon_s": float(f.horizon_s),
            "forecast_source": str(f.source),
        }

    async def start(self) -> None:
        await self._periodic.start()
        if self._forecast_fn is not None:
            await self._forecaster.start()

    async def stop(self) -> None:
        await self._forecaster.stop()
        await self._periodic.stop()

    def snapshot(self) -> dict[str, Any]:
        """Mode, bounds, the last decision and the recent changes."""
        return {
            "mode": self.mode.value,
            "manual_limit": self.manual_limit,
            "min": self.cfg.min_limit,
            "max": self.cfg.max_limit,
            "slo_ttft_p99_s": self.cfg.slo_ttft_p99_s,
            "slo_tpot_p99_s": self.cfg.slo_tpot_p99_s,
            "ceiling": self.ceiling,
            "last": None
            if self.last is None
            else {
                "limit": self.last.limit,
                "base_limit": self.last.base_limit,
                "action": self.last.action.value,
                "reason": self.last.reason,
            },
            "decisions": list(self.decisions),
            "prefill": {
                "budget_tokens": self._admission.prefill_budget,
                "outstanding_tokens": self._admission.prefill.outstanding_tokens,
                "rate_tok_s": None
                if self.prefill is None or self.prefill.rate_tok_s is None
                else round(self.prefill.rate_tok_s, 1),
                "ttft_share": self.cfg.prefill_ttft_share,
                "shed_above_s": self._admission.shed_above_s,
                "shed_total": sum(self._admission.shed_total.values()),
                "reason": None if self.prefill is None else self.prefill.reason,
            },
            # The engine's own steps since the last change (vLLM's stat logger), as the last
            # tick saw them: what probes are sized on (tpot_s, the span's mean gap) and cuts
            # judge (request_tpot_s, a request's decode through them) before requests finish.
            "live": None
            if self.live is None
            else {
                "steps": self.live.steps,
                "tpot_s": _round_s(self.live.itl_mean_s),
                "ttft_p99_s": _round_s(self.live.ttft_p99_s),
                "batch": None if self.live.batch_mean is None else round(self.live.batch_mean, 1),
                "request_tpot_s": _round_s(self.live.request_tpot_s),
                "request_steps": self.live.request_steps,
                "decode_gaps": None
                if self.live.decode_gaps is None
                else round(self.live.decode_gaps, 1),
                "gap_median_s": _round_s(self.live.gap_median_s),
            },
            "forecast": None
            if self.forecast is None
            else {
                "pending_now": self.forecast.pending_now,
                "pending_expected": self.forecast.pending_expected,
                "horizon_s": self.forecast.horizon_s,
                "source": self.forecast.source,
                "reason": self.forecast.reason,
            },
        }


def _live_inputs(live: StepLatency | None) -> dict[str, Any]:
    """The controller's live_* inputs from the engine's steps (None each: not reported)."""
    if live is None:
        return {}
    return {
        "live_steps": live.steps,
        "live_tpot_s": live.itl_mean_s,
        "live_ttft_p99_s": live.ttft_p99_s,
        "live_ttft_count": live.ttft_count,
        "live_batch": live.batch_mean,
        "live_request_tpot_s": live.request_tpot_s,
        "live_request_steps": live.request_steps,
        "live_decode_gaps": live.decode_gaps,
        "live_gap_median_s": live.gap_median_s,
    }


def _round_s(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 4)
