"""Goodput on loads that change shape, replayed from a trace: the controller in auto vs
unbounded admission vs the best static limit, that best found over the whole trace (an oracle).

A trace (bench/traces/*.json) is a list of segments, each with a duration, an arrival rate as
a multiple of the box's measured chat capacity (constant, or a linear ramp to `rate_x_end`),
Poisson or bursty arrivals, a prompt length in tokens, and optionally a simulated-GPU fault
(hot_room) and CPU-burning processes beside the engine over the segment (the box's compute
slows, as a throttled GPU's clocks would). Rates are multiples of capacity so one trace means
the same on a 2-core CPU box and on an H200.

Goodput = requests that met the SLO (TTFT <= --slo-ttft-s and TPOT <= --slo-tpot-s, per
request, from the client's side) per second of trace. Every arm runs the same arrivals (one
seed per run) on one daemon, switched with PUT /admin/controller:

  controller     {"mode": "auto"}: the AIMD count limit and the prefill budget
  unbounded      manual limit 4096: every request goes to the engine (vLLM's own queue)
  static:N       manual limit N, for each N of --levels: run once (seed 0) over the whole
                 trace; the best is the oracle's static limit, then run for the other seeds

Each cell is run --runs times (seeds 0..runs-1); the table gives medians and min-max. A
seed's arms run in an order rotated by the seed (seed_order), so no arm always follows
another. Each run's prompts carry a tag of their own (goodput.run_tag): the arms of a seed
replay the same prompts, and vLLM's prefix cache would otherwise give every arm after the
first the prefill of prompts an earlier arm served. Each run records its prefix-cache hit
ratio.

    .venv/bin/python bench/goodput_trace.py --start --traces phase_change,diurnal,thermal \
        [--runs 3] [--levels 2,4,8,16,32] [--markdown docs/benchmarks.md] \
        [--json-out docs/bench-goodput-traces.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from appliance.bench_runner import (  # noqa: E402
    BenchSettings,
    RequestSample,
    Target,
    _prompt_tokens,
    connect,
    document_prompt,
    run_sweep,
    stream_chat,
)
from appliance.client import AdminClient, AdminError  # noqa: E402
from bench.goodput import (  # noqa: E402
    ARRIVALS,
    UNBOUNDED_LIMIT,
    Daemon,
    GoodputSlo,
    _load_session,
    arrival_times,
    run_tag,
    settle,
)
from bench.report import MODEL_DIR, add_daemon_args, publish_doc, start_burner, stop_burners  # noqa: E402

TRACES_DIR = ROOT / "bench" / "traces"
FAULTS = ("hot_room",)
MAX_PROMPT_TOKENS = 1900  # the bench daemon's context is 2048 tokens, answers included

# -- traces (pure) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """A stretch of a trace with one shape of load."""

    duration_s: float
    rate_x: float  # arrivals per second, as a multiple of the measured chat capacity
    prompt_tokens: int
    rate_x_end: float | None = None  # a linear ramp from rate_x to this; None: constant
    arrival: str = "poisson"
    fault: str | None = None  # a simulated-GPU fault over the whole segment
    fault_delta_c: float = 10.0
    slowdown_procs: int = 0  # CPU-burning processes beside the engine over the segment

    def rate_at(self, t_s: float) -> float:
        """The rate multiple t_s into the segment."""
        if self.rate_x_end is None:
            return self.rate_x
        return self.rate_x + (self.rate_x_end - self.rate_x) * t_s / self.duration_s


@dataclass(frozen=True)
class Trace:
    name: str
    description: str
    segments: tuple[Segment, ...]
    # What the unscored warm-up plays (warmup_schedule): "first", the first segment's load;
    # "tail", the trace's own end, for a trace that repeats (a day follows a day).
    lead_in: str = "first"

    @property
    def duration_s(self) -> float:
        return sum(s.duration_s for s in self.segments)

    def starts_s(self) -> list[float]:
        """Each segment's start offset."""
        out, t = [], 0.0
        for s in self.segments:
            out.append(t)
            t += s.duration_s
        return out


_SEGMENT_KEYS = {f for f in Segment.__dataclass_fields__}
LEAD_INS = ("first", "tail")


def parse_trace(doc: Any, where: str = "trace") -> Trace:
    """A Trace from its JSON; ValueError naming the field and its limit."""
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: must be a JSON object")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.name: required, a non-empty string")
    raw = doc.get("segments")
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{where}.segments: required, a non-empty list")
    segments = []
    for i, seg in enumerate(raw):
        at = f"{where}.segments[{i}]"
        if not isinstance(seg, dict):
            raise ValueError(f"{at}: must be an object")
        unknown = sorted(set(seg) - _SEGMENT_KEYS)
        if unknown:
            raise ValueError(f"{at}.{unknown[0]}: unknown field; known: {sorted(_SEGMENT_KEYS)}")
        for key in ("duration_s", "rate_x", "prompt_tokens"):
            if key not in seg:
                raise ValueError(f"{at}.{key}: required")
        s = Segment(**seg)
        if not (isinstance(s.duration_s, int | float) and s.duration_s > 0):
            raise ValueError(f"{at}.duration_s: must be a number > 0, got {s.duration_s!r}")
        for key in ("rate_x", "rate_x_end"):
            v = getattr(s, key)
            if v is not None and not (isinstance(v, int | float) and 0 <= v <= 100):
                raise ValueError(f"{at}.{key}: must be a number in [0, 100], got {v!r}")
        if max(s.rate_x, s.rate_x_end or 0) <= 0:
            raise ValueError(f"{at}.rate_x: a segment with no arrivals; give a rate > 0")
        if not isinstance(s.prompt_tokens, int) or not 8 <= s.prompt_tokens <= MAX_PROMPT_TOKENS:
            raise ValueError(
                f"{at}.prompt_tokens: must be a whole number in [8, {MAX_PROMPT_TOKENS}], "
                f"got {s.prompt_tokens!r}"
            )
        if s.arrival not in ARRIVALS:
            raise ValueError(f"{at}.arrival: must be one of {', '.join(ARRIVALS)}")
        if s.fault is not None and s.fault not in FAULTS:
            raise ValueError(f"{at}.fault: must be one of {', '.join(FAULTS)} or absent")
        if not isinstance(s.slowdown_procs, int) or not 0 <= s.slowdown_procs <= 8:
            raise ValueError(f"{at}.slowdown_procs: must be a whole number in [0, 8]")
        segments.append(s)
    lead_in = doc.get("lead_in", "first")
    if lead_in not in LEAD_INS:
        raise ValueError(f"{where}.lead_in: must be one of {', '.join(LEAD_INS)}, got {lead_in!r}")
    return Trace(name, str(doc.get("description", "")), tuple(segments), lead_in)


