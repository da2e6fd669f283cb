"""Benchmark analysis (pure): the knee, the Pareto front and a weighted score of a sweep.

The knee is where one more sequence stops buying throughput: the smallest level from which
no later level pays at least `min_gain_ratio` of a single sequence's throughput for each
sequence added. Comparing against *any* later level (not just the next) makes a noisy dip
or a non-monotone curve harmless, and `noise_ratio` keeps a few per cent of jitter from
looking like a gain. Where a latency SLO is given the knee is also capped at the last level
before the SLO first breaks. Curvature methods (Kneedle) depend on how the axes are scaled;
a gain per sequence does not.

The three-phase tuning (baseline at 8, sweep up to the knee, recommend a limit for the
controller) is planned here and run by the bench runner: `next_tuning_level` says what to
measure next, `tuning_result` what the measurements mean.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from appliance.domain.limits import SLO_RANGE_TEXT, Problem, in_slo_range, raise_problems

LATENCY_FIELDS = ("ttft_p99_s", "tpot_p99_s", "e2e_p99_s")
BASELINE_CONCURRENCY = 8


@dataclass(frozen=True)
class SweepPoint:
    """What one concurrency level delivered."""

    concurrency: int
    output_tok_s: float
    request_per_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    e2e_p99_s: float
    utilisation: float | None = None  # 0..1, where telemetry has it
    energy_j_per_token: float | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.concurrency < 1:
            problems.append(f"concurrency: must be >= 1, got {self.concurrency}")
        for f in fields(self):
            if f.name == "concurrency":
                continue
            value = getattr(self, f.name)
            if value is None:
                continue
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                problems.append(f"{f.name}: must be a finite number >= 0, got {value!r}")
        if self.utilisation is not None and self.utilisation > 1:
            problems.append(f"utilisation: must be in [0, 1], got {self.utilisation}")
        if problems:
            raise ValueError(
                f"sweep point at concurrency {self.concurrency}: " + "; ".join(problems)
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True)
class Slo:
    """Latency objectives for P99s; None means not constrained."""

    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None
    e2e_p99_s: float | None = None

    def __post_init__(self) -> None:
        raise_problems(
            Problem(f"slo.{name}", f"must be in {SLO_RANGE_TEXT} or None, got {value}")
            for name in LATENCY_FIELDS
            if (value := getattr(self, name)) is not None and not in_slo_range(value)
        )

    def breaches(self, point: SweepPoint) -> list[str]:
        """Each objective the point breaks, as text ('p99 TTFT 2.3 s > 1.5 s')."""
        out = []
        for name, label in zip(LATENCY_FIELDS, ("TTFT", "TPOT", "E2E"), strict=True):
            limit = getattr(self, name)
            value = getattr(point, name)
            if limit is not None and value > limit:
                out.append(f"p99 {label} {_fmt_s(value)} > {_fmt_s(limit)}")
        return out

    def meets(self, point: SweepPoint) -> bool:
        """True when the point keeps every objective."""
        return not self.breaches(point)


@dataclass(frozen=True)
class Knee:
    """The recommended ceiling of a sweep and why."""

    concurrency: int
    reason: str
    throughput_knee: int  # where throughput stops paying, SLO aside
    slo_limit: int | None  # last level before the SLO first breaks (None: never breaks)
    slo_limited: bool  # the SLO, not the throughput curve, set the knee
    still_rising: bool  # throughput still paid at the largest level: sweep higher

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True)
class ScoreWeights:
    """Weights of the score; they need not sum to 1 (they are normalised)."""

    latency: float = 0.4
    throughput: float = 0.3
    utilisation: float = 0.2
    energy: float = 0.1

    def __post_init__(self) -> None:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        problems = [
            Problem(f"weights.{name}", f"must be a finite number >= 0, got {value}")
            for name, value in values.items()
            if not (math.isfinite(value) and value >= 0)
        ]
        if not problems and sum(values.values()) <= 0:
            problems.append(Problem("weights", "at least one weight must be > 0"))
        raise_problems(problems)


@dataclass(frozen=True)
class Score:
    """One level's score in [0, 1] and its normalised parts (None where not used)."""

    concurrency: int
    score: float
    latency: float | None
    throughput: float | None
    utilisation: float | None
    energy: float | None


