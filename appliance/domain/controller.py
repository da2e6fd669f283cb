"""Batch controller policy (pure): live latency, KV and queue in, a concurrency limit out.

AIMD with memory. Each tick, in `auto` mode:

- Back off multiplicatively (x`decrease_factor`, at least one step) when the p99 TTFT or
  TPOT over the window breaks its SLO, or KV-cache usage is above `kv_high_ratio` (the
  engine starts to preempt there). A mild breach (every p99 at most `mild_breach_ratio` x
  its SLO) steps back by one `increase_step` only: a p99 over a few dozen requests is noisy,
  and a 25 % cut for a p99 5 % over would throw throughput away and start a saw-tooth. A mild
  breach again after such a step, with no tick since that judged the SLO kept, was not noise:
  the full cut then (a limit started high would otherwise meet the SLO one step a hold).
  The TPOT a request sees through the engine's steps (a mean over its decode, not a p99)
  over its SLO is never mild: that is no tail but the typical running request missing.
  Read on fewer steps than a request decodes (just after a change) it is a few seconds of
  the engine, and within mild_breach_ratio one step, as a tail. After a cut, a p99 TPOT
  cuts again only from the requests admitted since it: the ones that finish first decoded
  at the limit cut from. Once min_samples of them have finished, their tail gates probes
  too; until then the window's tail over the SLO holds them.
  Cuts are paced `hold_ticks_after_decrease` apart so the window can show the effect of one
  cut before the next.
- Probe up only when both p99s sit below `probe_below_ratio` of their SLO, requests are
  waiting, KV has room and the last change had time to show. Between `probe_below_ratio` x
  SLO and the SLO it holds: that dead band is what keeps a steady load steady. A probe is
  sized by the headroom it sees on fresh evidence (requests admitted since the last change,
  or the engine's own steps since it): latency is projected to grow with the limit, so a
  worst p99 at 60 % of its SLO allows +33 % to reach 80 % (projected to the limit from the
  batch the engine's steps ran at, when fewer ran than the limit); far below the SLO (every p99
  under `fast_probe_below_ratio` of it) the step is capped at `fast_probe_fraction` of the
  limit. Such a sized probe waits `fast_probe_hold_ticks` after the last change; without
  fresh evidence, or when the headroom is under one step, a probe is +`increase_step` after
  `hold_ticks_after_increase` ticks. A multiplicative climb gives the box back within
  seconds after a load shift or on a ramp, where +1 every few ticks takes minutes.
  A p99 TPOT in the dead band does not hold a probe when the engine's steps since the last
  change say it is history (a request through them under `fast_probe_below_ratio` of the
  SLO): after a slow spell the window keeps its tail for `window_s`. Nor does a p99 TTFT in
  its dead band when `min_samples` or more of the engine's first tokens among those steps
  have a p99 under `fast_probe_below_ratio` of its SLO. Either probe is one step.
- While more run than the limit (a cut's requests still draining) it never probes, and the
  engine's steps from then are no evidence: nothing is admitted, nothing prefilled, and the
  steps read fast whatever the limit.
- Remember where the SLO broke. Probes stay below that limit for `retry_ticks`, then try
  it once (no higher until it held as long); a retry that breaks it again doubles
  the wait (up to `retry_ticks_max`; the wait never shrinks again, the knee of a box does
  not move by itself). Plain AIMD saw-tooths around the breaking point
  forever; with this memory a noisy steady load settles one step below it and revisits it
  ever more rarely. Sized probes stop at the base the last cut landed on until that wait
  is over; above it the climb is one step a hold (TCP's slow-start threshold): a
  multiplicative climb from under the breaking point went straight back to it, and every
  request running then missed its TPOT.
- The limit lives within [min_limit, max_limit] and below the knee from the last benchmark.
- A forecast from the load predictor (pending requests expected shortly, more than the
  limit) counts as a queue for probing: the limit rises ahead of a burst while latency has
  room, under every other condition of a probe (never while derated, over the SLO, or with
  KV full). It never holds the limit up or cuts it: the SLO feedback stays in charge.

The controller works on the *base* limit (what `AdmissionQueue.set_limit` takes) and reports
the *effective* one, base x thermal derate factor (what actually runs), so a thermal cut
lowers the operating point at once: effective <= floor(max_limit x derate). While derated it
probes only to win back its own cuts, never above the base it had when the derate began: a
slower hot box breaks the SLO at its old batch, the controller cuts, and without this it
would sit at that cut until the derate ends (a dwell of minutes) however much the load
eased. A derate that begins within a breach's first wait (`retry_ticks` x `tick_s`) of SLO
cuts takes them over (a GPU slows as it heats, before the policy trips): its ceiling is the
highest base cut from, and those cuts' breaking point is let go. A breach's memory also goes
once the box runs much faster than the one that broke it (`stale_breach_step_ratio`). In
`manual` mode the base is the operator's limit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from appliance.domain.limits import (
    CONCURRENCY_RANGE_TEXT,
    SLO_RANGE_TEXT,
    Problem,
    in_concurrency_range,
    in_slo_range,
    raise_problems,
)

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
    # Far below the SLO (every p99 under this share of it) with a queue, a probe takes
    # `fast_probe_fraction` of the limit at once (at least increase_step): after a load shift
    # (a document phase over, a cool-down) +1 a probe would take minutes to give the box back.
    fast_probe_below_ratio: float = 0.5
    fast_probe_fraction: float = 0.5
    # A fast probe waits this many ticks after the last change, not hold_ticks_after_increase:
    # the loop judges only samples taken after a change (min_samples of them), and so far
    # below the SLO one more tick of evidence changes nothing. 3 ticks of 2 s per +25 % took
    # 45 s to climb from 17 to 64 on a steady overload (docs/benchmarks.md, goodput_trace_warm).
    fast_probe_hold_ticks: int = 1
    # The engine's steps since the last change stand in for finished requests as the
    # evidence a sized probe needs, once there are this many of them (a step is ~0.1-0.5 s
    # on the CPU engine, ms on a GPU; a few steps show the new batch's inter-token gap).
    live_min_steps: int = 8
    # The engine's steps are judged over at most this many recent seconds (and never from
    # before the last change): a cut must see what runs now, not the batch before it.
    live_span_s: float = 4.0
    # A cut on the engine's steps (a request's TPOT through them or their first-token p99 over
    # the SLO) is sized to bring them to probe_below_ratio x the SLO, in proportion to the
    # limit, but cuts at most to this share of the limit and at least to decrease_factor of it.
    live_cut_floor_ratio: float = 0.5
    hold_ticks_after_increase: int = 3
    hold_ticks_after_decrease: int = 3
    retry_ticks: int = 30
    retry_ticks_max: int = 480
    # A breach's memory (its breaking point and the slow-start threshold) goes once the
    # engine runs a step for each running request in at most this share of the time it took
    # when the SLO broke (on as many steps as a request decodes): the box that broke it was
    # slower (a hot room, a neighbour), and its limit says nothing of this one. A limit cut
    # by a quarter runs each request's step in about the same time (a little more: a step's
    # fixed part is shared by fewer), so noise on a steady load stays well above 0.6.
    stale_breach_step_ratio: float = 0.6
    window_s: float = 30.0
    min_samples: int = 8
    tick_s: float = 2.0
    # The prefill budget (domain/prefill.py): in auto mode admission keeps the prompt work
    # waiting for its first token under what the engine clears in this share of the TTFT SLO
    # (the rest is left for the queue wait). None: no budget, count alone.
    prefill_ttft_share: float | None = 0.5
    # In auto mode admission refuses (429) an interactive request whose first token, by the
    # measured prefill rate and the prompt work ahead of it, would come later than this
    # multiple of the TTFT SLO: it would miss the SLO anyway, and serving it late makes the
    # requests behind it miss theirs. None: queue everything (the queue's own bounds).
    shed_above_ttft_ratio: float | None = 1.0

    def __post_init__(self) -> None:
        raise_problems(_config_problems(self))


def _config_problems(cfg: ControllerConfig) -> list[Problem]:
    """Every invariant of the controller's numbers, however the config was built."""
    problems = []
    if not in_slo_range(cfg.slo_ttft_p99_s):
        problems.append(
            Problem("slo_ttft_p99_s", f"must be in {SLO_RANGE_TEXT}, got {cfg.slo_ttft_p99_s}")
        )
    if cfg.slo_tpot_p99_s is not None and not in_slo_range(cfg.slo_tpot_p99_s):
        problems.append(
            Problem(
                "slo_tpot_p99_s", f"must be in {SLO_RANGE_TEXT} or None, got {cfg.slo_tpot_p99_s}"
            )
        )
    for name in ("min_limit", "max_limit"):
        if not in_concurrency_range(getattr(cfg, name)):
            problems.append(
                Problem(name, f"must be in {CONCURRENCY_RANGE_TEXT}, got {getattr(cfg, name)}")
            )
    if cfg.max_limit < cfg.min_limit:
        problems.append(
            Problem("max_limit", f"must be >= {{min_limit}} ({cfg.min_limit}), got {cfg.max_limit}")
        )
    if not 0 < cfg.kv_high_ratio <= 1:
        problems.append(Problem("kv_high_ratio", f"must be in (0, 1], got {cfg.kv_high_ratio}"))
    # Only against a valid kv_high_ratio: a bad one is the problem to report (and the config
    # file derives this ratio from it).
    elif not 0 < cfg.kv_probe_max_ratio <= cfg.kv_high_ratio:
        problems.append(
            Problem(
                "kv_probe_max_ratio",
                f"must be in (0, {{kv_high_ratio}}={cfg.kv_high_ratio}], "
                f"got {cfg.kv_probe_max_ratio}",
            )
        )
    if not 0 < cfg.decrease_factor < 1:
        problems.append(Problem("decrease_factor", f"must be in (0, 1), got {cfg.decrease_factor}"))
    if not cfg.mild_breach_ratio >= 1:
        problems.append(Problem("mild_breach_ratio", f"must be >= 1, got {cfg.mild_breach_ratio}"))
    if cfg.increase_step < 1:
        problems.append(Problem("increase_step", f"must be >= 1, got {cfg.increase_step}"))
    if not 0 < cfg.probe_below_ratio <= 1:
        problems.append(
            Problem("probe_below_ratio", f"must be in (0, 1], got {cfg.probe_below_ratio}")
        )
    elif not 0 <= cfg.fast_probe_below_ratio <= cfg.probe_below_ratio:
        problems.append(
            Problem(
                "fast_probe_below_ratio",
                f"must be in [0, {{probe_below_ratio}}={cfg.probe_below_ratio}], "
                f"got {cfg.fast_probe_below_ratio}",
            )
        )
    if not 0 <= cfg.fast_probe_fraction <= 1:
        problems.append(
            Problem("fast_probe_fraction", f"must be in [0, 1], got {cfg.fast_probe_fraction}")
        )
    for name in ("hold_ticks_after_increase", "hold_ticks_after_decrease", "fast_probe_hold_ticks"):
        if getattr(cfg, name) < 0:
            problems.append(Problem(name, f"must be >= 0, got {getattr(cfg, name)}"))
    problems.extend(_memory_problems(cfg))
    for name in ("window_s", "tick_s"):
        if not getattr(cfg, name) > 0:
            problems.append(Problem(name, f"must be > 0, got {getattr(cfg, name)}"))
    if cfg.min_samples < 1:
        problems.append(Problem("min_samples", f"must be >= 1, got {cfg.min_samples}"))
    problems.extend(_live_problems(cfg))
    problems.extend(_admission_problems(cfg))
    return problems