def load_trace(name_or_path: str) -> Trace:
    """A trace by name (its file in bench/traces/, without .json) or by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = TRACES_DIR / f"{name_or_path}.json"
    if not path.is_file():
        known = sorted(p.stem for p in TRACES_DIR.glob("*.json"))
        raise ValueError(f"trace: {name_or_path!r} not found; shipped: {', '.join(known)}")
    return parse_trace(json.loads(path.read_text()), where=path.stem)


@dataclass(frozen=True)
class Arrival:
    at_s: float
    prompt_tokens: int
    segment: int


def schedule(trace: Trace, capacity_rps: float, seed: int) -> list[Arrival]:
    """Every request of the trace: when it arrives, how long its prompt is, in which segment.

    A ramp is drawn by thinning arrivals at its top rate (bursts keep their on/off shape)."""
    if not capacity_rps > 0:
        raise ValueError(f"capacity_rps: must be > 0, got {capacity_rps}")
    out: list[Arrival] = []
    for i, (seg, start) in enumerate(zip(trace.segments, trace.starts_s(), strict=True)):
        top = max(seg.rate_x, seg.rate_x_end or 0.0) * capacity_rps
        rng = random.Random(seed * 7919 + i)
        times = arrival_times(seg.arrival, top, seg.duration_s, seed=seed * 104_729 + i)
        for t in times:
            if rng.random() * top <= seg.rate_at(t) * capacity_rps:
                out.append(Arrival(start + t, seg.prompt_tokens, i))
    return out


# -- one run ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """Document words per prompt token on this endpoint (its tokenizer and chat template)."""

    tokens_per_word: float
    overhead_tokens: float

    def words_for(self, tokens: int) -> int:
        return max(1, round((tokens - self.overhead_tokens) / self.tokens_per_word))


async def calibrate(session: aiohttp.ClientSession, target: Target) -> Calibration:
    """Two 1-token requests: tokens per document word and the chat template's overhead."""
    # 120 words: a 256-token context still takes it (the fake engine's in the tests).
    short = await _prompt_tokens(session, target, document_prompt(0, 0, 20))
    long = await _prompt_tokens(session, target, document_prompt(0, 0, 120))
    if short is None or long is None:
        raise RuntimeError("calibration: the endpoint refused a 1-token request")
    per_word = (long - short) / 100
    return Calibration(per_word, short - 20 * per_word)


@dataclass(frozen=True)
class PhaseResult:
    """One segment's requests (by when they were sent): how many were good, and why the rest
    were not. A request late on both objectives counts in both. Files from before these
    counts were kept load with them at 0."""

    segment: int
    sent: int
    good: int
    ok: int = 0  # served (a 200), in time or not
    late_ttft: int = 0  # served with a first token past the TTFT objective
    late_tpot: int = 0  # served with a TPOT past its objective
    rejected: int = 0  # refused with a 429
    # The served requests' TPOT as this client saw it (to set beside the daemon's own
    # reading in the timeline: the SLO is judged here, after the HTTP layer).
    tpot_p50_s: float | None = None
    tpot_p99_s: float | None = None


@dataclass(frozen=True)
class TraceRun:
    """One arm over one trace with one seed."""

    trace: str
    arm: str
    seed: int
    duration_s: float
    sent: int
    ok: int
    good: int
    rejected: int
    failed: int
    goodput_rps: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    phases: tuple[PhaseResult, ...]
    timeline: tuple[dict[str, Any], ...] = field(default=(), repr=False)
    # Of the prompt tokens the engine looked up in its prefix cache over the run (warm-up
    # included), the share it found there; None where not read (runs stored before it was).
    prefix_cache_hit_ratio: float | None = None


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def summarise(
    trace: Trace,
    arm: str,
    seed: int,
    arrivals: Sequence[Arrival],
    samples: Sequence[RequestSample],
    slo: GoodputSlo,
    timeline: Sequence[dict[str, Any]] = (),
) -> TraceRun:
    """Goodput of one run, in all and per segment."""
    good_flags = [slo.good(s) for s in samples]
    ok = [s for s in samples if s.ok]
    ttft = [s.ttft_s for s in ok if s.ttft_s is not None]
    phases = []
    for i in range(len(trace.segments)):
        idx = [k for k, a in enumerate(arrivals) if a.segment == i]
        served = [samples[k] for k in idx if samples[k].ok]
        tpots = [s.tpot_s for s in served if s.tpot_s is not None]
        phases.append(
            PhaseResult(
                i,
                len(idx),
                sum(good_flags[k] for k in idx),
                ok=len(served),
                late_ttft=sum(slo.late_ttft(s) for s in served),
                late_tpot=sum(slo.late_tpot(s) for s in served),
                rejected=sum(samples[k].status == 429 for k in idx),
                tpot_p50_s=_pct(tpots, 50),
                tpot_p99_s=_pct(tpots, 99),
            )
        )
    rejected = sum(s.status == 429 for s in samples)
    good = sum(good_flags)
    return TraceRun(
        trace=trace.name,
        arm=arm,
        seed=seed,
        duration_s=trace.duration_s,
        sent=len(samples),
        ok=len(ok),
        good=good,
        rejected=rejected,
        failed=len(samples) - len(ok) - rejected,
        goodput_rps=good / trace.duration_s,
        ttft_p50_s=_pct(ttft, 50),
        ttft_p99_s=_pct(ttft, 99),
        phases=tuple(phases),
        timeline=tuple(timeline),
    )


class _Episodes:
    """Faults and CPU burners over their segments; everything undone however the run ends."""

    def __init__(self, admin: AdminClient) -> None:
        self.admin = admin
        self.procs: list[subprocess.Popen[bytes]] = []

    async def run(self, trace: Trace, t0: float) -> None:
        for seg, start in zip(trace.segments, trace.starts_s(), strict=True):
            if not seg.fault and not seg.slowdown_procs:
                continue
            delay = t0 + start - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if seg.fault:
                with contextlib.suppress(AdminError):
                    await self.admin.post(
                        "/admin/telemetry/faults",
                        {
                            "name": seg.fault,
                            "delta_c": seg.fault_delta_c,
                            "duration_s": seg.duration_s,
                        },
                    )
            for _ in range(seg.slowdown_procs):
                self.procs.append(start_burner())
            await asyncio.sleep(max(0.0, t0 + start + seg.duration_s - time.perf_counter()))
            self.stop_procs()

    def stop_procs(self) -> None:
        stop_burners(self.procs)

    async def undo(self) -> None:
        self.stop_procs()
        with contextlib.suppress(AdminError):
            await self.admin.delete("/admin/telemetry/faults")


