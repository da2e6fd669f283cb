"""Prefill work in the engine: how fast it goes, and how much of it admission lets in. Pure.

A request's time to first token, once admitted, is the prompt work ahead of it in the engine
plus its own, over the rate the engine gets through prompt work. A limit on the *number* of
running requests cannot see that: 16 chat turns of 100 tokens and 16 documents of 1,500 are
the same count and 15x the work. So admission also keeps the prompt tokens still waiting for
their first token (the "prefill backlog") under a budget, and the controller sets that
budget to the backlog the engine clears within a share of the TTFT SLO, at the rate it
measured:

    budget_tokens = rate_tok_s x slo_ttft_p99_s x prefill_ttft_share

The rate is measured over busy time only (time with any prefill outstanding), so an idle
box does not read as a slow one: tokens whose first token came, over the seconds the
backlog was not empty. Prompt tokens are counted as admission estimates them (characters/4
of the prompt); the rate is in the same unit, so the estimate's bias cancels out.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

# Rate samples older than this are forgotten: the engine's speed moves with the load mix.
RATE_WINDOW_S = 30.0
# Fewer completed prefills than this in the window: no rate, so no budget (admit by count).
RATE_MIN_SAMPLES = 4
RATE_MAX_SAMPLES = 256


@dataclass(frozen=True)
class PrefillSample:
    """One request's prompt reached its first token: its tokens and the busy time it closed."""

    at_s: float
    tokens: int
    busy_s: float


class PrefillTracker:
    """The prefill backlog (tokens admitted, first token not yet out) and its busy-time rate.

    Not thread-safe; the event loop owns it (admission calls it)."""

    def __init__(
        self,
        window_s: float = RATE_WINDOW_S,
        min_samples: int = RATE_MIN_SAMPLES,
        max_samples: int = RATE_MAX_SAMPLES,
    ) -> None:
        if not window_s > 0 or min_samples < 1 or max_samples < min_samples:
            raise ValueError(
                "window_s must be > 0, min_samples >= 1 and max_samples >= min_samples; got "
                f"{window_s}, {min_samples}, {max_samples}"
            )
        self.window_s = window_s
        self.min_samples = min_samples
        self.outstanding_tokens = 0
        self.outstanding_requests = 0
        self._busy_since_s: float | None = None
        self._busy_unclaimed_s = 0.0  # busy time since the last completed sample
        self._samples: deque[PrefillSample] = deque(maxlen=max_samples)

    def start(self, tokens: int, now_s: float) -> None:
        """A request with `tokens` of prompt was admitted."""
        if tokens < 0:
            raise ValueError(f"tokens: must be >= 0, got {tokens}")
        if self.outstanding_requests == 0:
            self._busy_since_s = now_s
        self.outstanding_tokens += tokens
        self.outstanding_requests += 1

    def finish(self, tokens: int, now_s: float, *, first_token: bool) -> None:
        """The request's prefill ended: its first token came (a rate sample), or it ended
        without one (cancelled, failed): its busy time then counts towards the next sample,
        which keeps the rate on the slow side rather than crediting work never done."""
        if self.outstanding_requests <= 0:
            raise ValueError("finish() without a matching start()")
        self._close_busy(now_s)
        self.outstanding_tokens = max(0, self.outstanding_tokens - tokens)
        self.outstanding_requests -= 1
        if first_token:
            self._samples.append(PrefillSample(now_s, tokens, self._busy_unclaimed_s))
            self._busy_unclaimed_s = 0.0
        self._busy_since_s = now_s if self.outstanding_requests else None

    def _close_busy(self, now_s: float) -> None:
        if self._busy_since_s is not None:
            self._busy_unclaimed_s += max(0.0, now_s - self._busy_since_s)
            self._busy_since_s = now_s

    def rate_tok_s(self, now_s: float) -> float | None:
        """Prompt tokens per busy second over the window; None with too few samples."""
        while self._samples and now_s - self._samples[0].at_s > self.window_s:
            self._samples.popleft()
        if len(self._samples) < self.min_samples:
            return None
        tokens = sum(s.tokens for s in self._samples)
        busy = sum(s.busy_s for s in self._samples)
        if busy <= 0:
            return None  # every prefill finished within the clock's resolution
        return tokens / busy

    def samples_in_window(self) -> int:
        """Rate samples the last rate_tok_s() call kept."""
        return len(self._samples)


