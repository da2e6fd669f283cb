"""Thermal derating policy (pure): GPU samples in, a derate factor and level out, with reasons.

NORMAL -> DERATE when a core reaches `derate_core_c`: the concurrency factor is cut by
`step_factor` at once and again every `step_interval_s` while it stays hot, never below
`floor_factor`. PROTECT when HBM reaches `protect_mem_c`, a core comes within
`protect_slowdown_margin_c` of that GPU's own slowdown threshold, or a GPU is lost: admission
then takes only realtime requests (enforced by the caller). Recovery is stepwise: the factor
goes up by `recover_step` per `dwell_s` that every GPU stays below its threshold minus
`hysteresis_c`. The hottest GPU governs.

Cuts are multiplicative and recovery additive (AIMD) on purpose: with a load that overheats
at full factor, a geometric climb back returns straight to the factor that overheated and
the system cycles every few minutes; small additive steps settle on a factor whose
temperature sits inside the hysteresis band, where the policy then holds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from appliance.domain.gpu_sample import GpuSample
from appliance.domain.limits import Problem, raise_problems

# Factors within this of 1.0 count as fully restored (sums of float steps can miss 1.0 by
# an ulp).
_FULL_EPS = 1e-9


class ThermalLevel(StrEnum):
    NORMAL = "normal"
    DERATE = "derate"
    PROTECT = "protect"

    @property
    def severity(self) -> int:
        """0, 1, 2 for NORMAL, DERATE, PROTECT (the `appliance_derate_level` gauge)."""
        return _SEVERITY[self]


_SEVERITY = {ThermalLevel.NORMAL: 0, ThermalLevel.DERATE: 1, ThermalLevel.PROTECT: 2}


@dataclass(frozen=True)
class ThermalPolicyConfig:
    """Every number the thermal policy uses."""

    derate_core_c: float = 85.0
    protect_mem_c: float = 95.0
    protect_slowdown_margin_c: float = 3.0
    hysteresis_c: float = 5.0
    dwell_s: float = 60.0
    step_factor: float = 0.75
    floor_factor: float = 0.25
    step_interval_s: float = 30.0
    recover_step: float = 0.1

    def __post_init__(self) -> None:
        raise_problems(_config_problems(self))


def _config_problems(cfg: ThermalPolicyConfig) -> list[Problem]:
    """Every invariant of the thermal policy's numbers, however the config was built."""
    problems = []
    if not 0.0 < cfg.step_factor < 1.0:
        problems.append(Problem("step_factor", f"must be in (0, 1), got {cfg.step_factor}"))
    if not 0.0 < cfg.floor_factor <= 1.0:
        problems.append(Problem("floor_factor", f"must be in (0, 1], got {cfg.floor_factor}"))
    if not 0.0 < cfg.recover_step <= 1.0:
        problems.append(Problem("recover_step", f"must be in (0, 1], got {cfg.recover_step}"))
    if not cfg.hysteresis_c > 0.0:
        problems.append(Problem("hysteresis_c", f"must be > 0, got {cfg.hysteresis_c}"))
    if not cfg.dwell_s >= 0.0:
        problems.append(Problem("dwell_s", f"must be >= 0, got {cfg.dwell_s}"))
    if not cfg.step_interval_s > 0.0:
        problems.append(Problem("step_interval_s", f"must be > 0, got {cfg.step_interval_s}"))
    if not cfg.protect_slowdown_margin_c >= 0.0:
        problems.append(
            Problem(
                "protect_slowdown_margin_c",
                f"must be >= 0, got {cfg.protect_slowdown_margin_c}",
            )
        )
    return problems


@dataclass(frozen=True)
class ThermalState:
    """Where the policy stands; carried from one step to the next."""

    level: ThermalLevel = ThermalLevel.NORMAL
    factor: float = 1.0
    since_s: float | None = None  # when the current level began
    last_cut_s: float | None = None  # last factor cut (paces cuts while hot)
    last_step_s: float | None = None  # last factor change either way (paces recovery)
    cool_since_s: float | None = None  # every GPU below the release band since
    protect_clear_since_s: float | None = None  # PROTECT causes below their band since