async def _watch(daemon: Daemon, t0: float, out: list[dict[str, Any]], every_s: float) -> None:
    """The daemon's limit, derate, queue and prefill budget every `every_s` (for the plots),
    with the controller's changes since the sample before and their reasons (to read a run
    afterwards: the daemon and its database go with the bench)."""
    seen_ts = time.time()  # the daemon's wall clock, this machine's: changes from here on
    while True:
        snap = await daemon.status() or {}
        adm = snap.get("admission") or {}
        ctl = snap.get("controller") or {}
        prefill = ctl.get("prefill") or {}
        live = ctl.get("live") or {}
        last = ctl.get("last") or {}
        changes = [d for d in ctl.get("decisions") or () if d.get("ts_s", -math.inf) > seen_ts]
        if changes:
            seen_ts = max(d["ts_s"] for d in changes)
        out.append(
            {
                "t_s": round(time.perf_counter() - t0, 2),
                "limit": adm.get("limit"),
                "derate": adm.get("derate_factor"),
                "in_flight": adm.get("in_flight"),
                "queued": sum((adm.get("queued") or {}).values()),
                "prefill_budget_tokens": prefill.get("budget_tokens"),
                # What the controller read this tick: the window's p99 TPOT (finished
                # requests), a request's TPOT through the engine's steps, and why it acted.
                "window_tpot_p99_s": (snap.get("latency") or {}).get("tpot_p99_s"),
                "live_request_tpot_s": live.get("request_tpot_s"),
                "live_batch": live.get("batch"),
                "reason": last.get("reason"),
                "changes": [d.get("reason") for d in changes],
            }
        )
        await asyncio.sleep(every_s)


def warmup_schedule(trace: Trace, capacity_rps: float, seed: int, warmup_s: float) -> list[Arrival]:
    """The unscored lead-in: the first segment's load (no fault, no ramp) for warmup_s, so a
    run is scored from a daemon already serving that load, as a box in service is, and not
    from a cold start (the controller from its configured limit, the engine idle).

    A trace whose lead_in is "tail" repeats (diurnal: a day follows a day): its lead-in is
    its own last warmup_s seconds, faults and slowdowns left out. On a quiet first segment
    no queue forms and nothing moves the controller, so a first-segment lead-in scores its
    cold start; the end of the day before leaves it where a box in service would be."""
    if warmup_s <= 0:
        return []
    if trace.lead_in == "tail":
        calm = tuple(replace(s, fault=None, slowdown_procs=0) for s in trace.segments)
        return [
            replace(a, segment=-1, at_s=a.at_s - trace.duration_s + warmup_s)
            for a in schedule(replace(trace, segments=calm), capacity_rps, seed + 7_000)
            if a.at_s >= trace.duration_s - warmup_s
        ]
    first = replace(
        trace.segments[0], duration_s=warmup_s, rate_x_end=None, fault=None, slowdown_procs=0
    )
    lead = Trace(f"{trace.name}-warmup", "", (first,))
    return [replace(a, segment=-1) for a in schedule(lead, capacity_rps, seed + 7_000)]


def _fire(
    session: aiohttp.ClientSession,
    target: Target,
    a: Arrival,
    i: int,
    calib: Calibration,
    max_tokens: int,
    seed: int,
    tag: str = "",
) -> asyncio.Task[RequestSample]:
    prompt = tag + document_prompt(i, seed, calib.words_for(a.prompt_tokens))
    kind = "document" if a.prompt_tokens >= 500 else "chat"
    return asyncio.create_task(
        stream_chat(session, target, prompt, max_tokens, kind, seed=seed * 100_003 + i)
    )


async def replay(
    session: aiohttp.ClientSession,
    target: Target,
    daemon: Daemon,
    trace: Trace,
    arrivals: Sequence[Arrival],
    calib: Calibration,
    max_tokens: int,
    drain_s: float,
    seed: int,
    warmup: Sequence[Arrival] = (),
    warmup_s: float = 0.0,
    tag: str = "",
) -> tuple[list[RequestSample], list[dict[str, Any]]]:
    """Fire the warm-up, then every arrival on time (open loop), run the trace's episodes;
    every scored outcome (the warm-up's are dropped, unfinished ones cancelled). Every prompt
    starts with `tag` (goodput.run_tag: a run's prompts are its own)."""
    episodes = _Episodes(daemon.admin)
    timeline: list[dict[str, Any]] = []
    t_lead = time.perf_counter()
    t0 = t_lead + (warmup_s if warmup else 0.0)
    side = [
        asyncio.create_task(episodes.run(trace, t0)),
        asyncio.create_task(_watch(daemon, t0, timeline, 2.0)),
    ]
    lead: list[asyncio.Task[RequestSample]] = []
    tasks: list[asyncio.Task[RequestSample]] = []
    try:
        timed = [(t_lead + a.at_s, a, lead) for a in warmup]
        timed += [(t0 + a.at_s, a, tasks) for a in arrivals]
        for i, (at, a, into) in enumerate(timed):
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            into.append(_fire(session, target, a, i, calib, max_tokens, seed, tag))
        out = await settle(tasks, t0 + trace.duration_s + drain_s, t0)
    finally:
        for task in side:
            task.cancel()
        await asyncio.gather(*side, return_exceptions=True)
        await settle(lead, time.perf_counter(), t_lead)
        await episodes.undo()
    return out, timeline


# -- arms and the whole benchmark -------------------------------------------------------------


# The three-phase tuning's baseline, and every trace table's start unless its notes say
# otherwise.
CONTROLLER_START = 8
# A reused static arm is checked by running its best limit's seed 0 again. On diurnal static
# 32's seeds spanned 2.13-2.31 in one invocation; this 2-vCPU VM's speed moved a fifth between
# sessions (thermal static 32: 4.73 -> 4.11), and its chat capacity from 5.68 to 4.0 req/s a
# day later. Thermal's hot phase (CPU burners) moves one run by up to 15 % (static 32:
# 2.11-2.88 in one invocation): a check there refuses more often, and should, since such arms
# do not compare across invocations.
REUSE_TOLERANCE = 0.05


def headroom_arm(tpot_s: float) -> str:
    """The arm of a controller steered to a TPOT under the scored SLO (--headroom-tpot-s)."""
    return f"controller@{tpot_s:g}s"


def headroom_tpot_s(arm: str) -> float | None:
    """The TPOT a headroom arm steers to; None for any other arm."""
    if not (arm.startswith("controller@") and arm.endswith("s")):
        return None
    return float(arm[len("controller@") : -1])


def ceiling_arm(limit: int) -> str:
    """The arm of a controller that may not go past `limit` (--ceiling-arms): the `max` an
    operator's objective sets, e.g. a benchmark's knee applied as the ceiling."""
    return f"controller<={limit}"


