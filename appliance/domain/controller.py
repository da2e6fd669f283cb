"""Batch controller policy (pure): live latency, KV and queue in, a concurrency limit out.

AIMD with memory. Each tick, in `auto` mode:

- Back off multiplicatively (x`decrease_factor`, at least one step) when the p99 TTFT or
  TPOT over the window breaks its SLO, or KV-cache usage is above `kv_high_ratio` (the
  engine starts to preempt there). A mild breach (every p99 at most `mild_breach_ratio` x
  its SLO) steps back by one `increase_step` only: a p99 over a few dozen requests is noisy,
  and a 25 % cut for a p99 5 % over would throw throughput away and start a saw-tooth.
  Cuts are paced `hold_ticks_after_decrease` apart so the window can show the effect of one
  cut before the next.
- Probe up additively (+`increase_step`) only when both p99s sit below `probe_below_ratio` of
  their SLO, requests are waiting, KV has room and `hold_ticks_after_increase` ticks passed
  since the last change. Between `probe_below_ratio` x SLO and the SLO it holds: that dead
  band is what keeps a steady load steady.
- Remember where the SLO broke. Probes stay below that limit for `retry_ticks`, then try
  it once (no higher until it held as long); a retry that breaks it again doubles
  the wait (up to `retry_ticks_max`; the wait never shrinks again, the knee of a box does
  not move by itself). Plain AIMD saw-tooths around the breaking point
  forever; with this memory a noisy steady load settles one step below it and revisits it
  ever more rarely.
- The limit lives within [min_limit, max_limit] and below the knee from the last benchmark.
- A forecast from the load predictor (pending requests expected shortly, more than the
  limit) counts as a queue for probing: the limit rises ahead of a burst while latency has
  room, under every other condition of a probe (never while derated, over the SLO, or with
  KV full). It never holds the limit up or cuts it: the SLO feedback stays in charge.

The controller works on the *base* limit (what `AdmissionQueue.set_limit` takes) and reports
the *effective* one, base x thermal derate factor (what actually runs), so a thermal cut
lowers the operating point at once: effective <= floor(max_limit x derate). While derated
it only holds or cuts, never probes. In `manual` mode the base is the operator's limit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

# Products like 16 x 0.75 must floor to 12, not to 11 by an ulp.
_EPS = 1e-9


class ControlMode(StrEnum):
    AUTO = "auto"
    MANUAL = "manual"


class Action(StrEnum):
    """What a tick did: the limit went up, down, was clamped into bounds, set, or held."""

    UP = "up"
    DOWN = "down"
    CLAMP = "clamp"
    MANUAL = "manual"
    DERATE = "derate"
    HOLD = "hold"


@dataclass(frozen=True)
class ControllerConfig:
    """Every number the controller uses; the loop ticks every `tick_s` over `window_s`."""

    slo_ttft_p99_s: float = 2.0
    slo_tpot_p99_s: float | None = 0.25  # None: TPOT is not guarded
    min_limit: int = 1
    max_limit: int = 64
    kv_high_ratio: float = 0.9
    kv_probe_max_ratio: float = 0.8
    decrease_factor: float = 0.75
    mild_breach_ratio: float = 1.25
    increase_step: int = 1
    probe_below_ratio: float = 0.8
    hold_ticks_after_increase: int = 3
    hold_ticks_after_decrease: int = 3
    retry_ticks: int = 30
    retry_ticks_max: int = 480
    window_s: float = 30.0
    min_samples: int = 8
    tick_s: float = 2.0

    def __post_init__(self) -> None:
        problems = []
        if not self.slo_ttft_p99_s > 0:
            problems.append(f"slo_ttft_p99_s: must be > 0, got {self.slo_ttft_p99_s}")
        if self.slo_tpot_p99_s is not None and not self.slo_tpot_p99_s > 0:
            problems.append(f"slo_tpot_p99_s: must be > 0 or None, got {self.slo_tpot_p99_s}")
        if self.min_limit < 1:
            problems.append(f"min_limit: must be >= 1, got {self.min_limit}")
        if self.max_limit < self.min_limit:
            problems.append(
                f"max_limit: must be >= min_limit ({self.min_limit}), got {self.max_limit}"
            )
        if not 0 < self.kv_high_ratio <= 1:
            problems.append(f"kv_high_ratio: must be in (0, 1], got {self.kv_high_ratio}")
        if not 0 < self.kv_probe_max_ratio <= self.kv_high_ratio:
            problems.append(
                f"kv_probe_max_ratio: must be in (0, kv_high_ratio={self.kv_high_ratio}], "
                f"got {self.kv_probe_max_ratio}"
            )
        if not 0 < self.decrease_factor < 1:
            problems.append(f"decrease_factor: must be in (0, 1), got {self.decrease_factor}")
        if not self.mild_breach_ratio >= 1:
            problems.append(f"mild_breach_ratio: must be >= 1, got {self.mild_breach_ratio}")
        if self.increase_step < 1:
            problems.append(f"increase_step: must be >= 1, got {self.increase_step}")
        if not 0 < self.probe_below_ratio <= 1:
            problems.append(f"probe_below_ratio: must be in (0, 1], got {self.probe_below_ratio}")
        for name in ("hold_ticks_after_increase", "hold_ticks_after_decrease"):
            if getattr(self, name) < 0:
                problems.append(f"{name}: must be >= 0, got {getattr(self, name)}")
        if self.retry_ticks < 1:
            problems.append(f"retry_ticks: must be >= 1, got {self.retry_ticks}")
        if self.retry_ticks_max < self.retry_ticks:
            problems.append(
                f"retry_ticks_max: must be >= retry_ticks ({self.retry_ticks}), "
                f"got {self.retry_ticks_max}"
            )
        if not self.window_s > 0:
            problems.append(f"window_s: must be > 0, got {self.window_s}")
        if self.min_samples < 1:
            problems.append(f"min_samples: must be >= 1, got {self.min_samples}")
        if not self.tick_s > 0:
            problems.append(f"tick_s: must be > 0, got {self.tick_s}")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class ControlInputs:
    """What the loop saw this tick. `current_limit` is the base limit in force (pre-derate)."""

    now_s: float
    current_limit: int
    ttft_p99_s: float | None
    tpot_p99_s: float | None
    requests_in_window: int
    kv_cache_usage_ratio: float = 0.0
    queue_depth: Mapping[str, int] = field(default_factory=dict)  # waiting per lane
    in_flight: int = 0
    derate_factor: float = 1.0
    protect: bool = False
    knee_limit: int | None = None  # from the last benchmark: a ceiling for auto mode
    mode: ControlMode = ControlMode.AUTO
    manual_limit: int | None = None
    # The load predictor: requests pending (queued + running) expected `forecast_horizon_s`
    # from now, and which model said so; None when no forecast is available.
    forecast_pending: float | None = None
    forecast_horizon_s: float | None = None
    forecast_source: str | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.current_limit < 1:
            problems.append(f"current_limit: must be >= 1, got {self.current_limit}")
        for name in ("ttft_p99_s", "tpot_p99_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                problems.append(f"{name}: must be a finite number >= 0 or None, got {value}")
        if self.requests_in_window < 0:
            problems.append(f"requests_in_window: must be >= 0, got {self.requests_in_window}")
        if not 0 <= self.kv_cache_usage_ratio <= 1:
            problems.append(
                f"kv_cache_usage_ratio: must be in [0, 1], got {self.kv_cache_usage_ratio}"
            )
        for lane, n in self.queue_depth.items():
            if n < 0:
                problems.append(f"queue_depth[{lane}]: must be >= 0, got {n}")
        if self.in_flight < 0:
            problems.append(f"in_flight: must be >= 0, got {self.in_flight}")
        if not 0 < self.derate_factor <= 1:
            problems.append(f"derate_factor: must be in (0, 1], got {self.derate_factor}")
        if self.forecast_pending is not None and not (
            math.isfinite(self.forecast_pending) and self.forecast_pending >= 0
        ):
            problems.append(
                f"forecast_pending: must be a finite number >= 0 or None, "
                f"got {self.forecast_pending}"
            )
        if self.knee_limit is not None and self.knee_limit < 1:
            problems.append(f"knee_limit: must be >= 1 or None, got {self.knee_limit}")
        try:
            mode = ControlMode(self.mode)
        except ValueError:
            problems.append(f"mode: must be 'auto' or 'manual', got {self.mode!r}")
        else:
            object.__setattr__(self, "mode", mode)
            if mode is ControlMode.MANUAL and (self.manual_limit is None or self.manual_limit < 1):
                problems.append(
                    f"manual_limit: must be >= 1 in manual mode, got {self.manual_limit}"
                )
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def queued(self) -> int:
        """Requests waiting in all lanes."""
        return sum(self.queue_depth.values())


@dataclass(frozen=True)
class ControllerState:
    """Hysteresis carried from one tick to the next."""

    tick: int = 0
    last_limit: int | None = None  # effective limit of the previous decision
    last_change_tick: int | None = None
    last_change_s: float | None = None  # the loop judges latency only on samples after this
    last_decrease_tick: int | None = None
    last_direction: Action | None = None  # UP or DOWN
    reversals: int = 0  # UP after DOWN or DOWN after UP, for the record
    breach_base: int | None = None  # base limit at which the SLO (or KV) last broke
    barrier: bool = False  # probes stay below breach_base (until a retry clears it)
    breach_tick: int | None = None
    retry_ticks: int | None = None  # current wait before probing at breach_base again
    retrying_since_tick: int | None = None  # a probe went to >= breach_base at this tick


@dataclass(frozen=True)
class ControlDecision:
    """The limit to run (effective, after derate), the base to set, and why."""

    limit: int
    base_limit: int
    changed: bool
    action: Action
    reason: str
    state: ControllerState

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: for the event log and the state store."""
        out = asdict(self)
        out["action"] = self.action.value
        st = out["state"]
        st["last_direction"] = (
            self.state.last_direction.value if self.state.last_direction else None
        )
        return out