@dataclass(frozen=True)
class PrefillBudget:
    """The prefill backlog admission may hold (None: no token budget), and why."""

    tokens: int | None
    rate_tok_s: float | None
    reason: str


def prefill_budget(
    rate_tok_s: float | None,
    slo_ttft_p99_s: float,
    ttft_share: float | None,
    *,
    auto: bool,
) -> PrefillBudget:
    """The budget for the next tick, from the measured rate and the TTFT SLO."""
    if not auto:
        return PrefillBudget(None, rate_tok_s, "manual mode: the operator's limit alone")
    if ttft_share is None:
        return PrefillBudget(None, rate_tok_s, "prefill budget off (prefill_ttft_share null)")
    if rate_tok_s is None or not math.isfinite(rate_tok_s) or rate_tok_s <= 0:
        return PrefillBudget(
            None, None, "no prefill budget yet: too few first tokens in the window to rate"
        )
    target_s = slo_ttft_p99_s * ttft_share
    tokens = max(1, math.floor(rate_tok_s * target_s))
    return PrefillBudget(
        tokens,
        rate_tok_s,
        f"prefill budget {tokens} tokens: the engine clears {rate_tok_s:.0f} prompt tok/s, "
        f"x {target_s:g} s ({ttft_share:g} of the {slo_ttft_p99_s:g} s TTFT SLO)",
    )


def budget_moved(old: int | None, new: int | None, ratio: float = 0.25) -> bool:
    """Worth an event: switched on or off, or moved by more than `ratio` of the old one."""
    if old is None or new is None:
        return old != new
    return abs(new - old) > ratio * old


@dataclass(frozen=True)
class ShedVerdict:
    """Whether admission turns a request away now because its first token would come too late."""

    shed: bool
    predicted_s: float | None  # seconds to its first token at the measured rate; None: unknown
    reason: str
    retry_after_s: int = 0


def shed_verdict(
    ahead_tokens: int, own_tokens: int, rate_tok_s: float | None, shed_above_s: float | None
) -> ShedVerdict:
    """Refuse a request whose prompt, behind the `ahead_tokens` still to prefill before it,
    cannot reach its first token within `shed_above_s` at the measured rate.

    Such a request misses the TTFT SLO whatever happens next, and serving it late spends the
    engine on an answer that counts for nothing while the requests behind it miss theirs too
    (a document burst then spills into the chat after it). A 429 now, with a Retry-After
    for when the backlog will have cleared, lets the client come back or go elsewhere.
    Unknown rate or no threshold: never shed."""
    if shed_above_s is None or rate_tok_s is None or not math.isfinite(rate_tok_s):
        return ShedVerdict(False, None, "no shedding: no threshold or no measured rate")
    if rate_tok_s <= 0:
        return ShedVerdict(False, None, "no shedding: no measured rate")
    predicted = (ahead_tokens + own_tokens) / rate_tok_s
    if predicted <= shed_above_s:
        return ShedVerdict(False, predicted, f"first token in ~{predicted:.1f} s")
    retry = max(1, math.ceil(predicted - shed_above_s))
    return ShedVerdict(
        True,
        predicted,
        f"its first token would come in ~{predicted:.1f} s, past the {shed_above_s:g} s "
        f"TTFT objective: {ahead_tokens} prompt tokens wait ahead of its {own_tokens}, and "
        f"the engine clears {rate_tok_s:.0f} tok/s",
        retry,
    )