@dataclass(frozen=True)
class ScoreResult:
    """Scores of a sweep, the best level, and which metrics took part."""

    scores: tuple[Score, ...]
    best_concurrency: int
    weights_used: dict[str, float]  # renormalised over the metrics present
    dropped: tuple[str, ...]  # metrics left out because some level lacks them

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        out = asdict(self)
        out["dropped"] = list(self.dropped)
        return out


@dataclass(frozen=True)
class TuningResult:
    """The three-phase tuning: the baseline, every level measured, the knee, the limit."""

    baseline: SweepPoint | None  # None when the sweep never reached the baseline level
    points: tuple[SweepPoint, ...]
    knee: Knee
    # None when throughput still rose at the largest level tried: any ceiling would cap it.
    recommended_limit: int | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "baseline": self.baseline.to_dict() if self.baseline else None,
            "points": [p.to_dict() for p in self.points],
            "knee": self.knee.to_dict(),
            "recommended_limit": self.recommended_limit,
            "reason": self.reason,
        }


def _fmt_s(seconds: float) -> str:
    return f"{seconds * 1000:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def sorted_points(points: Iterable[SweepPoint]) -> list[SweepPoint]:
    """Points by concurrency; an empty sweep or a repeated level is an error."""
    pts = sorted(points, key=lambda p: p.concurrency)
    if not pts:
        raise ValueError("points: need at least one sweep point")
    for a, b in itertools.pairwise(pts):
        if a.concurrency == b.concurrency:
            raise ValueError(f"points: concurrency {a.concurrency} appears more than once")
    return pts


def throughput_knee(
    points: Sequence[SweepPoint], min_gain_ratio: float = 0.1, noise_ratio: float = 0.03
) -> tuple[int, bool]:
    """(knee level, still rising) from output throughput alone; see the module doc."""
    if not 0 < min_gain_ratio < 1:
        raise ValueError(f"min_gain_ratio: must be in (0, 1), got {min_gain_ratio}")
    if not 0 <= noise_ratio < 1:
        raise ValueError(f"noise_ratio: must be in [0, 1), got {noise_ratio}")
    pts = sorted_points(points)
    first = pts[0]
    # What one sequence buys at the lightest load: the yardstick for "worth one more".
    per_seq = first.output_tok_s / first.concurrency
    if per_seq <= 0:
        # Nothing came out at the lightest level: judge gains against the best level instead.
        best = max(pts, key=lambda p: p.output_tok_s)
        per_seq = best.output_tok_s / best.concurrency
    if per_seq <= 0:
        return first.concurrency, False
    threshold = min_gain_ratio * per_seq
    for i, p in enumerate(pts):
        floor_tok_s = p.output_tok_s * (1 + noise_ratio)
        best_gain = max(
            (
                (q.output_tok_s - floor_tok_s) / (q.concurrency - p.concurrency)
                for q in pts[i + 1 :]
            ),
            default=-math.inf,
        )
        if best_gain < threshold:
            # Reaching the last level means the step into it still paid: the curve had
            # not flattened yet.
            return p.concurrency, i == len(pts) - 1 and len(pts) > 1
    raise AssertionError("unreachable: the last point has no later level and qualifies")


def find_knee(
    points: Sequence[SweepPoint],
    slo: Slo | None = None,
    min_gain_ratio: float = 0.1,
    noise_ratio: float = 0.03,
) -> Knee:
    """The knee of a sweep: throughput stops paying per sequence, or the SLO breaks."""
    pts = sorted_points(points)
    tk, rising = throughput_knee(pts, min_gain_ratio, noise_ratio)
    slo_limit: int | None = None
    first_breach: SweepPoint | None = None
    if slo is not None:
        for p in pts:
            if not slo.meets(p):
                first_breach = p
                break
            slo_limit = p.concurrency
    one_seq_tok_s = pts[0].output_tok_s / pts[0].concurrency
    gain_text = f"{min_gain_ratio:.0%} of one sequence's {one_seq_tok_s:.3g} tok/s"
    if first_breach is not None:
        breach_text = ", ".join(slo.breaches(first_breach)) if slo else ""
        if slo_limit is None:
            return Knee(
                pts[0].concurrency,
                f"the SLO breaks even at the lowest level {first_breach.concurrency} "
                f"({breach_text})",
                tk,
                None,
                True,
                False,
            )
        if slo_limit < tk:
            return Knee(
                slo_limit,
                f"the SLO breaks at {first_breach.concurrency} ({breach_text}); throughput "
                f"would still pay up to {tk}",
                tk,
                slo_limit,
                True,
                False,
            )
    if len(pts) == 1:
        reason = f"only one level measured ({tk})"
    elif rising:
        reason = (
            f"throughput still rising at the largest level {tk} "
            f"({pts[-1].output_tok_s:.3g} tok/s): sweep higher"
        )
    elif tk == pts[0].concurrency:
        reason = f"no level above {tk} adds {gain_text} per added sequence (flat curve)"
    else:
        p = next(q for q in pts if q.concurrency == tk)
        reason = (
            f"{p.output_tok_s:.3g} tok/s at {tk}; no higher level adds {gain_text} "
            "per added sequence"
        )
    return Knee(tk, reason, tk, slo_limit, False, rising)