def _memory_problems(cfg: ControllerConfig) -> list[Problem]:
    """The breach memory's numbers: how long it lasts and when it goes."""
    problems = []
    if cfg.retry_ticks < 1:
        problems.append(Problem("retry_ticks", f"must be >= 1, got {cfg.retry_ticks}"))
    if cfg.retry_ticks_max < cfg.retry_ticks:
        problems.append(
            Problem(
                "retry_ticks_max",
                f"must be >= {{retry_ticks}} ({cfg.retry_ticks}), got {cfg.retry_ticks_max}",
            )
        )
    if not 0 < cfg.stale_breach_step_ratio <= 1:
        problems.append(
            Problem(
                "stale_breach_step_ratio",
                f"must be in (0, 1], got {cfg.stale_breach_step_ratio}",
            )
        )
    return problems


def _live_problems(cfg: ControllerConfig) -> list[Problem]:
    """The numbers for judging the engine's own steps."""
    problems = []
    if cfg.live_min_steps < 1:
        problems.append(Problem("live_min_steps", f"must be >= 1, got {cfg.live_min_steps}"))
    if not cfg.live_span_s > 0:
        problems.append(Problem("live_span_s", f"must be > 0, got {cfg.live_span_s}"))
    if not 0 < cfg.live_cut_floor_ratio <= cfg.decrease_factor:
        problems.append(
            Problem(
                "live_cut_floor_ratio",
                f"must be in (0, {{decrease_factor}}={cfg.decrease_factor}], "
                f"got {cfg.live_cut_floor_ratio}",
            )
        )
    return problems


def _admission_problems(cfg: ControllerConfig) -> list[Problem]:
    """The numbers auto mode hands to admission: the prefill budget's share, shedding."""
    problems = []
    if cfg.prefill_ttft_share is not None and not 0 < cfg.prefill_ttft_share <= 1:
        problems.append(
            Problem(
                "prefill_ttft_share", f"must be in (0, 1] or null, got {cfg.prefill_ttft_share}"
            )
        )
    if cfg.shed_above_ttft_ratio is not None and not 0 < cfg.shed_above_ttft_ratio <= 10:
        problems.append(
            Problem(
                "shed_above_ttft_ratio",
                f"must be in (0, 10] or null, got {cfg.shed_above_ttft_ratio}",
            )
        )
    return problems


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
    # The requests admitted after the last change that have finished, and their p99s (None
    # under min_samples): what ran wholly under the limit in force. A fast probe needs them;
    # a request admitted before the change ran part of its life at the old limit, and its
    # TPOT shows the change only once it is over. None: not measured (the window stands in).
    fresh_requests: int | None = None
    fresh_ttft_p99_s: float | None = None
    fresh_tpot_p99_s: float | None = None
    # The engine's steps since the last change (vLLM's stat logger): how many, their mean
    # inter-token gap (the TPOT of what runs now) and the p99 of the first tokens among
    # them. None: the engine does not report steps.
    live_steps: int | None = None
    live_tpot_s: float | None = None
    live_ttft_p99_s: float | None = None
    live_ttft_count: int | None = None  # the first tokens that p99 is of (None: not reported)
    # Requests that produced a token per engine step over those steps: the batch the live
    # latencies were measured at. None: not reported.
    live_batch: float | None = None
    # The TPOT of a request decoding through the engine's last steps (as many as a request
    # decodes; domain/step_latency.py): what a cut judges, so that one step that prefilled a
    # wave of prompts is no breach. None: not reported (live_tpot_s judges then), and
    # live_request_steps how many steps it was measured on.
    live_request_tpot_s: float | None = None
    live_request_steps: int | None = None
    # The decode gaps (steps) of a request, from the engine's log: live_request_steps under
    # this is part of a request's decode, its missing steps filled at their median. None:
    # not known (too few requests in the log).
    live_decode_gaps: float | None = None
    # The median of the recent steps' mean gaps (the span, not a request's decode): what a
    # request admitted now decodes at. None: not reported.
    live_gap_median_s: float | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.current_limit < 1:
            problems.append(f"current_limit: must be >= 1, got {self.current_limit}")
        for name in (
            "ttft_p99_s",
            "tpot_p99_s",
            "fresh_ttft_p99_s",
            "fresh_tpot_p99_s",
            "live_tpot_s",
            "live_ttft_p99_s",
            "live_batch",
            "live_request_tpot_s",
            "live_decode_gaps",
            "live_gap_median_s",
        ):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                problems.append(f"{name}: must be a finite number >= 0 or None, got {value}")
        if self.requests_in_window < 0:
            problems.append(f"requests_in_window: must be >= 0, got {self.requests_in_window}")
        for name in ("fresh_requests", "live_steps", "live_ttft_count", "live_request_steps"):
            value = getattr(self, name)
            if value is not None and value < 0:
                problems.append(f"{name}: must be >= 0 or None, got {value}")
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
    # The base the last cut landed on: sized probes stop there while the breach's wait runs
    # (the slow-start threshold); above it, one step a hold.
    cut_landed_base: int | None = None
    # How long the engine took per step for each running request when the SLO last broke (a
    # request's TPOT through its steps over the batch): the speed of the box that broke it.
    # None: the steps were not known then.
    breach_step_s: float | None = None
    derate_base: int | None = None  # the base limit when the derate in force began
    # The SLO cuts of the last retry_ticks (_takeover_s): (when, the base cut from). A derate
    # that begins within that span of a cut takes over that cut's job (_derate_began).
    recent_cuts: tuple[tuple[float, int], ...] = ()
    # The last cut was one step for a mild breach, at this tick, and no tick since judged the
    # SLO kept: a mild breach now means the step was too small.
    mild_cut_tick: int | None = None
    # The last tick that saw more running than the limit in force: after a cut, until the
    # requests admitted before it finish. Nothing is admitted then, so no prompt is
    # prefilled: the engine's steps run fast and say nothing of the new limit under load.
    over_limit_s: float | None = None


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