def arm_ceiling(arm: str) -> int | None:
    """The ceiling a ceiling arm runs under; None for any other arm."""
    if not arm.startswith("controller<="):
        return None
    return int(arm[len("controller<=") :])


def is_variant(arm: str) -> bool:
    """A controller arm beside the shipped one: a headroom TPOT or a ceiling."""
    return headroom_tpot_s(arm) is not None or arm_ceiling(arm) is not None


def is_controller(arm: str) -> bool:
    """The controller in auto mode: the shipped one, or a variant (headroom or ceiling)."""
    return arm == "controller" or is_variant(arm)


def arm_bodies(
    arm: str, max_limit: int, start: int = CONTROLLER_START, slo_tpot_s: float | None = None
) -> list[dict[str, Any]]:
    """The PUT /admin/controller calls that set an arm up: controller, controller@Xs (the
    controller steered to a TPOT of X s), controller<=N (the controller under a ceiling of
    N), unbounded or static:N.

    The controller starts every run at `start` (--controller-start), not from what the arm
    before it left in force. The shipped daemon starts at engine.max_num_seqs
    (admission.concurrency_limit unset): from there the controller meets the SLO from above,
    and its one-step cuts of a mild breach hold it at the SLO's edge (docs/benchmarks.md,
    goodput_trace_end_thermal). A headroom arm sets the TPOT it steers to, and every other
    controller arm sets `slo_tpot_s` back (the scored SLO's; None: the daemon's own stands).
    A ceiling arm starts at `start` or its ceiling, whichever is lower."""
    if not 1 <= start <= max_limit:
        raise ValueError(f"controller start: must be in [1, {max_limit}], got {start}")
    if is_controller(arm):
        ceiling = arm_ceiling(arm)
        top = max_limit if ceiling is None else min(ceiling, max_limit)
        start = min(start, top)
        auto: dict[str, Any] = {"mode": "auto", "max": top}
        target = headroom_tpot_s(arm) or slo_tpot_s
        if target is not None:
            auto["slo_tpot_p99_s"] = target
        return [{"mode": "manual", "limit": start}, auto]
    return [arm_body(arm, max_limit)]


def arm_body(arm: str, max_limit: int) -> dict[str, Any]:
    """PUT /admin/controller for a fixed arm: unbounded or static:N."""
    if arm == "unbounded":
        return {"mode": "manual", "limit": UNBOUNDED_LIMIT, "max": UNBOUNDED_LIMIT}
    if arm.startswith("static:"):
        n = int(arm.split(":", 1)[1])
        return {"mode": "manual", "limit": n, "max": max(n, max_limit)}
    raise ValueError(f"arm: controller, unbounded or static:N, got {arm!r}")


class ReuseRefused(SystemExit):
    """The reused static arms' check run moved past the tolerance: they no longer compare."""


@dataclass
class Plan:
    traces: tuple[Trace, ...]
    runs: int
    levels: tuple[int, ...]
    slo: GoodputSlo
    max_tokens: int
    drain_s: float
    max_limit: int
    capacity_rps: float | None = None
    skip_unbounded: tuple[str, ...] = ()  # traces that run no unbounded arm
    warmup_s: float = 0.0  # unscored lead-in before each run (Trace.lead_in says of what)
    controller_start: int = CONTROLLER_START  # the limit the controller arm starts from
    levels_for: dict[str, tuple[int, ...]] = field(default_factory=dict)  # per-trace levels
    # Per trace: the static and unbounded runs of an earlier measurement, reused instead of
    # run again (those arms are manual mode, where a change to the controller runs no code).
    reuse: dict[str, tuple[TraceRun, ...]] = field(default_factory=dict)
    reuse_tolerance: float = REUSE_TOLERANCE  # how far the check run may move (a fraction)
    # Controller arms beside the shipped one, each steered to this TPOT (under the scored
    # SLO): what headroom against a slowdown costs and buys, on the same day's oracle.
    headroom_tpot_s: tuple[float, ...] = ()
    # Controller arms beside the shipped one, each under this ceiling (the `max` of PUT
    # /admin/controller): what a ceiling near the box's knee costs and buys, the same day.
    ceilings: tuple[int, ...] = ()

    @property
    def controller_arms(self) -> tuple[str, ...]:
        """Every controller arm a seed runs: the shipped one, each headroom arm, then each
        ceiling arm."""
        return (
            "controller",
            *(headroom_arm(x) for x in self.headroom_tpot_s),
            *(ceiling_arm(n) for n in self.ceilings),
        )

    @property
    def scored_tpot_s(self) -> float:
        """The TPOT the shipped controller steers to: the scored SLO's (0.5 s where the
        score has none, as the daemon's config)."""
        return self.slo.tpot_s or 0.5

    @property
    def restore_tpot_s(self) -> float | None:
        """The TPOT each controller arm's setup sets before it runs: the scored one where
        headroom arms run (so a headroom target never lingers into the next arm); None
        where none run, and the daemon's own TPOT SLO stands."""
        return self.scored_tpot_s if self.headroom_tpot_s else None


COOL_C = 65.0  # the simulated GPU under this load settles near 71 °C; idle near 31 °C


async def wait_thermal_normal(
    daemon: Daemon, log: Any, timeout_s: float = 600.0, cool_c: float = COOL_C
) -> None:
    """Until the daemon's thermal level is normal and every GPU core is below cool_c."""
    deadline = time.monotonic() + timeout_s
    said = False
    while time.monotonic() < deadline:
        snap = await daemon.status() or {}
        telemetry = snap.get("telemetry") or {}
        level = (telemetry.get("thermal") or {}).get("level")
        temps = [g.get("core_temp_c") for g in telemetry.get("gpus") or []]
        hot = [t for t in temps if isinstance(t, int | float) and t >= cool_c]
        if level in (None, "normal") and not hot:
            return
        if not said:
            log(f"  waiting for the GPU to cool (thermal {level}, cores {temps} °C) ...")
            said = True
        await asyncio.sleep(2.0)
    raise RuntimeError(f"the GPU stayed out of normal thermal state for {timeout_s:g} s")


async def measure_capacity(url: str, plan: Plan, token: str | None) -> float:
    """Chat requests per second at the best closed-loop level that keeps the SLO's p99s."""
    from bench.goodput import best_static

    report = await run_sweep(
        BenchSettings(
            url=url,
            concurrency=(16, 32),
            max_tokens=plan.max_tokens,
            admin_token=token,
            requests_per_level=64,
        )
    )
    best, _ = best_static(report.points, plan.slo)
    return best.request_per_s


