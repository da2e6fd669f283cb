"""Walk-forward evaluation of forecasters (pure): forecast error, burst lead time, false alarms,
and the rule that decides whether the LSTM replaces the EWMA baseline."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from appliance.predict.forecaster import Forecaster, horizon_steps
from appliance.predict.signals import LoadSignals, segments


@dataclass(frozen=True, slots=True)
class BurstSpec:
    """A burst: pending rising to threshold after it was below threshold - hysteresis.

    An alarm (the forecast crossing the same way) matches a burst starting at T when the
    alarm is on at some time in [T - max_lead_s, T + late_s]; its lead time is T minus the
    alarm's start, capped at max_lead_s. The hysteresis keeps noise around the threshold
    from counting as many bursts.
    """

    threshold: float
    hysteresis: float = 0.0
    max_lead_s: float = 120.0
    late_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Episode:
    """A time the value stayed at or above threshold: [start_s, end_s)."""

    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class BurstScore:
    """Bursts in the actual series and how the alarms met them."""

    bursts: int
    detected: int
    leads_s: tuple[float, ...]  # one per detected burst: > 0 warned early, < 0 late
    false_alarms: int

    @property
    def median_lead_s(self) -> float | None:
        """Median lead over detected bursts (None when none was detected)."""
        return statistics.median(self.leads_s) if self.leads_s else None


@dataclass(frozen=True, slots=True)
class EvalResult:
    """One forecaster on one trace's held-out part."""

    name: str
    forecasts: int
    mae: float
    rmse: float
    bursts: int
    detected: int
    median_lead_s: float | None
    false_alarms: int
    predict_ms: float  # median wall time of one predict() call


@dataclass(frozen=True, slots=True)
class WalkForward:
    """Forecasts issued at issue_ts_s for issue_ts_s + horizon_s, with what happened."""

    issue_ts_s: tuple[float, ...]
    forecast: tuple[float, ...]
    target: tuple[float, ...]  # actual pending at issue time + horizon
    predict_ms: float


def episodes(
    ts_s: Sequence[float], values: Sequence[float], threshold: float, hysteresis: float = 0.0
) -> list[Episode]:
    """Runs at or above threshold; a new one starts only after dropping below threshold -
    hysteresis. The end of the last run is one step after the series ends."""
    out: list[Episode] = []
    start: float | None = None
    armed = True
    for i, (t, v) in enumerate(zip(ts_s, values, strict=True)):
        if armed and v >= threshold:
            start, armed = t, False
        elif not armed and v < threshold - hysteresis:
            if start is not None:
                out.append(Episode(start, t))
            start, armed = None, True
        if i == len(ts_s) - 1 and start is not None:
            step = ts_s[-1] - ts_s[-2] if len(ts_s) > 1 else 0.0
            out.append(Episode(start, t + step))
    return out


def _in_burst(t: float, bursts: Sequence[Episode]) -> bool:
    return any(b.start_s <= t < b.end_s for b in bursts)


def score_bursts(
    actual_ts_s: Sequence[float],
    actual: Sequence[float],
    issue_ts_s: Sequence[float],
    forecast: Sequence[float],
    spec: BurstSpec,
) -> BurstScore:
    """Match forecast alarms (by issue time) to actual bursts; count leads and false alarms."""
    bursts = episodes(actual_ts_s, actual, spec.threshold, spec.hysteresis)
    alarms = episodes(issue_ts_s, forecast, spec.threshold, spec.hysteresis)
    used: set[int] = set()
    leads: list[float] = []
    for b in bursts:
        lo, hi = b.start_s - spec.max_lead_s, b.start_s + spec.late_s
        match = next((i for i, a in enumerate(alarms) if a.start_s <= hi and a.end_s > lo), None)
        if match is None:
            continue
        used.add(match)
        leads.append(b.start_s - max(alarms[match].start_s, lo))
    # An unmatched alarm raised while a burst is already running is no false alarm: the
    # load it warns of is there.
    false_alarms = sum(
        1 for i, a in enumerate(alarms) if i not in used and not _in_burst(a.start_s, bursts)
    )
    return BurstScore(
        bursts=len(bursts), detected=len(leads), leads_s=tuple(leads), false_alarms=false_alarms
    )


def walk_forward(
    forecaster: Forecaster, series: Sequence[LoadSignals], start_ts_s: float, warmup_steps: int
) -> WalkForward:
    """Forecast at every grid point from start_ts_s on that has warmup_steps of contiguous
    history and a target horizon_s later in the same contiguous run."""
    h = horizon_steps(forecaster.horizon_s, forecaster.step_s)
    issue, fc, target, spent = [], [], [], []
    for seg in segments(series, forecaster.step_s):
        for i in range(max(warmup_steps - 1, 0), len(seg) - h):
            if seg[i].ts_s < start_ts_s:
                continue
            window = seg[max(0, i + 1 - forecaster.window_steps) : i + 1]
            t0 = time.perf_counter()
            fc.append(forecaster.predict(window))
            spent.append(time.perf_counter() - t0)
            issue.append(seg[i].ts_s)
            target.append(seg[i + h].pending)
    return WalkForward(
        issue_ts_s=tuple(issue),
        forecast=tuple(fc),
        target=tuple(target),
        # The median: one GC pause or a cold first call must not stand for every tick.
        predict_ms=1000 * statistics.median(spent) if spent else 0.0,
    )