def let_breaking_point_go(state: ControllerState) -> ControllerState:
    """The state with probes no longer bound by the last breaking point: no barrier under
    it, no retry at it, no slow-start threshold, and no box's speed to let it go by. The
    point itself (breach_base) and its wait stay: a retry that breaks it again still
    doubles the wait."""
    return replace(
        state, barrier=False, retrying_since_tick=None, cut_landed_base=None, breach_step_s=None
    )


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
    # The base a derate found stays the ceiling for probes until the derate ends.
    derating = inputs.derate_factor < 1 - _EPS
    derate_base = (state.derate_base or inputs.current_limit) if derating else None
    if derating and state.derate_base is None and inputs.mode is ControlMode.AUTO:
        derate_base, note = _derate_began(cfg, inputs, state)
        if note:
            # The derate took the SLO cuts over: their breaking point goes (updates still
            # win: a breach on this tick is remembered anew).
            reason += f"; {note}"
            state = let_breaking_point_go(replace(state, mild_cut_tick=None))
    nxt = replace(state, tick=tick, last_limit=limit, derate_base=derate_base, **updates)
    if inputs.in_flight > derated(inputs.current_limit, inputs.derate_factor):
        nxt = replace(nxt, over_limit_s=inputs.now_s)
    if changed:
        nxt = replace(nxt, last_change_tick=tick, last_change_s=inputs.now_s)
    if action in (Action.UP, Action.DOWN):
        flipped = state.last_direction is not None and state.last_direction is not action
        nxt = replace(nxt, last_direction=action, reversals=state.reversals + (1 if flipped else 0))
    return ControlDecision(limit, base, changed, action, reason, nxt)


def _derate_began(
    cfg: ControllerConfig, inputs: ControlInputs, state: ControllerState
) -> tuple[int, str]:
    """A derate begins: (the base probes may win back to while it lasts, why it took SLO cuts
    over; "" when it took none, and their breach memory stays).

    The ceiling is the base in force, or the highest base an SLO cut came from within
    _takeover_s before (a breach's first wait): a GPU slows as it heats (boost clocks fall
    before the thermal policy trips at 85 °C), so the SLO cuts before a derate were the same
    heat, and the derate now does their job. Counting both cut the load twice, and the
    second for as long as the derate lasts: on thermal the steps broke the SLO at 27 as the
    room heated, the cut landed on 17, and the derate found 17; after the hot room the box
    was fast again but ran 12-16 (17 x the derate) for the rest of the trace, where static
    32 ran 24-30 (docs/benchmarks.md, goodput_trace_wave_thermal, seed 0). Those cuts'
    breaking point and slow-start threshold go too: they were measured on the heating box.
    The SLO feedback stays in charge under the derate, and a breach there is remembered
    anew.

    A derate trips only once the core has heated: on thermal the simulated GPU crossed
    85 °C 20-45 s after the box slowed, and a cut 45 s before it (60 -> 30 as the hot room
    began) was not taken over within window_s (30 s); the derate then held probes under 30
    (x0.75: 22) through the cool phase after, where static 32 ran 24 (docs/benchmarks.md,
    goodput_trace_partial_thermal, seed 0)."""
    base = inputs.current_limit
    recent = [b for ts, b in state.recent_cuts if inputs.now_s - ts <= _takeover_s(cfg)]
    if not recent or max(recent) <= base:
        return base, ""
    ceiling = min(cfg.max_limit, max(recent))
    note = (
        f"the SLO cut from {ceiling} in the last {_takeover_s(cfg):g} s was the same heat: "
        f"probes may win back up to base {ceiling} under the derate"
    )
    return ceiling, note


def _takeover_s(cfg: ControllerConfig) -> float:
    """How long before a derate an SLO cut counts as the same heat: a breach's first wait
    (retry_ticks ticks of tick_s; the wait doubles only when a retry breaks it again)."""
    return cfg.retry_ticks * cfg.tick_s


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


@dataclass(frozen=True)
class _Tick:
    """What one auto tick works from: the bounds, the limit in force and the judged window."""

    cfg: ControllerConfig
    inputs: ControlInputs
    state: ControllerState
    tick: int
    factor: float  # thermal derate in force
    upper: int  # max_limit, or the knee from the last benchmark when that is lower
    base: int  # base limit in force
    limit: int  # effective limit in force (base x derate)
    ttft: float | None  # the window's p99s, None unless it holds min_samples requests
    tpot: float | None
    kv: float
    # The engine's recent steps over the SLO: (worst share of its SLO, why); None when not.
    live_over: tuple[float, str] | None = None
    # The p99 TPOT a cut judges (_tail_for_cuts), and whose it is ("" for the window's);
    # after a cut, once known, it gates probes too (_tail_for_probes).
    cut_tpot: float | None = None
    cut_tpot_source: str = ""
    # What this tick let go of before it decided (_breach_outlived), for the reason.
    note: str = ""

    def finish(self, base: int, action: Action, reason: str, **updates: Any) -> ControlDecision:
        """The decision for a new base limit (updates go to the next state)."""
        if self.note:
            reason = f"{self.note}; {reason}"
        return _finish(
            self.cfg, self.inputs, self.state, self.tick, base, action, reason, **updates
        )

    def hold(self, why: str) -> ControlDecision:
        """Keep the base limit, saying why."""
        return self.finish(self.base, Action.HOLD, f"holding {self.limit}: {why}")


def _auto(cfg: ControllerConfig, inputs: ControlInputs, state: ControllerState) -> ControlDecision:
    t = _start_tick(cfg, inputs, state)
    # 1. Into bounds first: a new knee, a config change or an operator may have moved them.
    clamped = _clamp(t)
    if clamped is not None:
        return clamped
    # 2. Back off.
    causes = _breaches(t)
    if causes:
        return _back_off(t, ", ".join(causes))
    if t.state.mild_cut_tick is not None and _judged(t):
        # Within the SLO on evidence since a one-step cut: that step held, for now.
        t = replace(t, state=replace(t.state, mild_cut_tick=None))
    t = _breach_outlived(t)
    # 3. Hold unless every condition for a probe holds.
    return _probe(t)