@dataclass(frozen=True)
class ThermalDecision:
    """The outcome of one policy step; `reason` names the governing GPU and temperature."""

    state: ThermalState
    changed: bool
    reason: str
    gpu_index: int | None = None
    temp_c: float | None = None

    @property
    def factor(self) -> float:
        """Multiplier for the concurrency limit, in [floor_factor, 1]."""
        return self.state.factor

    @property
    def level(self) -> ThermalLevel:
        """NORMAL, DERATE or PROTECT."""
        return self.state.level


@dataclass(frozen=True)
class _Worst:
    """The governing GPU: a PROTECT cause before a derate cause before none, then the one
    furthest over (or least under) its threshold."""

    rank: tuple[int, float]
    gpu_index: int
    temp_c: float | None
    text: str


@dataclass(frozen=True)
class _Assessment:
    protect: bool  # some GPU is at or past a PROTECT threshold, or lost
    protect_clear: bool  # every GPU is below every PROTECT threshold minus hysteresis
    hot: bool  # some GPU is at or past the derate threshold (or protect)
    cool: bool  # every GPU is below every threshold minus hysteresis
    worst: _Worst | None
    worst_protect: _Worst | None  # the governing PROTECT cause alone, for leaving PROTECT


def _known(sample: GpuSample, field: str, value: float | None) -> bool:
    """A None reading that failed this time is unknown; one the GPU never reports is not."""
    return value is not None or field not in sample.invalid


def _assess(samples: Sequence[GpuSample], cfg: ThermalPolicyConfig) -> _Assessment:
    hyst = cfg.hysteresis_c
    protect = False
    protect_clear = True
    hot = False
    cool = True
    worst: _Worst | None = None
    worst_protect: _Worst | None = None

    def consider(
        excess: float, index: int, temp: float | None, text: str, *, protects: bool = False
    ) -> None:
        nonlocal worst, worst_protect
        tier = (2 if protects else 1) if excess >= 0 else 0
        if worst is None or (tier, excess) > worst.rank:
            worst = _Worst((tier, excess), index, temp, text)
        if protects and (worst_protect is None or (tier, excess) > worst_protect.rank):
            worst_protect = _Worst((tier, excess), index, temp, text)

    def against(
        s: GpuSample,
        part: str,
        temp: float,
        limit: float,
        at_text: str,
        limit_name: str,
        *,
        shown_limit: float | None = None,
        protects: bool = False,
    ) -> tuple[bool, bool]:
        """One reading against one limit, considered as a cause: (at or over the limit, below
        it by the hysteresis). shown_limit: the figure the text names, when the limit is a
        margin below it (the slowdown threshold)."""
        at = temp >= limit
        shown = limit if shown_limit is None else shown_limit
        text = (
            f"{s.label} {part} {temp:.1f} °C {at_text if at else 'vs'} {limit_name} {shown:.1f} °C"
        )
        consider(temp - limit, s.index, temp, text, protects=protects)
        return at, temp < limit - hyst

    for s in samples:
        if s.lost:
            protect = True
            protect_clear = False
            hot = True
            cool = False
            consider(math.inf, s.index, None, f"{s.label} ({s.uuid}) lost", protects=True)
            continue
        core, mem, slow = s.core_temp_c, s.mem_temp_c, s.slowdown_temp_c
        if not _known(s, "core_temp_c", core) or not _known(s, "mem_temp_c", mem):
            # A failed reading can neither trigger nor release anything.
            protect_clear = False
            cool = False
        if core is not None:
            at, below = against(s, "core", core, cfg.derate_core_c, ">=", "derate")
            hot = hot or at
            cool = cool and below
            if slow is not None:
                margin = cfg.protect_slowdown_margin_c
                at, below = against(
                    s,
                    "core",
                    core,
                    slow - margin,
                    f"within {margin:.1f} °C of",
                    "its slowdown threshold",
                    shown_limit=slow,
                    protects=True,
                )
                protect = protect or at
                protect_clear = protect_clear and below
        if mem is not None:
            at, below = against(s, "HBM", mem, cfg.protect_mem_c, ">=", "protect", protects=True)
            protect = protect or at
            protect_clear = protect_clear and below
    hot = hot or protect
    cool = cool and protect_clear
    return _Assessment(protect, protect_clear, hot, cool, worst, worst_protect)