async def run_trace_arms(
    session: aiohttp.ClientSession,
    target: Target,
    daemon: Daemon,
    trace: Trace,
    plan: Plan,
    capacity: float,
    calib: Calibration,
    log: Any = print,
    notes: list[str] | None = None,
) -> list[TraceRun]:
    """The static sweep (seed 0), then every seed of controller, unbounded and the best; or,
    with reused fixed arms, a check run of the reused oracle and then the controller."""
    notes = [] if notes is None else notes
    runs: list[TraceRun] = []

    async def one(arm: str, seed: int, *, scored: bool = True) -> TraceRun:
        await daemon.wait_idle()
        # A run after a hot-room episode must not start hot: the simulated GPU cools with a
        # time constant of a minute, and a run started in its derate or PROTECT would carry
        # the last run's episode (the first thermal measurement here did exactly that).
        await wait_thermal_normal(daemon, log)
        for body in arm_bodies(arm, plan.max_limit, plan.controller_start, plan.restore_tpot_s):
            applied, msg = await daemon.set_controller(body)
            if not applied:
                raise RuntimeError(msg)
        arrivals = schedule(trace, capacity, seed)
        warmup = warmup_schedule(trace, capacity, seed, plan.warmup_s)
        cache_before = await daemon.prefix_cache_tokens()
        samples, timeline = await replay(
            session,
            target,
            daemon,
            trace,
            arrivals,
            calib,
            plan.max_tokens,
            plan.drain_s,
            seed,
            warmup,
            plan.warmup_s,
            run_tag(),
        )
        run = summarise(trace, arm, seed, arrivals, samples, plan.slo, timeline)
        run = replace(
            run, prefix_cache_hit_ratio=hit_ratio(cache_before, await daemon.prefix_cache_tokens())
        )
        hits = run.prefix_cache_hit_ratio
        log(
            f"  {trace.name:<14} {arm:<10} seed {seed}: goodput {run.goodput_rps:.2f} req/s "
            f"({run.good}/{run.sent} good, {run.rejected} 429, {run.failed} failed; per phase "
            + ", ".join(
                f"{p.good}/{p.sent} (late TTFT {p.late_ttft}, late TPOT {p.late_tpot}, "
                f"429 {p.rejected})"
                for p in run.phases
            )
            + ")"
            + ("" if hits is None else f"; prefix-cache hits {hits:.0%}")
            + ("" if scored else " [reuse check, not scored]")
        )
        if scored:
            runs.append(run)
        return run

    reused = plan.reuse.get(trace.name)
    if reused:
        # Reused arms compare only on the box that ran them: run the oracle's seed 0 again
        # first, and refuse before any controller run when it moved.
        then = best_static_seed0(reused)
        ok, note = reuse_drift(then, await one(then.arm, 0, scored=False), plan.reuse_tolerance)
        log("  " + note)
        if not ok:
            raise ReuseRefused(note)
        notes.append(note)
        log(f"  {trace.name}: static and unbounded arms reused ({len(reused)} runs)")
        runs += reused
        for seed in range(plan.runs):
            for arm in seed_order(plan.controller_arms, seed):
                await one(arm, seed)
        return runs
    levels = plan.levels_for.get(trace.name, plan.levels)
    best = best_static_seed0([await one(f"static:{n}", 0) for n in levels])
    for seed in range(plan.runs):
        arms = [*plan.controller_arms]
        if trace.name not in plan.skip_unbounded:
            arms.append("unbounded")
        if seed > 0:
            arms.append(best.arm)
        for arm in seed_order(arms, seed):
            await one(arm, seed)
    return runs


