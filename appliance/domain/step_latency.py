"""Live engine latency from vLLM's per-step stats (pure): what the engine does *now*.

A finished request shows the effect of a limit change on its TPOT only when it ends, a whole
request later (~10 s of 32 tokens on the CPU engine). The engine's stat logger reports every
step's inter-token gaps and first-token times as they happen, so the steps taken since a
change say within a tick or two how the new batch runs. The controller sizes its probes from
these and cuts when they run over the SLO, before a finished request could show it.
"""

from __future__ import annotations

import math
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
        self, since_s: float, *, min_steps: int = 0, floor_s: float = -math.inf
    ) -> StepLatency:
        """The steps at or after since_s; where fewer than min_steps decode steps are, back
        to the last min_steps of them, but never before floor_s.

        A span of seconds alone is blind where it matters: a step takes about one TPOT, so
        at a TPOT over its SLO fewer steps fit in the span than a judgement needs (8 steps
        in 4 s is a step under 0.5 s, i.e. under the SLO). A limit that broke the SLO
        slowly was then judged on finished requests only, a whole request (~30 s) late."""
        steps = tuple(s for s in tuple(self._steps) if s.ts_s >= floor_s)
        start = since_s
        if min_steps > 0:
            decode = [s.ts_s for s in steps if s.itl_count]
            if decode:
                start = min(since_s, decode[-min(min_steps, len(decode))])
        steps = tuple(s for s in steps if s.ts_s >= start)
        itl_count = sum(s.itl_count for s in steps)
        ttfts = [t for s in steps for t in s.ttfts_s]
        return StepLatency(
            steps=sum(1 for s in steps if s.itl_count),
            itl_count=itl_count,
            itl_mean_s=math.fsum(s.itl_sum_s for s in steps) / itl_count if itl_count else None,
            ttft_count=len(ttfts),
            ttft_p99_s=percentile(ttfts, 99) if ttfts else None,
            batch_mean=(itl_count + len(ttfts)) / len(steps) if steps else None,
        )
