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
        problems = []
        if not 0.0 < self.step_factor < 1.0:
            problems.append(f"step_factor must be in (0, 1), got {self.step_factor}")
        if not 0.0 < self.floor_factor <= 1.0:
            problems.append(f"floor_factor must be in (0, 1], got {self.floor_factor}")
        if not 0.0 < self.recover_step <= 1.0:
            problems.append(f"recover_step must be in (0, 1], got {self.recover_step}")
        if not self.hysteresis_c > 0.0:
            problems.append(f"hysteresis_c must be > 0, got {self.hysteresis_c}")
        if not self.dwell_s >= 0.0:
            problems.append(f"dwell_s must be >= 0, got {self.dwell_s}")
        if not self.step_interval_s > 0.0:
            problems.append(f"step_interval_s must be > 0, got {self.step_interval_s}")
        if not self.protect_slowdown_margin_c >= 0.0:
            problems.append(
                f"protect_slowdown_margin_c must be >= 0, got {self.protect_slowdown_margin_c}"
            )
        if problems:
            raise ValueError("; ".join(problems))


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
            hot_core = core >= cfg.derate_core_c
            hot = hot or hot_core
            cool = cool and core < cfg.derate_core_c - hyst
            consider(
                core - cfg.derate_core_c,
                s.index,
                core,
                f"{s.label} core {core:.1f} °C "
                + (">=" if hot_core else "vs")
                + f" derate {cfg.derate_core_c:.1f} °C",
            )
            if slow is not None:
                near = slow - cfg.protect_slowdown_margin_c
                at_slow = core >= near
                protect = protect or at_slow
                protect_clear = protect_clear and core < near - hyst
                consider(
                    core - near,
                    s.index,
                    core,
                    f"{s.label} core {core:.1f} °C "
                    + (f"within {cfg.protect_slowdown_margin_c:.1f} °C of" if at_slow else "vs")
                    + f" its slowdown threshold {slow:.1f} °C",
                    protects=True,
                )
        if mem is not None:
            hot_mem = mem >= cfg.protect_mem_c
            protect = protect or hot_mem
            protect_clear = protect_clear and mem < cfg.protect_mem_c - hyst
            consider(
                mem - cfg.protect_mem_c,
                s.index,
                mem,
                f"{s.label} HBM {mem:.1f} °C "
                + (">=" if hot_mem else "vs")
                + f" protect {cfg.protect_mem_c:.1f} °C",
                protects=True,
            )
    hot = hot or protect
    cool = cool and protect_clear
    return _Assessment(protect, protect_clear, hot, cool, worst, worst_protect)


def _settled_level(factor: float) -> ThermalLevel:
    return ThermalLevel.NORMAL if factor >= 1.0 - _FULL_EPS else ThermalLevel.DERATE


def step(
    state: ThermalState, samples: Sequence[GpuSample], now_s: float, cfg: ThermalPolicyConfig
) -> ThermalDecision:
    """Advance the policy by one set of samples taken at monotonic time `now_s`."""
    if not samples:
        return ThermalDecision(state, False, "no GPU samples: thermal state held")

    a = _assess(samples, cfg)
    level = state.level
    factor = state.factor
    last_cut, last_step = state.last_cut_s, state.last_step_s
    cool_since = state.cool_since_s
    actions: list[str] = []

    # The factor: cut while hot, restore while cool, hold in the hysteresis band.
    if a.hot:
        cool_since = None
        onset = level is ThermalLevel.NORMAL or last_cut is None
        due = onset or now_s - last_cut >= cfg.step_interval_s
        if factor > cfg.floor_factor and due:
            new = max(cfg.floor_factor, factor * cfg.step_factor)
            new = 1.0 if new >= 1.0 - _FULL_EPS else new  # a floor of ~1 disables derating
            actions.append(f"derate factor {factor:.2f} -> {new:.2f}")
            factor, last_cut, last_step = new, now_s, now_s
        elif factor <= cfg.floor_factor:
            actions.append(f"derate factor held at floor {factor:.2f}")
        else:
            actions.append(f"derate factor held at {factor:.2f} until the next step")
    elif a.cool:
        if cool_since is None:
            cool_since = now_s
        # No recovery while PROTECT holds: leaving PROTECT comes first, on its own dwell.
        if factor < 1.0 and level is not ThermalLevel.PROTECT:
            start = cool_since if last_step is None else max(cool_since, last_step)
            if now_s - start >= cfg.dwell_s:
                new = min(1.0, factor + cfg.recover_step)
                new = 1.0 if new >= 1.0 - _FULL_EPS else new
                actions.append(
                    f"cool for {now_s - start:.0f} s: derate factor {factor:.2f} -> {new:.2f}"
                )
                factor, last_step = new, now_s
            else:
                actions.append(
                    f"cool for {now_s - start:.0f} s of {cfg.dwell_s:.0f} s: factor held "
                    f"at {factor:.2f}"
                )
    else:
        cool_since = None
        if factor < 1.0:
            actions.append(
                f"within the hysteresis band: factor held at {factor:.2f} "
                f"(release below {cfg.derate_core_c - cfg.hysteresis_c:.1f} °C)"
            )

    # The level: PROTECT has its own release dwell; otherwise it follows the factor.
    protect_clear_since = state.protect_clear_since_s
    new_level = level
    if a.protect:
        protect_clear_since = None
        new_level = ThermalLevel.PROTECT
        if level is not ThermalLevel.PROTECT:
            actions.append("PROTECT: new admissions realtime only")
    elif level is ThermalLevel.PROTECT:
        if a.protect_clear:
            if protect_clear_since is None:
                protect_clear_since = now_s
            held = now_s - protect_clear_since
            if held >= cfg.dwell_s:
                new_level = _settled_level(factor)
                protect_clear_since = None
                actions.append(f"below the protect band for {held:.0f} s: leave PROTECT")
            else:
                actions.append(f"below the protect band for {held:.0f} s of {cfg.dwell_s:.0f} s")
        else:
            protect_clear_since = None
            actions.append("PROTECT held (within the hysteresis band)")
    else:
        new_level = _settled_level(factor)

    since = state.since_s if new_level is level and state.since_s is not None else now_s
    new_state = ThermalState(
        level=new_level,
        factor=factor,
        since_s=since,
        last_cut_s=last_cut,
        last_step_s=last_step,
        cool_since_s=cool_since,
        protect_clear_since_s=protect_clear_since,
    )
    changed = new_level is not level or factor != state.factor
    # While PROTECT holds without a trigger, the story is about its own causes cooling.
    w = a.worst
    if level is ThermalLevel.PROTECT and not a.protect and a.worst_protect is not None:
        w = a.worst_protect
    head = w.text if w is not None else "no GPU temperature reported"
    reason = f"{head}: {'; '.join(actions)}" if actions else f"{head}: {new_level.value}"
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