def _latency(point: SweepPoint, latency_field: str) -> float:
    if latency_field not in LATENCY_FIELDS:
        raise ValueError(f"latency_field: must be one of {LATENCY_FIELDS}, got {latency_field!r}")
    return float(getattr(point, latency_field))


def pareto_front(
    points: Sequence[SweepPoint], latency_field: str = "ttft_p99_s"
) -> list[SweepPoint]:
    """Levels no other level beats on throughput, P99 latency and energy/token at once.

    Energy takes part only when every level has it (a missing value cannot be compared).
    """
    pts = sorted_points(points)
    use_energy = all(p.energy_j_per_token is not None for p in pts)

    def objectives(p: SweepPoint) -> tuple[float, ...]:
        # All minimised: throughput enters negated.
        obj = (-p.output_tok_s, _latency(p, latency_field))
        if use_energy:
            assert p.energy_j_per_token is not None
            obj += (p.energy_j_per_token,)
        return obj

    def dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
        return all(x <= y for x, y in zip(a, b, strict=True)) and a != b

    objs = [objectives(p) for p in pts]
    return [
        p
        for p, o in zip(pts, objs, strict=True)
        if not any(dominates(other, o) for other in objs if other is not o)
    ]


def _normalise(values: Sequence[float], higher_is_better: bool) -> list[float]:
    lo, hi = min(values), max(values)
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        return [1.0] * len(values)  # every level is equally good on this metric
    if higher_is_better:
        return [(v - lo) / (hi - lo) for v in values]
    return [(hi - v) / (hi - lo) for v in values]


def weighted_score(
    points: Sequence[SweepPoint],
    weights: ScoreWeights | None = None,
    latency_field: str = "ttft_p99_s",
) -> ScoreResult:
    """Score each level in [0, 1]: metrics min-max normalised over the sweep, then weighted.

    A metric some level lacks (utilisation, energy) is dropped and the other weights are
    renormalised, so a sweep without telemetry still ranks on latency and throughput.
    """
    w = weights or ScoreWeights()
    pts = sorted_points(points)
    parts: dict[str, list[float] | None] = {
        "latency": _normalise([_latency(p, latency_field) for p in pts], higher_is_better=False),
        "throughput": _normalise([p.output_tok_s for p in pts], higher_is_better=True),
        "utilisation": None,
        "energy": None,
    }
    dropped = []
    if all(p.utilisation is not None for p in pts):
        parts["utilisation"] = _normalise([p.utilisation or 0.0 for p in pts], True)
    else:
        dropped.append("utilisation")
    if all(p.energy_j_per_token is not None for p in pts):
        parts["energy"] = _normalise([p.energy_j_per_token or 0.0 for p in pts], False)
    else:
        dropped.append("energy")
    raw = {name: getattr(w, name) for name, values in parts.items() if values is not None}
    total = sum(raw.values())
    if total <= 0:
        raise ValueError(
            "weights: every metric with a weight > 0 is missing from the sweep "
            f"(missing: {', '.join(dropped)})"
        )
    used = {name: value / total for name, value in raw.items()}
    scores = []
    for i, p in enumerate(pts):
        comp = {name: (values[i] if values is not None else None) for name, values in parts.items()}
        s = sum(used[name] * (comp[name] or 0.0) for name in used)
        scores.append(
            Score(
                p.concurrency,
                s,
                comp["latency"],
                comp["throughput"],
                comp["utilisation"],
                comp["energy"],
            )
        )
    # Ties go to the lower level: the same score for fewer sequences is the cheaper choice.
    best = max(scores, key=lambda s: (s.score, -s.concurrency))
    return ScoreResult(tuple(scores), best.concurrency, used, tuple(dropped))


