"""Synthetic bursty load traces (pure, seeded): Poisson background plus periodic and random
bursts, served by a toy engine whose utilisation, memory, temperature and throughput follow
its running requests. Rows have the daemon's metric-history shape (raw, every step_s)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Burst:
    """Extra arrivals: linear ramp up over ramp_s to peak_rps, hold_s flat, ramp down."""

    start_s: float
    ramp_s: float
    hold_s: float
    peak_rps: float

    def rate_rps(self, t_s: float) -> float:
        """The burst's extra arrival rate at t_s."""
        dt = t_s - self.start_s
        down_s = self.ramp_s / 2
        if dt < 0 or dt > self.ramp_s + self.hold_s + down_s:
            return 0.0
        if dt < self.ramp_s:
            return self.peak_rps * dt / self.ramp_s
        if dt < self.ramp_s + self.hold_s:
            return self.peak_rps
        return self.peak_rps * (1 - (dt - self.ramp_s - self.hold_s) / down_s)


@dataclass(frozen=True, slots=True)
class TraceSpec:
    """What a synthetic trace holds; rates in requests per second."""

    name: str
    duration_s: float = 3 * 3600.0
    step_s: float = 5.0
    background_rps: float = 0.6
    # Slow swing of the background (fraction of it), e.g. a working day compressed.
    diurnal_amplitude: float = 0.0
    diurnal_period_s: float = 3 * 3600.0
    periodic_every_s: float = 0.0  # 0: no periodic bursts
    periodic_jitter_s: float = 0.0
    periodic_ramp_s: float = 60.0
    periodic_hold_s: float = 60.0
    periodic_peak_rps: float = 1.8
    random_mean_gap_s: float = 0.0  # 0: no random bursts
    random_peak_rps: tuple[float, float] = (1.0, 2.2)
    random_ramp_s: tuple[float, float] = (30.0, 90.0)
    random_hold_s: tuple[float, float] = (20.0, 90.0)


@dataclass(frozen=True, slots=True)
class EngineModel:
    """A toy serving engine: throughput saturates with batch size, heat lags power."""

    max_running: int = 16  # the concurrency limit; more requests queue
    peak_tokens_per_s: float = 400.0
    half_batch: float = 6.0  # running requests at which throughput is half its peak
    mean_tokens: float = 150.0  # generated tokens per request (exponential)
    idle_power_w: float = 80.0
    max_power_w: float = 700.0
    ambient_c: float = 30.0
    c_per_w: float = 0.08  # steady-state rise per watt
    thermal_tau_s: float = 45.0


SPECS: dict[str, TraceSpec] = {
    "periodic": TraceSpec(name="periodic", periodic_every_s=300.0, periodic_jitter_s=20.0),
    "random": TraceSpec(name="random", random_mean_gap_s=420.0),
    "mixed": TraceSpec(
        name="mixed",
        background_rps=0.5,
        diurnal_amplitude=0.6,
        periodic_every_s=600.0,
        periodic_jitter_s=40.0,
        periodic_ramp_s=90.0,
        periodic_peak_rps=1.6,
        random_mean_gap_s=900.0,
    ),
    "steady": TraceSpec(name="steady", background_rps=1.2),
}


def _bursts(spec: TraceSpec, rng: random.Random) -> list[Burst]:
    out: list[Burst] = []
    if spec.periodic_every_s > 0:
        t = spec.periodic_every_s / 2
        while t < spec.duration_s:
            jitter = rng.uniform(-spec.periodic_jitter_s, spec.periodic_jitter_s)
            out.append(
                Burst(
                    t + jitter, spec.periodic_ramp_s, spec.periodic_hold_s, spec.periodic_peak_rps
                )
            )
            t += spec.periodic_every_s
    if spec.random_mean_gap_s > 0:
        t = rng.expovariate(1 / spec.random_mean_gap_s)
        while t < spec.duration_s:
            out.append(
                Burst(
                    t,
                    rng.uniform(*spec.random_ramp_s),
                    rng.uniform(*spec.random_hold_s),
                    rng.uniform(*spec.random_peak_rps),
                )
            )
            t += rng.expovariate(1 / spec.random_mean_gap_s)
    return out


def _poisson(rng: random.Random, mean: float) -> int:
    # Knuth's method: the means here are a few per second at most.
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def synth_rows(
    spec: TraceSpec, seed: int = 0, engine: EngineModel | None = None, start_ts_s: float = 0.0
) -> list[dict[str, Any]]:
    """Simulate the trace at 1 s resolution and sample a raw history row every step_s."""
    eng = engine or EngineModel()
    rng = random.Random(seed)
    bursts = _bursts(spec, rng)
    queue: list[float] = []  # tokens each waiting request will generate
    running: list[float] = []  # tokens each running request still has to generate
    temp_c = eng.ambient_c + eng.idle_power_w * eng.c_per_w
    rows: list[dict[str, Any]] = []
    tokens_acc = util_acc = 0.0
    ticks_in_row = 0
    step_ticks = max(1, round(spec.step_s))
    for t in range(int(spec.duration_s)):
        diurnal = 1 + spec.diurnal_amplitude * math.sin(2 * math.pi * t / spec.diurnal_period_s)
        rate = spec.background_rps * diurnal + sum(b.rate_rps(t) for b in bursts)
        queue.extend(rng.expovariate(1 / eng.mean_tokens) + 1 for _ in range(_poisson(rng, rate)))
        while queue and len(running) < eng.max_running:
            running.append(queue.pop(0))
        r = len(running)
        total_tps = eng.peak_tokens_per_s * r / (r + eng.half_batch) if r else 0.0
        if r:
            per_seq = total_tps / r
            running = [left - per_seq for left in running]
            running = [left for left in running if left > 0]
        util = 100 * (1 - math.exp(-r / 3)) if r else 0.0
        util = min(100.0, max(0.0, util + rng.gauss(0, 2)))
        power_w = eng.idle_power_w + (eng.max_power_w - eng.idle_power_w) * util / 100
        target_c = eng.ambient_c + power_w * eng.c_per_w
        temp_c += (target_c - temp_c) / eng.thermal_tau_s
        tokens_acc += total_tps
        util_acc += util
        ticks_in_row += 1
        if ticks_in_row == step_ticks:
            fill = min(1.0, len(running) / eng.max_running)
            rows.append(
                {
                    "ts_s": start_ts_s + t + 1 - step_ticks,
                    "resolution_s": 0,
                    "gpu_util_pct": round(util_acc / ticks_in_row, 2),
                    "mem_used_ratio": round(0.5 + 0.45 * fill + rng.gauss(0, 0.005), 4),
                    "core_temp_c_max": round(temp_c + rng.gauss(0, 0.3), 1),
                    "queued": len(queue),
                    "in_flight": len(running),
                    "tokens_per_s": round(tokens_acc / ticks_in_row, 1),
                }
            )
            tokens_acc = util_acc = 0.0
            ticks_in_row = 0
    return rows