def _start_tick(cfg: ControllerConfig, inputs: ControlInputs, state: ControllerState) -> _Tick:
    tick = state.tick + 1
    knee = inputs.knee_limit
    upper = cfg.max_limit if knee is None else min(cfg.max_limit, max(cfg.min_limit, knee))
    # A retry at the breaking point that held as long as the wait before it: the memory is
    # stale (the wait it earned stays, so a flapping level is still revisited rarely).
    retry_wait = state.retry_ticks or cfg.retry_ticks
    if state.retrying_since_tick is not None and tick - state.retrying_since_tick > retry_wait:
        state = replace(state, barrier=False, retrying_since_tick=None)
    enough = inputs.requests_in_window >= cfg.min_samples
    limit = derated(inputs.current_limit, inputs.derate_factor)
    tpot = inputs.tpot_p99_s if enough and cfg.slo_tpot_p99_s is not None else None
    cut_tpot, cut_tpot_source = _tail_for_cuts(cfg, inputs, state, tpot)
    return _Tick(
        cfg=cfg,
        inputs=inputs,
        state=state,
        tick=tick,
        factor=inputs.derate_factor,
        upper=upper,
        base=inputs.current_limit,
        limit=limit,
        ttft=inputs.ttft_p99_s if enough else None,
        tpot=tpot,
        kv=inputs.kv_cache_usage_ratio,
        live_over=_live_overshoot(cfg, inputs, limit),
        cut_tpot=cut_tpot,
        cut_tpot_source=cut_tpot_source,
    )


def _step_per_request_s(
    cfg: ControllerConfig, inputs: ControlInputs, limit: int, whole: bool
) -> float | None:
    """The box's speed: the engine's time per step for each running request, a request's TPOT
    through the steps over the batch they ran (the batch of the recent steps, which a
    request's span reaches past), whatever the limit. None unless the steps judge and ran
    one or more requests a step; with `whole`, also unless they cover a request's decode
    (a few seconds of steps may be a spike, no speed of the box)."""
    tpot, batch, gaps = inputs.live_request_tpot_s, inputs.live_batch, inputs.live_decode_gaps
    if tpot is None or batch is None or batch < 1 or not _steps_judge(cfg, inputs, limit):
        return None
    if whole and (gaps is None or (inputs.live_request_steps or 0) < gaps):
        return None
    return tpot / batch


def _speed_at_breach(t: _Tick) -> float | None:
    """The box's speed on the steps that broke the SLO, a spike's too: the memory of a
    breach on a spike goes once the spike is over and a request's decode runs fast. None
    for a full KV cache: that is memory, not speed."""
    if t.kv > t.cfg.kv_high_ratio:
        return None
    return _step_per_request_s(t.cfg, t.inputs, t.limit, whole=False)


def _breach_outlived(t: _Tick) -> _Tick:
    """Let a breach's memory go once the box runs much faster than the one that broke it.

    The memory keeps probes under the breaking point for retry_ticks, and sized probes under
    where the cut landed: it stands for the knee of this box. A knee measured on a slower
    box (a hot room, a busy neighbour) is not this box's: on thermal the hot room's cuts
    left the controller at 16-22 through the cool phase after it, one step a hold, while a
    request through the steps took 140-200 ms against the SLO of 500 ms and static 32 ran
    24 (docs/benchmarks.md, goodput_trace_partial_thermal, seeds 0 and 2). At
    stale_breach_step_ratio of the box's speed at the breach or less (_step_per_request_s),
    the memory goes. The breaking point stays recorded: a retry that breaks it again still
    doubles the wait. Only on a tick with no breach: the note says why a probe may pass."""
    state = t.state
    then = state.breach_step_s
    if not state.barrier or then is None or then <= 0:
        return t
    now = _step_per_request_s(t.cfg, t.inputs, t.limit, whole=True)
    if now is None or now > t.cfg.stale_breach_step_ratio * then:
        return t
    note = (
        f"the engine runs a step per running request in {_fmt_s(now)}, {now / then:.0%} of "
        f"the {_fmt_s(then)} when the SLO broke at base {state.breach_base}: "
        f"a slower box's breaking point, let go"
    )
    return replace(t, state=let_breaking_point_go(state), note=note)


def _tail_for_cuts(
    cfg: ControllerConfig, inputs: ControlInputs, state: ControllerState, window_tpot: float | None
) -> tuple[float | None, str]:
    """The p99 TPOT a cut judges, and whose it is: the window's; after a cut, that of the
    requests admitted since it (None under min_samples, where the loop measures them).

    A request's TPOT is its whole decode's: the ones that finish in the seconds after a cut
    decoded mostly before it, at the limit cut from, and their tail says nothing of the
    limit the cut landed on. Judged on them, one breach was cut two and three times over:
    on thermal's hot room 43 -> 32 on the steps, then 32 -> 24 on a p99 of 654 ms from the
    requests that ran at 43; 35 -> 22, then 22 -> 21 on 553 ms from those at 35 (and a
    one-step cut makes the next mild breach a full one, _mild_cut_did_not_hold), while
    static 32 served 52-108 requests of that phase in time to the controller's 33-55
    (docs/benchmarks.md, goodput_trace_history_thermal, seeds 0 and 2). The engine's steps
    judge the new limit within a tick or two meanwhile."""
    after_cut = state.last_decrease_tick is not None and (
        state.last_decrease_tick == state.last_change_tick
    )
    if window_tpot is None or not after_cut or inputs.fresh_requests is None:
        return window_tpot, ""
    if inputs.fresh_requests < cfg.min_samples or inputs.fresh_tpot_p99_s is None:
        return None, ""
    return inputs.fresh_tpot_p99_s, f" of the {inputs.fresh_requests} admitted since the cut"


def _clamp(t: _Tick) -> ControlDecision | None:
    """Move a base limit outside [min_limit, upper] to the nearest bound; None when inside."""
    cfg, base, knee = t.cfg, t.base, t.inputs.knee_limit
    if cfg.min_limit <= base <= t.upper:
        return None
    new_base = min(t.upper, max(cfg.min_limit, base))
    new_limit = derated(new_base, t.factor)
    if base > t.upper:
        why = (
            f"above the knee {knee} from the last benchmark"
            if knee is not None and t.upper == max(cfg.min_limit, knee)
            else f"above max_limit {cfg.max_limit}"
        )
    else:
        why = f"below min_limit {cfg.min_limit}"
    reason = f"limit {base} {why}: {_move(t.limit, new_limit, base, new_base, t.factor)}"
    return t.finish(new_base, Action.CLAMP, reason)


def _breaches(t: _Tick) -> list[str]:
    """What breaks this tick: KV over its high mark, a p99 over its SLO, the engine's own
    recent steps over it."""
    cfg = t.cfg
    causes = []
    if t.kv > cfg.kv_high_ratio:
        causes.append(f"KV cache {t.kv:.0%} > {cfg.kv_high_ratio:.0%}")
    if t.ttft is not None and t.ttft > cfg.slo_ttft_p99_s:
        causes.append(f"p99 TTFT {_fmt_s(t.ttft)} > SLO {_fmt_s(cfg.slo_ttft_p99_s)}")
    if _tpot_over(cfg, t.cut_tpot):
        assert t.cut_tpot is not None and cfg.slo_tpot_p99_s is not None
        causes.append(
            f"p99 TPOT{t.cut_tpot_source} {_fmt_s(t.cut_tpot)} > SLO {_fmt_s(cfg.slo_tpot_p99_s)}"
        )
    if t.live_over is not None:
        causes.append(t.live_over[1])
    return causes