def next_tuning_level(
    points: Sequence[SweepPoint],
    slo: Slo | None = None,
    max_concurrency: int = 256,
    baseline: int = BASELINE_CONCURRENCY,
    min_gain_ratio: float = 0.1,
    noise_ratio: float = 0.03,
) -> int | None:
    """The next level to measure in the three-phase tuning, or None when done.

    Phase 1 measures the baseline. Phase 2 doubles upward while the SLO holds and throughput
    still pays, stopping one level past the knee (the level that shows it has flattened); if
    the baseline already breaks the SLO it halves downward to the first level that keeps it.
    """
    if max_concurrency < 1:
        raise ValueError(f"max_concurrency: must be >= 1, got {max_concurrency}")
    baseline = min(baseline, max_concurrency)
    if not points:
        return baseline
    pts = sorted_points(points)
    seen = {p.concurrency for p in pts}
    if baseline not in seen:
        return baseline
    base_point = next(p for p in pts if p.concurrency == baseline)
    if slo is not None and not slo.meets(base_point):
        below = [p for p in pts if p.concurrency < baseline]
        if any(slo.meets(p) for p in below):
            return None
        lowest = min(seen)
        return lowest // 2 if lowest > 1 else None
    above = [p for p in pts if p.concurrency >= baseline]
    top = above[-1]
    if slo is not None and not slo.meets(top):
        return None
    knee = find_knee(above, slo, min_gain_ratio, noise_ratio)
    if knee.throughput_knee < top.concurrency:
        return None  # a level past the knee is measured: the curve has shown its bend
    nxt = min(max_concurrency, top.concurrency * 2)
    return None if nxt in seen or nxt <= top.concurrency else nxt


def next_extension(
    points: Sequence[SweepPoint],
    extend_to: int | None,
    slo: Slo | None = None,
    min_gain_ratio: float = 0.1,
    noise_ratio: float = 0.03,
) -> int | None:
    """The level to add to a sweep whose throughput still rises at its largest level.

    A fixed list of levels (say 1 to 16) cannot know how far a box scales: an H200 serves
    well at 64 to 256 sequences. So a sweep still rising at its top doubles upward, up to
    extend_to (the engine's max_num_seqs, above which it cannot run more), until the curve
    bends or the SLO breaks. None: stop (bent, SLO broken, nothing to extend to).
    """
    if extend_to is None or not points:
        return None
    pts = sorted_points(points)
    top = pts[-1].concurrency
    if top >= extend_to or not find_knee(pts, slo, min_gain_ratio, noise_ratio).still_rising:
        return None
    return min(extend_to, top * 2)


def tuning_result(
    points: Sequence[SweepPoint],
    slo: Slo | None = None,
    min_limit: int = 1,
    max_limit: int = 256,
    baseline: int = BASELINE_CONCURRENCY,
    min_gain_ratio: float = 0.1,
    noise_ratio: float = 0.03,
) -> TuningResult:
    """What the tuning found: the knee, and the limit to hand to the controller."""
    if min_limit < 1 or max_limit < min_limit:
        raise ValueError(
            f"min_limit/max_limit: need 1 <= min_limit <= max_limit, got {min_limit}, {max_limit}"
        )
    pts = sorted_points(points)
    knee = find_knee(pts, slo, min_gain_ratio, noise_ratio)
    base_point = next((p for p in pts if p.concurrency == baseline), None)
    if knee.still_rising:
        # The box was not saturated at the largest level: a ceiling there would cap it.
        reason = f"no ceiling: {knee.reason}"
        return TuningResult(base_point, tuple(pts), knee, None, reason)
    limit = min(max_limit, max(min_limit, knee.concurrency))
    reason = f"knee at {knee.concurrency}: {knee.reason}"
    if limit != knee.concurrency:
        reason += f"; clamped to [{min_limit}, {max_limit}] = {limit}"
    return TuningResult(base_point, tuple(pts), knee, limit, reason)