def evaluate(
    forecaster: Forecaster,
    series: Sequence[LoadSignals],
    start_ts_s: float,
    spec: BurstSpec,
    warmup_steps: int | None = None,
) -> EvalResult:
    """Score one (already fitted) forecaster on the part of series from start_ts_s on."""
    wf = walk_forward(
        forecaster,
        series,
        start_ts_s,
        forecaster.window_steps if warmup_steps is None else warmup_steps,
    )
    errors = [f - y for f, y in zip(wf.forecast, wf.target, strict=True)]
    held = [s for s in series if s.ts_s >= start_ts_s]
    bursts = score_bursts(
        [s.ts_s for s in held], [s.pending for s in held], wf.issue_ts_s, wf.forecast, spec
    )
    n = len(errors)
    return EvalResult(
        name=forecaster.name,
        forecasts=n,
        mae=sum(abs(e) for e in errors) / n if n else math.nan,
        rmse=math.sqrt(sum(e * e for e in errors) / n) if n else math.nan,
        bursts=bursts.bursts,
        detected=bursts.detected,
        median_lead_s=bursts.median_lead_s,
        false_alarms=bursts.false_alarms,
        predict_ms=wf.predict_ms,
    )


def median_result(results: Sequence[EvalResult]) -> EvalResult:
    """Field-wise median of several runs of one forecaster (e.g. training seeds)."""
    if not results:
        raise ValueError("median_result of no results")
    leads = [r.median_lead_s for r in results if r.median_lead_s is not None]
    return EvalResult(
        name=results[0].name,
        forecasts=results[0].forecasts,
        mae=statistics.median(r.mae for r in results),
        rmse=statistics.median(r.rmse for r in results),
        bursts=results[0].bursts,
        detected=round(statistics.median(r.detected for r in results)),
        median_lead_s=statistics.median(leads) if leads else None,
        false_alarms=round(statistics.median(r.false_alarms for r in results)),
        predict_ms=statistics.median(r.predict_ms for r in results),
    )


@dataclass(frozen=True, slots=True)
class DecisionRule:
    """When the LSTM replaces EWMA: it must win on error and lose nothing on bursts."""

    min_bursts: int = 3  # fewer held-out bursts: nothing to warn of, nothing to judge
    mae_margin: float = 0.05  # LSTM MAE <= (1 - margin) * EWMA MAE
    extra_false_alarms: int = 1  # LSTM false alarms <= EWMA's + this


def decide(results: Sequence[EvalResult], rule: DecisionRule | None = None) -> tuple[bool, str]:
    """Enable the LSTM on this trace? Needs results named "ewma" and "lstm" (held-out part).

    Enabled only when all hold: at least min_bursts bursts; LSTM MAE below EWMA's by
    mae_margin; LSTM detects no fewer bursts and its median lead is no shorter; its false
    alarms exceed EWMA's by at most extra_false_alarms.
    """
    rule = rule or DecisionRule()
    by_name = {r.name: r for r in results}
    ewma, lstm = by_name.get("ewma"), by_name.get("lstm")
    if ewma is None or lstm is None:
        return False, "no LSTM/EWMA comparison: keep EWMA"
    if lstm.bursts < rule.min_bursts:
        return False, f"only {lstm.bursts} bursts held out (< {rule.min_bursts}): keep EWMA"
    why: list[str] = []
    if not lstm.mae <= (1 - rule.mae_margin) * ewma.mae:
        why.append(f"MAE {lstm.mae:.2f} not {rule.mae_margin:.0%} below EWMA's {ewma.mae:.2f}")
    if lstm.detected < ewma.detected:
        why.append(f"detects {lstm.detected}/{lstm.bursts} bursts vs EWMA {ewma.detected}")
    el, ll = ewma.median_lead_s, lstm.median_lead_s
    if el is not None and (ll is None or ll < el):
        why.append(f"median lead {_s(ll)} < EWMA's {_s(el)}")
    if lstm.false_alarms > ewma.false_alarms + rule.extra_false_alarms:
        why.append(f"{lstm.false_alarms} false alarms vs EWMA {ewma.false_alarms}")
    if why:
        return False, "keep EWMA: LSTM " + "; ".join(why)
    return True, (
        f"enable LSTM: MAE {lstm.mae:.2f} vs {ewma.mae:.2f}, lead {_s(ll)} vs {_s(el)}, "
        f"detected {lstm.detected} vs {ewma.detected}/{lstm.bursts}, "
        f"false alarms {lstm.false_alarms} vs {ewma.false_alarms}"
    )


def _s(v: float | None) -> str:
    return "none" if v is None else f"{v:+.0f} s"