def _live_overshoot(
    cfg: ControllerConfig, inputs: ControlInputs, limit: int
) -> tuple[float, str] | None:
    """The engine's recent steps over the SLO: (worst share of its SLO, why); None when not.

    A finished request shows a breach only when it ends, ~10 s after the batch that broke
    it started on the CPU engine; the steps show it within a tick. Judged only while the
    engine runs no more than the limit in force: after a cut the requests admitted before
    it still run, and their steps say nothing of the new limit."""
    if not _steps_judge(cfg, inputs, limit):
        return None
    parts: list[tuple[float, str]] = []
    tpot = _cut_tpot(inputs)
    if _tpot_over(cfg, tpot):
        assert tpot is not None and cfg.slo_tpot_p99_s is not None
        parts.append(
            (tpot / cfg.slo_tpot_p99_s, f"TPOT {_fmt_s(tpot)} > SLO {_fmt_s(cfg.slo_tpot_p99_s)}")
        )
    ttft = inputs.live_ttft_p99_s
    if ttft is not None and ttft > cfg.slo_ttft_p99_s:
        parts.append(
            (
                ttft / cfg.slo_ttft_p99_s,
                f"p99 TTFT {_fmt_s(ttft)} > SLO {_fmt_s(cfg.slo_ttft_p99_s)}",
            )
        )
    if not parts:
        return None
    worst = max(r for r, _ in parts)
    what = " and ".join(w for _, w in parts)
    steps, part = inputs.live_steps, ""
    if inputs.live_request_tpot_s is not None and inputs.live_request_steps:
        steps = inputs.live_request_steps
        if not _steps_cover_a_request(inputs):
            assert inputs.live_decode_gaps is not None
            part = f" (of a request's {inputs.live_decode_gaps:.0f})"
    return worst, f"the engine's last {steps} steps{part}: {what}"


def _cut_tpot(inputs: ControlInputs) -> float | None:
    """The steps' TPOT a cut judges: a request's through them where the loop reports it, else
    the span's mean gap. One step that prefilled a wave of prompts among a few decode steps
    is no breach: on the span's mean, every seed of steady bursty cut 64 to 44-46 in the
    bursts (cuts sized to steps ~1.14x the SLO) where static 64 served every request within
    the SLO (docs/benchmarks.md, goodput_trace_takeover_steady_bursty); judging a request's
    TPOT, no seed cut at all (goodput_trace_cutread_steady_bursty)."""
    if inputs.live_request_tpot_s is not None:
        return inputs.live_request_tpot_s
    return inputs.live_tpot_s


def _tpot_over(cfg: ControllerConfig, tpot_s: float | None) -> bool:
    """A TPOT over its SLO (False when either is not there)."""
    return tpot_s is not None and cfg.slo_tpot_p99_s is not None and tpot_s > cfg.slo_tpot_p99_s


def _steps_cover_a_request(inputs: ControlInputs) -> bool:
    """The steps a request's TPOT was read on are as many as a request decodes (or a
    request's length is not known): what a request through them saw, not a few steps'
    reading stretched over a whole decode."""
    gaps = inputs.live_decode_gaps
    if gaps is None or inputs.live_request_tpot_s is None:
        return True
    return (inputs.live_request_steps or 0) >= gaps


def _steps_mean_over(t: _Tick) -> bool:
    """The engine's steps, judged this tick, give a request's TPOT (a mean) over the SLO, on
    as many steps as a request decodes."""
    return (
        t.live_over is not None
        and _tpot_over(t.cfg, _cut_tpot(t.inputs))
        and _steps_cover_a_request(t.inputs)
    )


def _is_mild(t: _Tick) -> bool:
    """Every p99 within mild_breach_ratio x its SLO and KV not over its mark: one step back.

    Not when a request's TPOT through the engine's steps (a mean) is over its SLO: a p99 over
    its SLO is a tail that may be noise, a mean over it is the typical running request
    missing. Taken as mild, thermal's cool phase on a box of 4 req/s sat at 61 -> 60 -> 59
    -> 58 over 34 s, its steps at 516-529 ms against 500, and served 60 good requests where
    static 32 served 99
    (docs/benchmarks.md, goodput_trace_ceil_thermal, seed 0).

    A mean on fewer steps than a request decodes is a few seconds of the engine, its
    missing steps filled at their median: a burst of slow steps reads as a whole request's.
    In thermal's hot room the CPU neighbours slow the engine in spikes of a few seconds
    (steps of 0.5-1.5 s among steps of 0.3-0.4 s): 8-12 steps read 520-630 ms, and each
    was a full cut, 35 -> 22 and 21 -> 13 (seed 0), 43 -> 32 and 23 -> 16 (seed 2), where
    static 32's requests, each through ~32 steps, met the SLO (docs/benchmarks.md,
    goodput_trace_history_thermal). Such a reading within mild_breach_ratio is one step;
    again with no tick between that judged the SLO kept, the full cut (_back_off)."""
    if _steps_mean_over(t):
        return False
    cfg = t.cfg
    worst = max(
        (t.ttft or 0.0) / cfg.slo_ttft_p99_s,
        (t.cut_tpot or 0.0) / cfg.slo_tpot_p99_s if cfg.slo_tpot_p99_s else 0.0,
        0.0 if t.live_over is None else t.live_over[0],
    )
    return t.kv <= cfg.kv_high_ratio and worst <= cfg.mild_breach_ratio


def _cut_factor(t: _Tick, over: float | None) -> float:
    """x decrease_factor; deeper when the engine's steps are `over` times the SLO (None: not
    judged): sized to bring them to probe_below_ratio of it (latency in proportion to the
    limit), at most to live_cut_floor_ratio of the limit. A box that slows by half (a
    throttled GPU, a noisy neighbour) needs half the limit; 0.75 a cut, 4 ticks apart,
    takes 12 s to get there."""
    cfg = t.cfg
    if over is None:
        return cfg.decrease_factor
    sized = cfg.probe_below_ratio / over
    return max(cfg.live_cut_floor_ratio, min(cfg.decrease_factor, sized))


def _recent_gap_ratio(t: _Tick) -> float | None:
    """The recent steps' median gap as a share of the TPOT SLO, where a request's TPOT
    through the steps breaks it (None otherwise: late first tokens alone are no gap).

    Whether to cut is judged on a request's whole decode through the steps; when the box
    slows, that decode still holds the fast steps from before. As thermal's hot room began
    it read 524 ms while the last seconds of steps ran at 893 ms: the cut sized on 524 ms
    went 52 -> 39, and 39 ran 24 s of 0.5-1.4 s steps (docs/benchmarks.md,
    goodput_trace_fresh_thermal, seed 2). The median, not the mean: sized on the steps'
    mean gap, a wave of 1500-token prefills in a few steps read 1.06-1.13 s on phase
    change's documents where a decode read 551-563 ms, and the cut went 37 -> 18
    (goodput_trace_depth_phase_change, seeds 0 and 2)."""
    cfg, inputs = t.cfg, t.inputs
    gap = inputs.live_gap_median_s
    if t.live_over is None or gap is None or cfg.slo_tpot_p99_s is None:
        return None
    if not _tpot_over(cfg, _cut_tpot(inputs)):
        return None
    return gap / cfg.slo_tpot_p99_s


def _cut_base(t: _Tick, mild: bool) -> tuple[int, str]:
    """The base limit after a cut, and a note on its depth ("" when nothing to say): one
    step when mild, else x the cut factor (>= one step), the factor sized from the worse of
    the reading that judged the steps and their recent median gap (_recent_gap_ratio)."""
    cfg = t.cfg
    floor_limit = derated(cfg.min_limit, t.factor)
    note = ""
    if mild:
        target = max(floor_limit, t.limit - cfg.increase_step)
    else:

        def cut_to(over: float | None) -> int:
            factor = _cut_factor(t, over)
            return max(floor_limit, min(t.limit - 1, math.floor(t.limit * factor + _EPS)))

        target = cut_to(None if t.live_over is None else t.live_over[0])
        # A gap is there only where the steps judged (_recent_gap_ratio), and the cut goes
        # deeper only where it reads worse than what judged them.
        gap = _recent_gap_ratio(t)
        if gap is not None and cut_to(gap) < target:
            target = cut_to(gap)
            assert t.inputs.live_gap_median_s is not None  # _recent_gap_ratio
            note = (
                f" (sized to the steps' recent median gap of {_fmt_s(t.inputs.live_gap_median_s)})"
            )
    return min(t.upper, max(cfg.min_limit, base_for(target, t.factor))), note