def hit_ratio(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of prompt tokens looked up in the prefix cache between two readings of
    (queried, hit) that were found there; None without both readings, when the engine
    restarted between them (its totals went back) or nothing was looked up."""
    if before is None or after is None:
        return None
    queried, hit = after[0] - before[0], after[1] - before[1]
    if queried <= 0 or hit < 0:
        return None
    return hit / queried


def seed_order(arms: Sequence[str], seed: int) -> list[str]:
    """A seed's arms, rotated by the seed: no arm always runs right after another. In one
    fixed order the ceiling arm followed the shipped arm in every seed of every run, and
    won diurnal in 6 of 6 seeds where its ceiling never bound the shipped arm's path
    (docs/benchmarks.md, goodput_trace_pool3_diurnal): an order effect could not be told
    from the ceiling's."""
    if not arms:
        return []
    k = seed % len(arms)
    return [*arms[k:], *arms[:k]]


def best_static_seed0(runs: Sequence[TraceRun]) -> TraceRun:
    """The oracle's static run: best goodput on seed 0, the smaller limit on a tie."""
    sweep = [r for r in runs if r.arm.startswith("static:") and r.seed == 0]
    return max(sweep, key=lambda r: (r.goodput_rps, -int(r.arm.split(":")[1])))


def reuse_drift(then: TraceRun, here: TraceRun, tolerance: float) -> tuple[bool, str]:
    """Whether a reused arm still stands, and the note that says why: the same arm and seed
    run again here must land within tolerance (a fraction) of its goodput then."""
    if then.goodput_rps <= 0:
        moved = math.inf if here.goodput_rps > 0 else 0.0
    else:
        moved = here.goodput_rps / then.goodput_rps - 1
    ok = abs(moved) <= tolerance
    return ok, (
        f"reuse check, {here.trace}: {here.arm} seed {here.seed} ran again here at "
        f"{here.goodput_rps:.2f} req/s, against {then.goodput_rps:.2f} then ({moved:+.0%}; "
        f"allowed ±{tolerance:.0%})" + ("" if ok else ": the box moved, the reused arms refused")
    )


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def served_ratios(runs: Sequence[TraceRun], best_arm: str) -> list[float]:
    """Per seed the best static limit ran: the most requests any arm served (a 200, in time
    or late) over the best static limit's good ones (seeds with none left out). A
    controller that serves no more than the busiest arm, every request in time, beats the
    oracle by this much at most: where it is under the target ratio, the box itself bounds
    the run."""
    ratios = []
    for seed in sorted({r.seed for r in runs if r.arm == best_arm}):
        mine = [r for r in runs if r.seed == seed]
        good = max(r.good for r in mine if r.arm == best_arm)
        if good > 0:
            ratios.append(max(r.ok for r in mine) / good)
    return ratios


def served_vs_static(runs: Sequence[TraceRun], best_arm: str) -> dict[str, float] | None:
    """served_ratios' median and spread; None without a good static request."""
    ratios = served_ratios(runs, best_arm)
    return _spread(ratios) if ratios else None


def cells(runs: Sequence[TraceRun]) -> list[dict[str, Any]]:
    """Per trace: the oracle's static limit and each arm's goodput median and spread."""
    out = []
    for name in dict.fromkeys(r.trace for r in runs):
        mine = [r for r in runs if r.trace == name]
        static_seed0 = {
            r.arm: r.goodput_rps for r in mine if r.arm.startswith("static:") and r.seed == 0
        }
        best_arm = best_static_seed0(mine).arm
        row: dict[str, Any] = {
            "trace": name,
            "best_static": best_arm,
            "static_sweep": static_seed0,
        }
        for arm, key in (("controller", "controller"), ("unbounded", "unbounded")):
            vals = [r.goodput_rps for r in mine if r.arm == arm]
            row[key] = _spread(vals) if vals else None
        vals = [r.goodput_rps for r in mine if r.arm == best_arm]
        row["static"] = _spread(vals)
        row["served_vs_static"] = served_vs_static(mine, best_arm)
        row["variants"] = _variant_cells(mine, row["static"])
        ctl = row["controller"]
        for other in ("static", "unbounded"):
            base = row[other]
            row[f"controller_vs_{other}"] = (
                None
                if ctl is None or base is None
                else (ctl["median"] / base["median"] if base["median"] > 0 else math.inf)
            )
        out.append(row)
    return out


def _variant_cells(runs: Sequence[TraceRun], static: dict[str, float]) -> dict[str, Any]:
    """Per variant arm (controller@Xs, controller<=N): its goodput's spread and its median
    over the best static limit's."""
    out: dict[str, Any] = {}
    for arm in dict.fromkeys(r.arm for r in runs if is_variant(r.arm)):
        spread = _spread([r.goodput_rps for r in runs if r.arm == arm])
        vs = spread["median"] / static["median"] if static["median"] > 0 else math.inf
        out[arm] = {**spread, "vs_static": vs}
    return out


def render_markdown(doc: dict[str, Any]) -> str:
    """The results table for docs/benchmarks.md."""
    plan = doc["plan"]
    warm = plan.get("warmup_s") or 0
    lines = [
        "## Goodput on loads that change shape (issue 15)"
        + (f", each run after a {warm:g} s warm-up" if warm else ", cold start"),
        "",
        f"Measured {time.strftime('%Y-%m-%d', time.localtime(doc['measured_at_unix_s']))} "
        f"with `{doc['command']}` on {doc['machine']}. SLO per request: TTFT <= "
        f"{plan['slo']['ttft_s']:g} s"
        + (f", TPOT <= {plan['slo']['tpot_s']:g} s" if plan["slo"]["tpot_s"] else "")
        + f"; {plan['max_tokens']} output tokens; chat capacity {doc['capacity_rps']:.2f} req/s "
        "(rates in the traces are multiples of it). Goodput: requests meeting the SLO per "
        "second of trace; median [min-max] over the runs (seeds). The static limit is the best "
        "of the sweep below over the whole trace (seed 0), an oracle no operator has.",
        "",
        "| trace | controller | unbounded | best static (limit) | ctl/static | ctl/unbounded |",
        "|---|---|---|---|---|---|",
    ]

    def cell(s: dict[str, float] | None) -> str:
        if s is None:
            return "-"
        return f"{s['median']:.2f} [{s['min']:.2f}-{s['max']:.2f}]"

    def ratio(v: float | None) -> str:
        return "-" if v is None else ("inf" if math.isinf(v) else f"{v:.2f}x")

    for row in doc["cells"]:
        lines.append(
            f"| {row['trace']} | {cell(row['controller'])} | {cell(row['unbounded'])} | "
            f"{cell(row['static'])} ({row['best_static'].split(':')[1]}) | "
            f"{ratio(row['controller_vs_static'])} | {ratio(row['controller_vs_unbounded'])} |"
        )
    variants = [
        (row, arm, c)
        for row in doc["cells"]
        # Files from before ceiling arms keep their headroom arms under "headroom".
        for arm, c in (row.get("variants") or row.get("headroom") or {}).items()
    ]
    if variants:
        lines += [
            "",
            "The same controller beside the same runs, steered to a TPOT under the SLO "
            "(controller@Xs: headroom against a slowdown) or under a ceiling (controller<=N: "
            "the `max` an operator's objective sets), scored against the SLO above:",
            "",
        ]
        for row, arm, c in variants:
            lines.append(
                f"- {row['trace']}, {arm}: {cell(c)} ({ratio(c['vs_static'])} the best static)"
            )
    lines += ["", "Static sweep (seed 0), goodput by limit:", ""]
    for row in doc["cells"]:
        sweep = ", ".join(f"{a.split(':')[1]}: {v:.2f}" for a, v in row["static_sweep"].items())
        lines.append(f"- {row['trace']}: {sweep}")
    served = [row for row in doc["cells"] if row.get("served_vs_static")]
    if served:
        lines += [
            "",
            "The ceiling of a ratio: per seed, the most requests any arm served (in time or "
            "late) over the best static limit's good ones (median [min-max]); a controller "
            "that serves as many as the busiest arm, every one in time, makes this much:",
            "",
        ]
        for row in served:
            s = row["served_vs_static"]
            lines.append(f"- {row['trace']}: {s['median']:.2f}x [{s['min']:.2f}-{s['max']:.2f}]")
    lines += ["", *[f"- {n}" for n in doc["notes"]]]
    return "\n".join(lines) + "\n"


def _daemon_config(plan: Plan, model_dir: Path, port: int) -> dict[str, Any]:
    return {
        "server": {"host": "127.0.0.1", "port": port},
        "engine": {
            "model": str(model_dir),
            "max_model_len": 2048,
            "max_num_seqs": plan.max_limit,
            "kv_cache_space_gib": 2,
            "dtype": "float32",  # bf16 matmuls are 3-8x slower on this AVX2-only CPU
            "enforce_eager": True,
            "drain_timeout_s": 30,
        },
        # A request that waited half the TTFT SLO in our queue has lost it: shed it, and the
        # engine time goes to one that can still make it. (Unbounded never queues here.)
        "admission": {
            "realtime_reserved_share": 0,
            "retry_after_s": 1,
            "concurrency_limit": None,  # shipped default: engine.max_num_seqs
            "max_queue_wait_s": max(0.1, plan.slo.ttft_s / 2),
        },
        "slo": {"ttft_p99_s": plan.slo.ttft_s, "tpot_p99_s": plan.slo.tpot_s or 0.5},
        "controller": {"mode": "manual", "forecast": "off"},
        "telemetry": {"source": "sim"},
        "logging": {"level": "warning"},
    }


async def run(plan: Plan, url: str | None, token: str | None, log: Any = print) -> dict[str, Any]:
    """Every trace on one daemon (started here unless url is given)."""
    from appliance.model_prep import prepare_default_model
    from bench.servers import free_port, start_appliance

    notes: list[str] = []
    server = None
    with tempfile.TemporaryDirectory(prefix="goodput-trace-") as tmp:
        if url is None:
            model_dir = prepare_default_model(MODEL_DIR)
            log("starting the daemon ...")
            server = start_appliance(
                _daemon_config(plan, model_dir, free_port()), Path(tmp) / "daemon"
            )
            url, token = server.url, server.admin_address().token.value
        try:
            from appliance.client import DaemonAddress, Token

            address = DaemonAddress(url, Token(token, "bench"))
            async with _load_session() as session, AdminClient.at(address) as admin:
                daemon = Daemon(admin)
                target = await connect(session, BenchSettings(url=url))
                calib = await calibrate(session, target)
                notes.append(
                    f"prompts: {calib.tokens_per_word:.2f} tokens a word, "
                    f"{calib.overhead_tokens:.0f} tokens of template"
                )
                capacity = plan.capacity_rps
                if capacity is None:
                    await daemon.set_controller(arm_body("unbounded", plan.max_limit))
                    log("closed-loop sweep for the chat capacity ...")
                    capacity = await measure_capacity(url, plan, token)
                notes.append(f"chat capacity {capacity:.2f} req/s (closed loop, 16 and 32)")
                notes.append(
                    f"controller arm: auto mode from limit {plan.controller_start} each run "
                    f"(the shipped daemon starts at engine.max_num_seqs = {plan.max_limit})"
                )
                if plan.headroom_tpot_s:
                    notes.append(
                        "headroom arms: the same controller steered to a TPOT of "
                        + ", ".join(f"{x:g} s" for x in plan.headroom_tpot_s)
                        + " (PUT /admin/controller slo_tpot_p99_s), scored against the SLO"
                    )
                if plan.ceilings:
                    notes.append(
                        "ceiling arms: the same controller under a ceiling of "
                        + ", ".join(str(n) for n in plan.ceilings)
                        + " (PUT /admin/controller max), from the same start"
                    )
                before = ((await daemon.status()) or {}).get("controller") or {}
                runs: list[TraceRun] = []
                try:
                    for trace in plan.traces:
                        log(f"trace {trace.name} ({trace.duration_s:g} s)")
                        runs += await run_trace_arms(
                            session, target, daemon, trace, plan, capacity, calib, log, notes
                        )
                finally:
                    own = before.get("slo_tpot_p99_s")
                    if plan.headroom_tpot_s and isinstance(own, int | float):
                        # A daemon given by --url keeps its own TPOT SLO after the bench.
                        await daemon.set_controller({"slo_tpot_p99_s": own})
        finally:
            if server is not None:
                server.stop()
    return {
        "measured_at_unix_s": time.time(),
        "plan": {
            "traces": [t.name for t in plan.traces],
            "runs": plan.runs,
            "levels": list(plan.levels),
            "levels_for": {k: list(v) for k, v in plan.levels_for.items()},
            "skip_unbounded": list(plan.skip_unbounded),
            "warmup_s": plan.warmup_s,
            "headroom_tpot_s": list(plan.headroom_tpot_s),
            "ceilings": list(plan.ceilings),
            "controller_start": plan.controller_start,
            "lead_in": {t.name: t.lead_in for t in plan.traces},
            "slo": asdict(plan.slo),
            "max_tokens": plan.max_tokens,
            "drain_s": plan.drain_s,
            "max_limit": plan.max_limit,
        },
        "capacity_rps": capacity,
        "cells": cells(runs),
        "runs": [asdict(r) for r in runs],
        "notes": notes,
    }


def trace_run_from(stored: dict[str, Any]) -> TraceRun:
    """A run as --json-out stored it, back as a TraceRun (fields a file from before them
    lacks take their defaults)."""
    phases = tuple(PhaseResult(**p) for p in stored.get("phases") or ())
    return TraceRun(**{**stored, "phases": phases, "timeline": tuple(stored.get("timeline") or ())})


def load_reuse(path: Path, plan: Plan) -> tuple[dict[str, tuple[TraceRun, ...]], list[str]]:
    """The fixed arms (static:N, unbounded) of the plan's traces from an earlier --json-out
    file, and a note naming it. Refused unless it ran the same seeds, capacity, warm-up, SLO,
    output length and trace shapes."""
    doc = json.loads(path.read_text())
    then = doc.get("plan") or {}
    problems = []
    capacity = doc.get("capacity_rps", 0)
    if plan.capacity_rps is None or abs(capacity - plan.capacity_rps) > 1e-6:
        problems.append(f"capacity {capacity} req/s, here {plan.capacity_rps}")
    for key, here in (
        ("warmup_s", plan.warmup_s),
        ("slo", asdict(plan.slo)),
        ("max_tokens", plan.max_tokens),
        ("drain_s", plan.drain_s),
    ):
        if then.get(key) != here:
            problems.append(f"{key} {then.get(key)}, here {here}")
    if then.get("runs", 0) < plan.runs:
        problems.append(f"{then.get('runs')} seeds, here {plan.runs}")
    out: dict[str, tuple[TraceRun, ...]] = {}
    for trace in plan.traces:
        # Files from before lead-ins were named warmed up on the first segment.
        lead_then = (then.get("lead_in") or {}).get(trace.name, "first")
        if lead_then != trace.lead_in:
            problems.append(f"{trace.name} lead_in {lead_then}, here {trace.lead_in}")
        fixed = []
        for r in doc.get("runs") or []:
            if r["trace"] != trace.name or is_controller(r["arm"]) or r["seed"] >= plan.runs:
                continue
            if r["duration_s"] != trace.duration_s or len(r["phases"]) != len(trace.segments):
                problems.append(f"{trace.name} had another shape then")
                break
            fixed.append(trace_run_from(r))
        if not any(r.arm.startswith("static:") and r.seed == 0 for r in fixed):
            problems.append(f"no static sweep of {trace.name}")
        out[trace.name] = tuple(fixed)
    if problems:
        raise SystemExit(f"reuse: {path} does not match this run: " + "; ".join(problems))
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(doc["measured_at_unix_s"]))
    note = (
        f"static and unbounded arms of {', '.join(t.name for t in plan.traces)}: reused from "
        f"{path.name} (measured {when} with `{doc.get('command')}`); only the controller ran here"
    )
    return out, [note]


