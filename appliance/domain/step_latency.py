"""Live engine latency from vLLM's per-step stats (pure): what the engine does *now*.

A finished request shows the effect of a limit change on its TPOT only when it ends, a whole
request later (~10 s of 32 tokens on the CPU engine). The engine's stat logger reports every
step's inter-token gaps and first-token times as they happen, so the steps taken since a
change say within a tick or two how the new batch runs. The controller sizes its probes from
these and cuts when they run over the SLO, before a finished request could show it.

A cut judges the TPOT a request sees: the mean of the gaps over its whole decode, not over
the few steps a tick sees. On the CPU engine a step that prefills a wave of new prompts takes
1-3 s where a decode step takes 0.1-0.4 s: eight steps with one such wave in them read
0.5-0.7 s, over a 0.5 s SLO, while the requests through them saw 0.25-0.35 s, and the limit
was cut by a third on a load every request of which met its SLO at the old limit. So
`request_tpot_s` is the mean gap of the last steps, as many as a request decodes (decode gaps
per first token in the log), and where fewer steps are there, the missing ones at the median
step: a slowdown moves the median with it, a wave does not. Probes keep the span's plain mean
(`itl_mean_s`), waves and all: their projection is linear in the limit, and on the wave-free
reading they climbed into the region where the step time grows far faster than the batch
(docs/benchmarks.md, goodput_trace_wave_thermal).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from appliance.domain.latency_window import percentile


@dataclass(frozen=True)
class StepLatency:
    """The engine steps in a span: how many, their mean inter-token gap, first-token p99."""

    steps: int = 0  # steps that produced at least one decode token
    itl_count: int = 0  # inter-token gaps (one per running request per step)
    itl_mean_s: float | None = None  # ~ the TPOT of the requests running in the span
    ttft_count: int = 0
    ttft_p99_s: float | None = None  # from the engine's arrival, i.e. after admission
    # Requests that produced a token, per step: the batch these latencies were measured at.
    # A probe projects from it, not from the limit: with a queue held back by the prefill
    # budget, or a limit just raised, fewer run than the limit allows.
    batch_mean: float | None = None
    # What cuts judge: the TPOT of a request decoding through the last request_steps decode
    # steps (as many as a request decodes, reaching back before the span where it must), the
    # missing ones at their median step. None without decode steps.
    request_tpot_s: float | None = None
    request_steps: int = 0
    # Decode gaps per request, from the log (gaps over first tokens); None: too few requests.
    decode_gaps: float | None = None
    # The median over the span's decode steps of a step's mean gap: what a request admitted
    # now decodes at, which a wave of prefill in a few steps moves less than the mean.
    gap_median_s: float | None = None


# Fewer first tokens than this in the log: no request length (the span's mean stands).
MIN_REQUESTS_FOR_LENGTH = 8


@dataclass(frozen=True)
class _Step:
    ts_s: float
    itl_sum_s: float
    itl_count: int
    ttfts_s: tuple[float, ...]


class StepLatencyLog:
    """The engine steps of the last `max_age_s` (at most `max_steps`), newest last."""

    def __init__(self, max_age_s: float = 60.0, max_steps: int = 20_000) -> None:
        if not max_age_s > 0:
            raise ValueError(f"max_age_s: must be > 0, got {max_age_s}")
        if max_steps < 1:
            raise ValueError(f"max_steps: must be >= 1, got {max_steps}")
        self.max_age_s = max_age_s
        self._steps: deque[_Step] = deque(maxlen=max_steps)

    def add(self, now_s: float, itls_s: Sequence[float], ttfts_s: Sequence[float]) -> None:
        """One engine step: its inter-token gaps and first-token times (bad values dropped:
        this runs inside vLLM's output loop, which must never raise for our bookkeeping)."""
        itls = [x for x in itls_s if math.isfinite(x) and x >= 0]
        ttfts = tuple(x for x in ttfts_s if math.isfinite(x) and x >= 0)
        if not itls and not ttfts:
            return
        self._steps.append(_Step(now_s, math.fsum(itls), len(itls), ttfts))
        cutoff = now_s - self.max_age_s
        while self._steps and self._steps[0].ts_s < cutoff:
            self._steps.popleft()

    def since(
        self,
        since_s: float,
        *,
        min_steps: int = 0,
        floor_s: float = -math.inf,
        request_floor_s: float | None = None,
    ) -> StepLatency:
        """The steps at or after since_s; where fewer than min_steps decode steps are, back
        to the last min_steps of them, but never before floor_s.

        A span of seconds alone is blind where it matters: a step takes about one TPOT, so
        at a TPOT over its SLO fewer steps fit in the span than a judgement needs (8 steps
        in 4 s is a step under 0.5 s, i.e. under the SLO). A limit that broke the SLO
        slowly was then judged on finished requests only, a whole request (~30 s) late.

        The request TPOT reaches back as many decode steps as a request decodes, where the
        log knows its length (module docstring), never before request_floor_s (floor_s
        where None): the caller may let a request's decode reach further back than the
        steps that judge the moment."""
        logged = tuple(self._steps)
        steps = tuple(s for s in logged if s.ts_s >= floor_s)
        span = _reach_back(steps, since_s, min_steps)
        gaps = decode_gaps(logged)
        wanted = max(min_steps, math.ceil(gaps)) if gaps is not None and min_steps > 0 else 0
        request_span = span
        if wanted > min_steps:
            reachable = steps
            if request_floor_s is not None and request_floor_s != floor_s:
                reachable = tuple(s for s in logged if s.ts_s >= request_floor_s)
            request_span = _reach_back(reachable, since_s, wanted)
        itl_count = sum(s.itl_count for s in span)
        ttfts = [t for s in span for t in s.ttfts_s]
        return StepLatency(
            steps=sum(1 for s in span if s.itl_count),
            itl_count=itl_count,
            itl_mean_s=_mean_gap(span),
            ttft_count=len(ttfts),
            ttft_p99_s=percentile(ttfts, 99) if ttfts else None,
            batch_mean=(itl_count + len(ttfts)) / len(span) if span else None,
            request_tpot_s=request_tpot(request_span, gaps),
            request_steps=sum(1 for s in request_span if s.itl_count),
            decode_gaps=gaps,
            gap_median_s=_median_gap(span),
        )


def _reach_back(steps: Sequence[_Step], since_s: float, min_steps: int) -> tuple[_Step, ...]:
    """The steps at or after since_s, or the last min_steps decode steps where fewer are."""
    start = since_s
    if min_steps > 0:
        decode = [s.ts_s for s in steps if s.itl_count]
        if decode:
            start = min(since_s, decode[-min(min_steps, len(decode))])
    return tuple(s for s in steps if s.ts_s >= start)


def _mean_gap(steps: Sequence[_Step]) -> float | None:
    count = sum(s.itl_count for s in steps)
    return math.fsum(s.itl_sum_s for s in steps) / count if count else None


def _per_step_gaps(steps: Sequence[_Step]) -> list[float]:
    """Each decode step's mean gap."""
    return [s.itl_sum_s / s.itl_count for s in steps if s.itl_count]


def _median_gap(steps: Sequence[_Step]) -> float | None:
    per_step = _per_step_gaps(steps)
    return statistics.median(per_step) if per_step else None


def decode_gaps(steps: Sequence[_Step]) -> float | None:
    """Decode gaps per request over these steps: every request has one first token and its
    gaps after it. None under MIN_REQUESTS_FOR_LENGTH first tokens."""
    firsts = sum(len(s.ttfts_s) for s in steps)
    if firsts < MIN_REQUESTS_FOR_LENGTH:
        return None
    return max(1.0, sum(s.itl_count for s in steps) / firsts)


def request_tpot(steps: Sequence[_Step], gaps: float | None) -> float | None:
    """The TPOT of a request decoding through these steps: their mean gap where they are as
    many as its decode gaps (or its length is not known), else the missing steps at the
    median step's gap."""
    mean_s = _mean_gap(steps)
    per_step = _per_step_gaps(steps)
    if mean_s is None or gaps is None or len(per_step) >= gaps:
        return mean_s
    missing = gaps - len(per_step)
    return (mean_s * len(per_step) + missing * statistics.median(per_step)) / gaps