def _retry_wait_after_breach(t: _Tick) -> int:
    """The wait before probing the breaking point again, doubled when it broke again."""
    retry = _breach_wait(t)
    if t.state.breach_base is not None and t.base >= t.state.breach_base:
        # The old breaking point (or above) broke again, on a retry or after one that
        # seemed to hold: wait longer before the next try. A lower level breaking means
        # the load got heavier, not that the retries were too eager.
        retry = min(t.cfg.retry_ticks_max, retry * 2)
    return retry


def _steps_judge(cfg: ControllerConfig, inputs: ControlInputs, limit: int) -> bool:
    """The engine's steps can judge the limit: live_min_steps of them, and no more running
    than the limit (after a cut, the requests admitted before it say nothing of it)."""
    return (inputs.live_steps or 0) >= cfg.live_min_steps and inputs.in_flight <= limit


def _judged(t: _Tick) -> bool:
    """This tick had evidence to judge the SLO on: min_samples finished requests since the
    last change, or the engine's steps (_steps_judge)."""
    return t.ttft is not None or _steps_judge(t.cfg, t.inputs, t.limit)


def _mild_cut_did_not_hold(t: _Tick) -> bool:
    """The last change was a one-step cut for a mild breach, within window_s, and the SLO is
    over again with no tick judged within it since: the step was not noise but too small.
    Without this a limit that starts high (the shipped start is engine.max_num_seqs) meets
    the SLO from above one step a hold, and sits on its edge for minutes: thermal from 64
    spent a whole run between 64 and 56 at p99 TPOT 510-588 ms against 500
    (docs/benchmarks.md, goodput_trace_end_thermal)."""
    state = t.state
    return (
        state.mild_cut_tick is not None
        and state.mild_cut_tick == state.last_change_tick
        and state.last_change_s is not None
        and t.inputs.now_s - state.last_change_s <= t.cfg.window_s
    )


def _back_off(t: _Tick, cause: str) -> ControlDecision:
    cfg, state, tick, limit = t.cfg, t.state, t.tick, t.limit
    since_cut = None if state.last_decrease_tick is None else tick - state.last_decrease_tick
    if since_cut is not None and since_cut <= cfg.hold_ticks_after_decrease:
        wait = cfg.hold_ticks_after_decrease - since_cut + 1
        reason = f"{cause}: holding {limit}, {wait} more tick(s) for the last cut to show"
        return t.finish(t.base, Action.HOLD, reason)
    mild = _is_mild(t)
    again = mild and _mild_cut_did_not_hold(t)
    if again:
        mild = False
    new_base, depth = _cut_base(t, mild)
    new_limit = derated(new_base, t.factor)
    if new_limit >= limit:
        return t.finish(t.base, Action.HOLD, f"{cause}: already at the minimum {limit}")
    how = f" (mild, within {cfg.mild_breach_ratio:g}x: one step)" if mild else ""
    if not mild and _steps_mean_over(t):
        how = " (a mean, not a tail: the full cut)"
    if again:
        how = " (mild again after a one-step cut: the full cut)"
    reason = f"{cause}{how}{depth}: {_move(limit, new_limit, t.base, new_base, t.factor)}"
    return t.finish(
        new_base,
        Action.DOWN,
        reason,
        last_decrease_tick=tick,
        mild_cut_tick=tick if mild else None,
        breach_base=t.base,
        barrier=True,
        breach_tick=tick,
        retry_ticks=_retry_wait_after_breach(t),
        retrying_since_tick=None,
        cut_landed_base=new_base,
        breach_step_s=_speed_at_breach(t),
        recent_cuts=(
            *((ts, b) for ts, b in state.recent_cuts if t.inputs.now_s - ts < _takeover_s(cfg)),
            (t.inputs.now_s, t.base),
        ),
    )


def _derate_ceiling(t: _Tick) -> int:
    """The highest base a probe may reach under a derate: the base when the derate began."""
    return t.state.derate_base if t.state.derate_base is not None else t.base


def _probe_blocker(t: _Tick) -> str | None:
    """Why this tick may not probe up, or None when every condition for a probe holds."""
    cfg, inputs, limit, factor = t.cfg, t.inputs, t.limit, t.factor
    if inputs.protect:
        return "thermal PROTECT, not probing"
    if inputs.in_flight > limit:
        # The last cut is still draining: the limit holds nothing back yet, and the steps
        # of a draining engine (no prefill) read fast; a probe on them went straight back
        # to the level that broke (thermal from 64: 64 -> 38 -> 57 -> 63 -> 38).
        return f"{inputs.in_flight} running over the limit {limit}: the last cut is draining"
    if factor < 1 - _EPS and t.base >= _derate_ceiling(t):
        # Probing past the base the derate found would hand back the load the thermal
        # policy just took away, and the two would fight down to the thermal floor.
        return f"thermal derate x{factor:.2f} in force, not probing past base {t.base}"
    if t.ttft is None:
        return (
            f"{inputs.requests_in_window} request(s) in the window, "
            f"{cfg.min_samples} needed to judge the SLO"
        )
    ttft_probe = cfg.slo_ttft_p99_s * cfg.probe_below_ratio
    if t.ttft >= ttft_probe and not _ttft_is_history(t):
        return (
            f"p99 TTFT {_fmt_s(t.ttft)} within SLO {_fmt_s(cfg.slo_ttft_p99_s)} "
            f"(probing needs < {_fmt_s(ttft_probe)})"
        )
    if _tpot_over(cfg, t.tpot) and t.cut_tpot is None:
        assert t.tpot is not None and cfg.slo_tpot_p99_s is not None
        return (
            f"p99 TPOT {_fmt_s(t.tpot)} > SLO {_fmt_s(cfg.slo_tpot_p99_s)} from requests "
            f"admitted before the last cut ({_fresh_after_cut(t)})"
        )
    if _tpot_in_dead_band(t) and not _tail_is_history(t):
        tail, whose = _tail_for_probes(t)
        assert tail is not None and cfg.slo_tpot_p99_s is not None  # in the dead band
        return (
            f"p99 TPOT{whose} {_fmt_s(tail)} within SLO {_fmt_s(cfg.slo_tpot_p99_s)} "
            f"(probing needs < {_fmt_s(cfg.slo_tpot_p99_s * cfg.probe_below_ratio)})"
        )
    # A burst the predictor sees coming counts like a queue: raise the limit before it lands,
    # while latency still has room, instead of after the queue and the TTFT have grown.
    ahead = inputs.forecast_pending is not None and inputs.forecast_pending > limit
    if (inputs.queued == 0 or inputs.in_flight == 0) and not ahead:
        return f"no queue ({inputs.queued} waiting, {inputs.in_flight} running)"
    if t.kv >= cfg.kv_probe_max_ratio:
        return f"KV cache {t.kv:.0%}, probing needs < {cfg.kv_probe_max_ratio:.0%}"
    return None


def _ttft_is_history(t: _Tick) -> bool:
    """The window's p99 TTFT, in the dead band, is not what the engine's first tokens take
    now: among the steps that judge the limit (enough of them, none a cut's drain), the p99
    of min_samples first tokens or more is under fast_probe_below_ratio of the SLO.

    The window's p99 is its slowest request or two of the last window_s (from admission,
    the queue's wait aside: services/accounting.py), so one slow spell of first tokens holds
    every probe for window_s after it. On phase change the controller sat at its start of 8
    for 70 s at "p99 TTFT 4.67 s within SLO 5 s (probing needs < 4 s)" while the queue filled
    up to the shed and the engine's first tokens among its steps took 0.3-1.7 s in 27 of
    28 readings (docs/benchmarks.md, goodput_trace_depth_phase_change, seed 1). As for the
    TPOT (_tail_is_history), only the gate opens: such a probe is one step a hold
    (_probe_step), and a p99 over the SLO is still a breach."""
    cfg, inputs = t.cfg, t.inputs
    live = inputs.live_ttft_p99_s
    if t.ttft is None or live is None or not _steps_judge(cfg, inputs, t.limit):
        return False
    if (inputs.live_ttft_count or 0) < cfg.min_samples:
        return False  # a p99 of a few first tokens is no tail
    slo = cfg.slo_ttft_p99_s
    in_band = slo * cfg.probe_below_ratio <= t.ttft <= slo
    return in_band and live < cfg.fast_probe_below_ratio * slo