def _settled_level(factor: float) -> ThermalLevel:
    return ThermalLevel.NORMAL if factor >= 1.0 - _FULL_EPS else ThermalLevel.DERATE


@dataclass(frozen=True)
class _FactorMove:
    """The factor after one step, the clocks that pace it, and what was done (if anything)."""

    factor: float
    last_cut_s: float | None
    last_step_s: float | None
    cool_since_s: float | None
    action: str | None


@dataclass(frozen=True)
class _LevelMove:
    """The level after one step, PROTECT's release clock, and what was done (if anything)."""

    level: ThermalLevel
    protect_clear_since_s: float | None
    action: str | None


def _restored(factor: float) -> float:
    return 1.0 if factor >= 1.0 - _FULL_EPS else factor


def _cut_while_hot(state: ThermalState, now_s: float, cfg: ThermalPolicyConfig) -> _FactorMove:
    factor, last_cut = state.factor, state.last_cut_s
    onset = state.level is ThermalLevel.NORMAL or last_cut is None
    due = onset or now_s - last_cut >= cfg.step_interval_s
    if factor > cfg.floor_factor and due:
        # A floor of ~1 disables derating.
        new = _restored(max(cfg.floor_factor, factor * cfg.step_factor))
        return _FactorMove(new, now_s, now_s, None, f"derate factor {factor:.2f} -> {new:.2f}")
    if factor <= cfg.floor_factor:
        action = f"derate factor held at floor {factor:.2f}"
    else:
        action = f"derate factor held at {factor:.2f} until the next step"
    return _FactorMove(factor, last_cut, state.last_step_s, None, action)


def _recover_while_cool(state: ThermalState, now_s: float, cfg: ThermalPolicyConfig) -> _FactorMove:
    factor, last_step = state.factor, state.last_step_s
    cool_since = now_s if state.cool_since_s is None else state.cool_since_s
    held = _FactorMove(factor, state.last_cut_s, last_step, cool_since, None)
    # No recovery while PROTECT holds: leaving PROTECT comes first, on its own dwell.
    if factor >= 1.0 or state.level is ThermalLevel.PROTECT:
        return held
    start = cool_since if last_step is None else max(cool_since, last_step)
    if now_s - start >= cfg.dwell_s:
        new = _restored(min(1.0, factor + cfg.recover_step))
        action = f"cool for {now_s - start:.0f} s: derate factor {factor:.2f} -> {new:.2f}"
        return replace(held, factor=new, last_step_s=now_s, action=action)
    waiting = f"cool for {now_s - start:.0f} s of {cfg.dwell_s:.0f} s: factor held at {factor:.2f}"
    return replace(held, action=waiting)


def _hold_in_band(state: ThermalState, cfg: ThermalPolicyConfig) -> _FactorMove:
    action = None
    if state.factor < 1.0:
        action = (
            f"within the hysteresis band: factor held at {state.factor:.2f} "
            f"(release below {cfg.derate_core_c - cfg.hysteresis_c:.1f} °C)"
        )
    return _FactorMove(state.factor, state.last_cut_s, state.last_step_s, None, action)


def _move_factor(
    state: ThermalState, a: _Assessment, now_s: float, cfg: ThermalPolicyConfig
) -> _FactorMove:
    """Cut while hot, restore while cool, hold in the hysteresis band."""
    if a.hot:
        return _cut_while_hot(state, now_s, cfg)
    if a.cool:
        return _recover_while_cool(state, now_s, cfg)
    return _hold_in_band(state, cfg)