def initial_state() -> ControllerState:
    """The state before the first tick."""
    return ControllerState()


def derated(base: int, factor: float) -> int:
    """The effective limit for a base limit under a derate factor (the admission formula)."""
    return max(1, math.floor(base * factor + _EPS))


def base_for(effective: int, factor: float) -> int:
    """The smallest base limit whose derated value reaches `effective`."""
    if effective <= 1:
        return 1  # derated() never goes below 1
    return max(1, math.ceil(effective / factor - _EPS))


def _fmt_s(seconds: float) -> str:
    return f"{seconds * 1000:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def _move(old: int, new: int, base_old: int, base_new: int, factor: float) -> str:
    text = f"{old} -> {new}"
    if factor < 1 - _EPS:
        text += f" (base {base_old} -> {base_new} at derate x{factor:.2f})"
    return text


def decide(cfg: ControllerConfig, inputs: ControlInputs, state: ControllerState) -> ControlDecision:
    """One controller tick: the next limit, whether it changed, and the reason."""
    if inputs.mode is ControlMode.MANUAL:
        return _manual(cfg, inputs, state)
    return _auto(cfg, inputs, state)


def _finish(
    cfg: ControllerConfig,
    inputs: ControlInputs,
    state: ControllerState,
    tick: int,
    base: int,
    action: Action,
    reason: str,
    **updates: Any,
) -> ControlDecision:
    """Build the decision and the next state; any change restarts the hold clock."""
    limit = derated(base, inputs.derate_factor)
    changed = base != inputs.current_limit or (
        state.last_limit is not None and limit != state.last_limit
    )
    if action is Action.HOLD and changed:
        # Only the derate factor moved under an unchanged base: say so.
        action = Action.DERATE
        reason = (
            f"thermal derate x{inputs.derate_factor:.2f}: {state.last_limit} -> {limit} "
            f"(base {base}); {reason}"
        )
    nxt = replace(state, tick=tick, last_limit=limit, **updates)
    if changed:
        nxt = replace(nxt, last_change_tick=tick, last_change_s=inputs.now_s)
    if action in (Action.UP, Action.DOWN):
        flipped = state.last_direction is not None and state.last_direction is not action
        nxt = replace(nxt, last_direction=action, reversals=state.reversals + (1 if flipped else 0))
    return ControlDecision(limit, base, changed, action, reason, nxt)