def _ttft_gate(t: _Tick) -> str:
    """Why the p99 TTFT let a probe pass, for its reason."""
    cfg = t.cfg
    assert t.ttft is not None  # _probe_blocker holds without a judged TTFT
    slo = _fmt_s(cfg.slo_ttft_p99_s)
    if not _ttft_is_history(t):
        ttft_probe = cfg.slo_ttft_p99_s * cfg.probe_below_ratio
        return (
            f"p99 TTFT {_fmt_s(t.ttft)} < {_fmt_s(ttft_probe)} "
            f"({cfg.probe_below_ratio:.0%} of SLO {slo}), "
        )
    inputs = t.inputs
    assert inputs.live_ttft_p99_s is not None  # _ttft_is_history
    return (
        f"p99 TTFT {_fmt_s(t.ttft)} within SLO {slo} is the window's ({cfg.window_s:g} s): "
        f"the engine's {inputs.live_ttft_count} first tokens among its last "
        f"{inputs.live_steps} steps take {_fmt_s(inputs.live_ttft_p99_s)} "
        f"(< {cfg.fast_probe_below_ratio:.0%} of SLO {slo}); "
    )


def _fresh_after_cut(t: _Tick) -> str:
    """What the requests admitted since the last cut show, for a hold's reason (their p99
    is there once _tail_for_cuts found enough of them)."""
    if t.cut_tpot is None:
        fresh = t.inputs.fresh_requests or 0
        return f"{fresh} of those admitted since have finished, {t.cfg.min_samples} needed"
    return f"p99 TPOT{t.cut_tpot_source} {_fmt_s(t.cut_tpot)}"


def _tail_for_probes(t: _Tick) -> tuple[float | None, str]:
    """The p99 TPOT that gates a probe, and whose: after a cut, once min_samples admitted
    since it have finished, theirs (_tail_for_cuts); else the window's.

    The window keeps the tail of the limit cut from for window_s: on thermal's cool phase
    after the hot room it held 18 for 30 s at "p99 TPOT 512 ms > SLO 500 ms from requests
    admitted before the last cut" while the 54 admitted since the cut showed 199 ms and
    static 32 ran 32 (docs/benchmarks.md, goodput_trace_stale_thermal, seed 2)."""
    if t.cut_tpot_source:
        return t.cut_tpot, t.cut_tpot_source
    return t.tpot, ""


def _tpot_in_dead_band(t: _Tick) -> bool:
    """The p99 TPOT that gates probes at or over the probe mark (probe_below_ratio x its
    SLO)."""
    slo = t.cfg.slo_tpot_p99_s
    tail, _ = _tail_for_probes(t)
    return tail is not None and slo is not None and tail >= slo * t.cfg.probe_below_ratio


def _tail_is_history(t: _Tick) -> bool:
    """The p99 TPOT that gates probes is from a slower box than runs now: the engine's steps since
    the last change (enough to judge, none of them a cut's drain) give a request's TPOT
    through them under fast_probe_below_ratio of the SLO. A finished request's TPOT tells
    how the engine ran over its whole life, and the window keeps it window_s longer: after a
    slow spell ends, the p99 sits in the dead band for up to window_s + a request's life and
    holds the limit where the slow spell left it. On thermal the cool phase after the hot
    room held 25 at "p99 TPOT 483 ms (probing needs < 400 ms)" for 50 s while a request
    through the steps took 160-280 ms (docs/benchmarks.md, goodput_trace_cutread_thermal,
    seed 2). A mean under half the SLO leaves a p99 room under the probe mark. Only the gate
    opens: such a probe is one step a hold (_probe_step), never sized on the mean."""
    cfg, inputs = t.cfg, t.inputs
    if cfg.slo_tpot_p99_s is None or inputs.live_request_tpot_s is None:
        return False
    if not _steps_judge(cfg, inputs, t.limit):
        return False
    return inputs.live_request_tpot_s < cfg.fast_probe_below_ratio * cfg.slo_tpot_p99_s


def _history(t: _Tick) -> str:
    """Why a p99 TPOT in the dead band did not hold this probe ("" when it was under)."""
    cfg, inputs = t.cfg, t.inputs
    if not (_tpot_in_dead_band(t) and _tail_is_history(t)):
        return ""
    tail, whose = _tail_for_probes(t)
    assert tail is not None and cfg.slo_tpot_p99_s is not None
    assert inputs.live_request_tpot_s is not None
    return (
        f"p99 TPOT{whose} {_fmt_s(tail)} is from a slower engine: a request through its last "
        f"{inputs.live_request_steps} steps takes {_fmt_s(inputs.live_request_tpot_s)} "
        f"(< {cfg.fast_probe_below_ratio:.0%} of SLO {_fmt_s(cfg.slo_tpot_p99_s)}); "
    )


def _hold_blocker(t: _Tick, fast: bool) -> str | None:
    """Too soon after the last change for this probe (a fast one waits fewer ticks)."""
    if t.state.last_change_tick is None:
        return None
    hold = t.cfg.fast_probe_hold_ticks if fast else t.cfg.hold_ticks_after_increase
    since = t.tick - t.state.last_change_tick
    if since <= hold:
        return f"{hold - since + 1} more tick(s) after the last change"
    return None


def _respect_breach(t: _Tick, new_base: int) -> tuple[int, int | None, str | None]:
    """Cap a probe by the remembered breaking point: (base, retrying since, why to hold)."""
    state, factor, limit, tick = t.state, t.factor, t.limit, t.tick
    retrying_since = state.retrying_since_tick
    if not (state.barrier and state.breach_base is not None and new_base >= state.breach_base):
        return new_base, retrying_since, None
    assert state.breach_tick is not None
    waited = tick - state.breach_tick
    retry = _breach_wait(t)
    if retrying_since is not None:
        # A retry is on: stay at the old breaking point until it has held a while.
        capped = min(new_base, state.breach_base)
        if derated(capped, factor) <= limit:
            left = retry - (tick - retrying_since) + 1
            why = f"retrying {state.breach_base}, {left} more tick(s) before going higher"
            return new_base, retrying_since, why
        return capped, retrying_since, None
    if waited < retry:
        capped = min(new_base, state.breach_base - 1)
        if derated(capped, factor) <= limit:
            why = (
                f"staying below {state.breach_base} where the SLO broke {waited} tick(s) "
                f"ago (retry in {retry - waited})"
            )
            return new_base, retrying_since, why
        return capped, retrying_since, None
    return new_base, tick, None


def _probe_pressure(t: _Tick) -> str:
    """What asks for more: the queue, or the predictor's forecast of one."""
    inputs = t.inputs
    if inputs.queued > 0 and inputs.in_flight > 0:
        return f"{inputs.queued} queued"
    return (
        f"forecast {inputs.forecast_pending:.1f} pending in "
        f"{inputs.forecast_horizon_s or 0:g} s ({inputs.forecast_source}) > limit {t.limit}"
    )


@dataclass(frozen=True)
class _Evidence:
    """The p99s a sized probe is judged by, and what they were measured on."""

    ttft_s: float | None
    tpot_s: float | None
    source: str  # for the reason: "" (the window), or what ran under the limit in force