def _headroom_targets(text: str, slo_tpot_s: float) -> tuple[float, ...]:
    """--headroom-tpot-s: TPOTs in (0, the TPOT SLO), each once; SystemExit names the bad one."""
    out: list[float] = []
    for part in (x.strip() for x in text.split(",")):
        if not part:
            continue
        try:
            value = float(part)
        except ValueError:
            raise SystemExit(f"headroom-tpot-s: {part!r} is not a number of seconds") from None
        if not slo_tpot_s or not 0 < value < slo_tpot_s:
            raise SystemExit(
                f"headroom-tpot-s: must be in (0, --slo-tpot-s {slo_tpot_s:g}), got {part}"
            )
        if value not in out:
            out.append(value)
    return tuple(out)


def _ceilings(text: str, max_limit: int) -> tuple[int, ...]:
    """--ceiling-arms: whole limits in [1, --max-limit), each once; SystemExit names the bad
    one (a ceiling at --max-limit is the shipped controller's own)."""
    out: list[int] = []
    for part in (x.strip() for x in text.split(",")):
        if not part:
            continue
        try:
            value = int(part)
        except ValueError:
            raise SystemExit(f"ceiling-arms: {part!r} is not a whole number") from None
        if not 1 <= value < max_limit:
            raise SystemExit(f"ceiling-arms: must be in [1, --max-limit {max_limit}), got {part}")
        if value not in out:
            out.append(value)
    return tuple(out)