def _manual(
    cfg: ControllerConfig, inputs: ControlInputs, state: ControllerState
) -> ControlDecision:
    tick = state.tick + 1
    assert inputs.manual_limit is not None  # ControlInputs guarantees it in manual mode
    base = min(cfg.max_limit, max(cfg.min_limit, inputs.manual_limit))
    limit = derated(base, inputs.derate_factor)
    reason = f"manual limit {inputs.manual_limit}"
    if base != inputs.manual_limit:
        reason += f" clamped to [{cfg.min_limit}, {cfg.max_limit}] = {base}"
    if inputs.derate_factor < 1 - _EPS:
        reason += f" x derate {inputs.derate_factor:.2f} = {limit}"
    changed = base != inputs.current_limit or (
        state.last_limit is not None and limit != state.last_limit
    )
    if changed:
        before = state.last_limit if state.last_limit is not None else inputs.current_limit
        reason += f": {before} -> {limit}"
    return _finish(cfg, inputs, state, tick, base, Action.MANUAL, reason)


def _auto(cfg: ControllerConfig, inputs: ControlInputs, state: ControllerState) -> ControlDecision:
    tick = state.tick + 1
    factor = inputs.derate_factor
    knee = inputs.knee_limit
    upper = cfg.max_limit if knee is None else min(cfg.max_limit, max(cfg.min_limit, knee))
    base = inputs.current_limit
    limit = derated(base, factor)

    # A retry at the breaking point that held as long as the wait before it: the memory is
    # stale (the wait it earned stays, so a flapping level is still revisited rarely).
    retry_wait = state.retry_ticks or cfg.retry_ticks
    if state.retrying_since_tick is not None and tick - state.retrying_since_tick > retry_wait:
        state = replace(state, barrier=False, retrying_since_tick=None)

    # 1. Into bounds first: a new knee, a config change or an operator may have moved them.
    if base > upper or base < cfg.min_limit:
        new_base = min(upper, max(cfg.min_limit, base))
        new_limit = derated(new_base, factor)
        if base > upper:
            why = (
                f"above the knee {knee} from the last benchmark"
                if knee is not None and upper == max(cfg.min_limit, knee)
                else f"above max_limit {cfg.max_limit}"
            )
        else:
            why = f"below min_limit {cfg.min_limit}"
        reason = f"limit {base} {why}: {_move(limit, new_limit, base, new_base, factor)}"
        return _finish(cfg, inputs, state, tick, new_base, Action.CLAMP, reason)

    enough = inputs.requests_in_window >= cfg.min_samples
    ttft = inputs.ttft_p99_s if enough else None
    tpot = inputs.tpot_p99_s if enough and cfg.slo_tpot_p99_s is not None else None
    kv = inputs.kv_cache_usage_ratio
    causes = []
    if kv > cfg.kv_high_ratio:
        causes.append(f"KV cache {kv:.0%} > {cfg.kv_high_ratio:.0%}")
    if ttft is not None and ttft > cfg.slo_ttft_p99_s:
        causes.append(f"p99 TTFT {_fmt_s(ttft)} > SLO {_fmt_s(cfg.slo_ttft_p99_s)}")
    if tpot is not None and cfg.slo_tpot_p99_s is not None and tpot > cfg.slo_tpot_p99_s:
        causes.append(f"p99 TPOT {_fmt_s(tpot)} > SLO {_fmt_s(cfg.slo_tpot_p99_s)}")

    # 2. Back off.
    if causes:
        cause = ", ".join(causes)
        worst = max(
            (ttft or 0.0) / cfg.slo_ttft_p99_s,
            (tpot or 0.0) / cfg.slo_tpot_p99_s if cfg.slo_tpot_p99_s else 0.0,
        )
        mild = kv <= cfg.kv_high_ratio and worst <= cfg.mild_breach_ratio
        since_cut = None if state.last_decrease_tick is None else tick - state.last_decrease_tick
        if since_cut is not None and since_cut <= cfg.hold_ticks_after_decrease:
            wait = cfg.hold_ticks_after_decrease - since_cut + 1
            reason = f"{cause}: holding {limit}, {wait} more tick(s) for the last cut to show"
            return _finish(cfg, inputs, state, tick, base, Action.HOLD, reason)
        floor_limit = derated(cfg.min_limit, factor)
        if mild:
            target = max(floor_limit, limit - cfg.increase_step)
        else:
            target = max(
                floor_limit, min(limit - 1, math.floor(limit * cfg.decrease_factor + _EPS))
            )
        new_base = min(upper, max(cfg.min_limit, base_for(target, factor)))
        new_limit = derated(new_base, factor)
        if new_limit >= limit:
            reason = f"{cause}: already at the minimum {limit}"
            return _finish(cfg, inputs, state, tick, base, Action.HOLD, reason)
        retry = state.retry_ticks or cfg.retry_ticks
        if state.breach_base is not None and base >= state.breach_base:
            # The old breaking point (or above) broke again, on a retry or after one that
            # seemed to hold: wait longer before the next try. A lower level breaking means
            # the load got heavier, not that the retries were too eager.
            retry = min(cfg.retry_ticks_max, retry * 2)
        how = f" (mild, within {cfg.mild_breach_ratio:g}x: one step)" if mild else ""
        reason = f"{cause}{how}: {_move(limit, new_limit, base, new_base, factor)}"
        return _finish(
            cfg,
            inputs,
            state,
            tick,
            new_base,
            Action.DOWN,
            reason,
            last_decrease_tick=tick,
            breach_base=base,
            barrier=True,
            breach_tick=tick,
            retry_ticks=retry,
            retrying_since_tick=None,
        )

    # 3. Hold unless every condition for a probe holds.
    def hold(why: str) -> ControlDecision:
        return _finish(cfg, inputs, state, tick, base, Action.HOLD, f"holding {limit}: {why}")

    if inputs.protect:
        return hold("thermal PROTECT, not probing")
    if factor < 1 - _EPS:
        # Probing under a derate would hand back the load the thermal policy just took away,
        # and the two would fight down to the thermal floor.
        return hold(f"thermal derate x{factor:.2f} in force, not probing")
    if ttft is None:
        return hold(
            f"{inputs.requests_in_window} request(s) in the window, "
            f"{cfg.min_samples} needed to judge the SLO"
        )
    ttft_probe = cfg.slo_ttft_p99_s * cfg.probe_below_ratio
    if ttft >= ttft_probe:
        return hold(
            f"p99 TTFT {_fmt_s(ttft)} within SLO {_fmt_s(cfg.slo_ttft_p99_s)} "
            f"(probing needs < {_fmt_s(ttft_probe)})"
        )
    if tpot is not None and cfg.slo_tpot_p99_s is not None:
        tpot_probe = cfg.slo_tpot_p99_s * cfg.probe_below_ratio
        if tpot >= tpot_probe:
            return hold(
                f"p99 TPOT {_fmt_s(tpot)} within SLO {_fmt_s(cfg.slo_tpot_p99_s)} "
                f"(probing needs < {_fmt_s(tpot_probe)})"
            )
    # A burst the predictor sees coming counts like a queue: raise the limit before it lands,
    # while latency still has room, instead of after the queue and the TTFT have grown.
    ahead = inputs.forecast_pending is not None and inputs.forecast_pending > limit
    if (inputs.queued == 0 or inputs.in_flight == 0) and not ahead:
        return hold(f"no queue ({inputs.queued} waiting, {inputs.in_flight} running)")
    if kv >= cfg.kv_probe_max_ratio:
        return hold(f"KV cache {kv:.0%}, probing needs < {cfg.kv_probe_max_ratio:.0%}")
    if state.last_change_tick is not None:
        since = tick - state.last_change_tick
        if since <= cfg.hold_ticks_after_increase:
            wait = cfg.hold_ticks_after_increase - since + 1
            return hold(f"{wait} more tick(s) after the last change")
    new_base = min(upper, base_for(limit + cfg.increase_step, factor))
    retrying_since = state.retrying_since_tick
    if state.barrier and state.breach_base is not None and new_base >= state.breach_base:
        assert state.breach_tick is not None
        waited = tick - state.breach_tick
        retry = state.retry_ticks or cfg.retry_ticks
        if retrying_since is not None:
            # A retry is on: stay at the old breaking point until it has held a while.
            capped = min(new_base, state.breach_base)
            if derated(capped, factor) <= limit:
                left = retry - (tick - retrying_since) + 1
                return hold(
                    f"retrying {state.breach_base}, {left} more tick(s) before going higher"
                )
            new_base = capped
        elif waited < retry:
            capped = min(new_base, state.breach_base - 1)
            if derated(capped, factor) <= limit:
                return hold(
                    f"staying below {state.breach_base} where the SLO broke {waited} tick(s) "
                    f"ago (retry in {retry - waited})"
                )
            new_base = capped
        else:
            retrying_since = tick
    new_limit = derated(new_base, factor)
    if new_limit <= limit:
        ceiling = f"the knee {knee}" if upper != cfg.max_limit else f"max_limit {cfg.max_limit}"
        return hold(f"at the ceiling ({ceiling})")
    if inputs.queued > 0 and inputs.in_flight > 0:
        pressure = f"{inputs.queued} queued"
    else:
        pressure = (
            f"forecast {inputs.forecast_pending:.1f} pending in "
            f"{inputs.forecast_horizon_s or 0:g} s ({inputs.forecast_source}) > limit {limit}"
        )
    reason = (
        f"p99 TTFT {_fmt_s(ttft)} < {_fmt_s(ttft_probe)} "
        f"({cfg.probe_below_ratio:.0%} of SLO {_fmt_s(cfg.slo_ttft_p99_s)}), "
        f"{pressure}: {_move(limit, new_limit, base, new_base, factor)}"
    )
    return _finish(
        cfg,
        inputs,
        state,
        tick,
        new_base,
        Action.UP,
        reason,
        retrying_since_tick=retrying_since,
    )