def _probe_evidence(t: _Tick) -> _Evidence | None:
    """What ran wholly under the limit in force: the requests admitted since the last change
    that finished (min_samples of them), and the engine's steps since it (live_min_steps of
    them); the worse of the two where both are there. The window's p99s when the loop
    measures neither; None when it measures them and has too few yet."""
    inputs, cfg = t.inputs, t.cfg
    if inputs.fresh_requests is None and inputs.live_steps is None:
        return _Evidence(t.ttft, t.tpot, "")
    guarded = cfg.slo_tpot_p99_s is not None
    found: list[_Evidence] = []
    fresh = inputs.fresh_requests or 0
    if fresh >= cfg.min_samples and inputs.fresh_ttft_p99_s is not None:
        tpot = inputs.fresh_tpot_p99_s if guarded else None
        found.append(
            _Evidence(
                inputs.fresh_ttft_p99_s, tpot, f" of the {fresh} admitted since the last change"
            )
        )
    steps = inputs.live_steps or 0
    if steps >= cfg.live_min_steps and (inputs.live_tpot_s is not None or not guarded):
        # The first tokens among the steps where there are any, else the window's (finished
        # since the change): a step without a new request says nothing of prefill.
        ttft = inputs.live_ttft_p99_s if inputs.live_ttft_p99_s is not None else t.ttft
        tpot = inputs.live_tpot_s if guarded else None
        found.append(_Evidence(ttft, tpot, f" of the engine's {steps} steps since the last change"))
    if not found:
        return None
    if len(found) == 1:
        return found[0]
    a, b = found

    def worse(x: float | None, y: float | None) -> float | None:
        return y if x is None else x if y is None else max(x, y)

    return _Evidence(
        worse(a.ttft_s, b.ttft_s),
        worse(a.tpot_s, b.tpot_s),
        a.source + " and" + b.source.removeprefix(" of"),
    )


def _worst_ratio(cfg: ControllerConfig, ev: _Evidence) -> float | None:
    """The evidence's worst p99 as a share of its SLO; None without a TTFT to judge."""
    if ev.ttft_s is None:
        return None
    worst = ev.ttft_s / cfg.slo_ttft_p99_s
    if ev.tpot_s is not None and cfg.slo_tpot_p99_s is not None:
        worst = max(worst, ev.tpot_s / cfg.slo_tpot_p99_s)
    return worst


def _at_the_limit(t: _Tick, worst: float) -> tuple[float, str]:
    """The evidence's worst share of its SLO projected to the limit in force, and how it was
    projected ("" when as measured). Measured while fewer ran than the limit allows (the
    prefill budget held the queue, or a probe's new room had not filled), latency at the
    full limit is higher in proportion: judging the limit by it climbed the diurnal ramp by
    +36-50 % at once on headroom measured at a smaller batch (docs/benchmarks.md,
    goodput_trace_tail_diurnal). Never projected down from a batch above the limit (just
    after a cut): that would only make a probe bolder."""
    batch, steps = t.inputs.live_batch, t.inputs.live_steps or 0
    if batch is None or steps < t.cfg.live_min_steps or not 0 < batch < t.limit:
        return worst, ""
    projected = worst * t.limit / batch
    return projected, f" ({worst:.0%} with {batch:.3g} running, projected to {t.limit})"


def _breach_wait(t: _Tick) -> int:
    """Ticks to wait after a breach before probing its level again (the current retry wait)."""
    return t.state.retry_ticks or t.cfg.retry_ticks


def _fast_ceiling(t: _Tick) -> tuple[int, int] | None:
    """(the effective limit sized probes stop at, ticks until they may pass it) while a
    breach's wait runs: where the last cut landed. None when no wait runs."""
    state = t.state
    if not state.barrier or state.breach_tick is None or state.cut_landed_base is None:
        return None
    left = _breach_wait(t) - (t.tick - state.breach_tick)
    if left <= 0:
        return None
    return derated(state.cut_landed_base, t.factor), left


def _probe_step(t: _Tick) -> tuple[int, str | None, bool]:
    """How far a probe goes, why (None: one step, nothing to say), and whether it is sized
    (a sized probe waits fast_probe_hold_ticks, one step hold_ticks_after_increase).

    Sized by the headroom on fresh evidence: latency is projected to grow in proportion to
    the limit, so the step takes the worst p99 to probe_below_ratio of its SLO, at most
    fast_probe_fraction of the limit. On a CPU engine a decode step's time grows a little
    less than in proportion to the batch, so the projection errs on the safe side. Evidence
    from requests admitted before the change, or before any change, would climb on stale
    news (a CPU engine's TPOT lags its limit by a whole request, ~10 s) and overshoot the
    TPOT SLO.

    While a breach's wait runs, a sized probe stops where the last cut landed (_fast_ceiling).
    On thermal with the box at 4 req/s (docs/benchmarks.md, goodput_trace_ship_thermal,
    seed 0) the steps broke the TPOT SLO at 60 and again at 37 (cut to 21); two sized probes
    on steps at 38-55 % of the SLO took it 21 -> 28 -> 36 (one under the breach at 37) in
    6 s, and it broke again at 36 (630 ms): each climb went back to where the last broke."""
    cfg = t.cfg
    step = cfg.increase_step
    evidence = _probe_evidence(t)
    if cfg.fast_probe_fraction <= 0 or t.inputs.queued <= 0 or evidence is None:
        return step, None, False
    if _history(t) or _ttft_is_history(t):
        # A gating tail is in the dead band and only the engine's steps call it history:
        # a few seconds of steps opened the gate, no headroom to size a probe on.
        return step, None, False
    measured = _worst_ratio(cfg, evidence)
    if measured is None:
        return step, None, False
    worst, at = _at_the_limit(t, measured)
    if worst >= cfg.probe_below_ratio:
        return step, None, False
    if worst < cfg.fast_probe_below_ratio:
        grow = cfg.fast_probe_fraction
        why = (
            f"every p99{evidence.source} < {cfg.fast_probe_below_ratio:.0%} of its SLO{at}: "
            f"+{grow:.0%}; "
        )
    else:
        grow = min(cfg.fast_probe_fraction, cfg.probe_below_ratio / worst - 1)
        why = (
            f"worst p99{evidence.source} at {worst:.0%} of its SLO{at}: "
            f"+{grow:.0%} projects {cfg.probe_below_ratio:.0%}; "
        )
    sized = math.floor(t.limit * grow + _EPS)
    ceiling = _fast_ceiling(t)
    if ceiling is not None and t.limit + sized > ceiling[0]:
        sized = ceiling[0] - t.limit
        why += (
            f"stopped at {ceiling[0]}, where the last cut landed (one step a hold past it for "
            f"{ceiling[1]} more tick(s)); "
        )
        if sized <= step:
            return step, why, False
    if sized > step:
        return sized, why, True
    return step, None, False


def _probe(t: _Tick) -> ControlDecision:
    cfg, limit, factor = t.cfg, t.limit, t.factor
    blocker = _probe_blocker(t)
    if blocker is not None:
        return t.hold(blocker)
    step, sized, fast = _probe_step(t)
    blocker = _hold_blocker(t, fast)
    if blocker is not None:
        return t.hold(blocker)
    wanted = min(t.upper, base_for(limit + step, factor))
    if factor < 1 - _EPS:
        wanted = min(wanted, _derate_ceiling(t))
    new_base, retrying_since, blocker = _respect_breach(t, wanted)
    if blocker is not None:
        return t.hold(blocker)
    new_limit = derated(new_base, factor)
    if new_limit <= limit:
        knee = t.inputs.knee_limit
        ceiling = f"the knee {knee}" if t.upper != cfg.max_limit else f"max_limit {cfg.max_limit}"
        return t.hold(f"at the ceiling ({ceiling})")
    reason = (
        f"{_ttft_gate(t)}{_history(t)}{sized or ''}{_probe_pressure(t)}: "
        f"{_move(limit, new_limit, t.base, new_base, factor)}"
    )
    return t.finish(new_base, Action.UP, reason, retrying_since_tick=retrying_since)