def _levels_for(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    out = {}
    for item in items:
        name, _, levels = item.partition("=")
        try:
            out[name.strip()] = tuple(int(x) for x in levels.split(",") if x.strip())
        except ValueError:
            raise SystemExit(f"levels-for: {item!r} is not TRACE=N,N,...") from None
        if not out[name.strip()] or min(out[name.strip()]) < 1:
            raise SystemExit(f"levels-for: {item!r} needs whole numbers >= 1")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_daemon_args(p)
    p.add_argument("--traces", default="phase_change,diurnal,thermal")
    p.add_argument("--runs", type=int, default=3, help="seeds per cell (default 3)")
    p.add_argument("--levels", default="2,4,8,16,32", help="static limits to sweep")
    # The shipped slo: section (config.yaml): what an operator's box steers to out of the box.
    p.add_argument("--slo-ttft-s", type=float, default=5.0)
    p.add_argument("--slo-tpot-s", type=float, default=0.5, help="0 turns the TPOT check off")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--drain-s", type=float, default=15.0)
    p.add_argument("--max-limit", type=int, default=64, help="engine.max_num_seqs of the daemon")
    p.add_argument("--capacity-rps", type=float, help="skip the capacity sweep")
    p.add_argument("--skip-unbounded", default="", help="traces to run without that arm")
    p.add_argument(
        "--warmup-s",
        type=float,
        default=30.0,
        help="unscored lead-in before each run, at the first segment's load or, for a trace "
        'with "lead_in": "tail", its own end (0: cold start)',
    )
    p.add_argument(
        "--controller-start",
        type=int,
        default=CONTROLLER_START,
        help="the limit the controller arm starts each run from (default 8, the three-phase "
        "tuning's baseline; --max-limit is the shipped daemon's start)",
    )
    p.add_argument(
        "--levels-for",
        action="append",
        default=[],
        metavar="TRACE=N,N",
        help="static levels for one trace (default --levels)",
    )
    p.add_argument(
        "--headroom-tpot-s",
        default="",
        metavar="S,S",
        help="also run the controller steered to each of these TPOTs (seconds, under "
        "--slo-tpot-s) every seed, scored against the SLO: what headroom costs and buys",
    )
    p.add_argument(
        "--ceiling-arms",
        default="",
        metavar="N,N",
        help="also run the controller under each of these ceilings (PUT /admin/controller "
        "max) every seed: what a ceiling near the box's knee costs and buys",
    )
    p.add_argument("--machine", default="2 cores / 24 GiB, no GPU, vLLM CPU engine")
    p.add_argument("--markdown", help="write the table into this file's --section")
    p.add_argument("--section", default="goodput_trace", help="the markdown section's name")
    p.add_argument("--json-out", help="write every number to this file")
    p.add_argument(
        "--reuse",
        type=Path,
        help="an earlier --json-out: its static and unbounded runs of these traces stand, "
        "only the controller runs (for a change that touches auto mode alone); the best "
        "static limit's seed 0 runs again first, and a move past --reuse-tolerance refuses",
    )
    p.add_argument(
        "--reuse-tolerance",
        type=float,
        default=REUSE_TOLERANCE,
        help=f"how far (a fraction) the --reuse check run may move (default {REUSE_TOLERANCE})",
    )
    args = p.parse_args(argv)
    try:
        traces = tuple(load_trace(t.strip()) for t in args.traces.split(",") if t.strip())
        levels = tuple(int(x) for x in args.levels.split(",") if x.strip())
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if not traces or not levels or any(n < 1 for n in levels):
        raise SystemExit("traces: need at least one; levels: whole numbers >= 1")
    if args.runs < 1:
        raise SystemExit(f"runs: must be >= 1, got {args.runs}")
    if not args.slo_ttft_s > 0 or args.max_tokens < 1 or args.drain_s < 0:
        raise SystemExit("slo-ttft-s must be > 0, max-tokens >= 1, drain-s >= 0")
    plan = Plan(
        traces=traces,
        runs=args.runs,
        levels=levels,
        slo=GoodputSlo(args.slo_ttft_s, args.slo_tpot_s or None),
        max_tokens=args.max_tokens,
        drain_s=args.drain_s,
        max_limit=args.max_limit,
        capacity_rps=args.capacity_rps,
        skip_unbounded=tuple(t.strip() for t in args.skip_unbounded.split(",") if t.strip()),
        levels_for=_levels_for(args.levels_for),
        warmup_s=max(0.0, args.warmup_s),
        controller_start=args.controller_start,
        reuse_tolerance=args.reuse_tolerance,
        headroom_tpot_s=_headroom_targets(args.headroom_tpot_s, args.slo_tpot_s),
        ceilings=_ceilings(args.ceiling_arms, args.max_limit),
    )
    if not 0 < plan.reuse_tolerance < 1:
        raise SystemExit(f"reuse-tolerance: a fraction in (0, 1), got {plan.reuse_tolerance}")
    try:
        arm_bodies("controller", plan.max_limit, plan.controller_start)  # before any daemon
    except ValueError as exc:
        raise SystemExit(f"--controller-start (--max-limit {plan.max_limit}): {exc}") from None
    reuse_notes: list[str] = []
    if args.reuse is not None:
        reuse, reuse_notes = load_reuse(args.reuse, plan)
        plan = replace(plan, reuse=reuse)
    token = Path(args.token_file).read_text().strip() if args.token_file else None
    doc = asyncio.run(run(plan, None if args.start else args.url, token))
    doc["notes"] += reuse_notes
    doc["command"] = "python bench/goodput_trace.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    doc["machine"] = args.machine
    publish_doc(render_markdown(doc), doc, args.markdown, args.section, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