def _move_level(
    state: ThermalState, a: _Assessment, factor: float, now_s: float, cfg: ThermalPolicyConfig
) -> _LevelMove:
    """PROTECT has its own release dwell; otherwise the level follows the factor."""
    level = state.level
    if a.protect:
        action = None if level is ThermalLevel.PROTECT else "PROTECT: new admissions realtime only"
        return _LevelMove(ThermalLevel.PROTECT, None, action)
    if level is not ThermalLevel.PROTECT:
        return _LevelMove(_settled_level(factor), state.protect_clear_since_s, None)
    if not a.protect_clear:
        return _LevelMove(level, None, "PROTECT held (within the hysteresis band)")
    clear_since = now_s if state.protect_clear_since_s is None else state.protect_clear_since_s
    held = now_s - clear_since
    if held >= cfg.dwell_s:
        action = f"below the protect band for {held:.0f} s: leave PROTECT"
        return _LevelMove(_settled_level(factor), None, action)
    action = f"below the protect band for {held:.0f} s of {cfg.dwell_s:.0f} s"
    return _LevelMove(level, clear_since, action)


def _governing(state: ThermalState, a: _Assessment) -> _Worst | None:
    """The GPU the reason names: while PROTECT holds without a trigger, the story is about
    its own causes cooling."""
    if state.level is ThermalLevel.PROTECT and not a.protect and a.worst_protect is not None:
        return a.worst_protect
    return a.worst


def step(
    state: ThermalState, samples: Sequence[GpuSample], now_s: float, cfg: ThermalPolicyConfig
) -> ThermalDecision:
    """Advance the policy by one set of samples taken at monotonic time `now_s`."""
    if not samples:
        return ThermalDecision(state, False, "no GPU samples: thermal state held")
    a = _assess(samples, cfg)
    f = _move_factor(state, a, now_s, cfg)
    lv = _move_level(state, a, f.factor, now_s, cfg)
    level = state.level
    since = state.since_s if lv.level is level and state.since_s is not None else now_s
    new_state = ThermalState(
        level=lv.level,
        factor=f.factor,
        since_s=since,
        last_cut_s=f.last_cut_s,
        last_step_s=f.last_step_s,
        cool_since_s=f.cool_since_s,
        protect_clear_since_s=lv.protect_clear_since_s,
    )
    changed = lv.level is not level or f.factor != state.factor
    actions = [x for x in (f.action, lv.action) if x is not None]
    w = _governing(state, a)
    head = w.text if w is not None else "no GPU temperature reported"
    reason = f"{head}: {'; '.join(actions)}" if actions else f"{head}: {lv.level.value}"
    return ThermalDecision(
        state=new_state,
        changed=changed,
        reason=reason,
        gpu_index=w.gpu_index if w is not None else None,
        temp_c=w.temp_c if w is not None else None,
    )


def initial_state(now_s: float) -> ThermalState:
    """NORMAL at full factor, starting at `now_s`."""
    return replace(ThermalState(), since_s=now_s)


def energy_per_token_j(energy_delta_j: float | None, tokens_delta: int) -> float | None:
    """Joules per generated token over an interval; None when there is nothing to divide."""
    if energy_delta_j is None or tokens_delta <= 0 or energy_delta_j < 0:
        return None
    return energy_delta_j / tokens_delta


def energy_delta_j(previous: Sequence[GpuSample], current: Sequence[GpuSample]) -> float | None:
    """Energy used between two sample sets, summed over GPUs matched by UUID.

    A counter that went backwards (driver reload, replay loop) contributes nothing; None
    when no GPU reports energy in both sets.
    """
    before = {s.uuid: s.energy_j for s in previous if s.energy_j is not None}
    total = 0.0
    seen = False
    for s in current:
        prev = before.get(s.uuid)
        if s.energy_j is None or prev is None:
            continue
        seen = True
        if s.energy_j >= prev:
            total += s.energy_j - prev
    return total if seen else None
