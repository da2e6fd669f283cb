"""The availability SLO (pure): what a request and a second of readiness count as, and the
availability and error budget over a window, after the SRE workbook's method.

Availability has two halves, and both burn the same budget:
- requests: answered without a server-side failure, good / (good + bad);
- readiness time: seconds ready / (ready + down), where down is time the daemon was not
  ready for a reason nobody chose (a crash, a failing start, thermal protection).
Time an operator or the maintenance schedule chose (paused, draining for a shutdown, a
graceful restart) is excluded from both: planned work spends no budget. A graceful restart
queues new requests and drains running ones, so it loses none; if it does lose one (the
drain timed out, the new engine fails to start) that request or that time counts as bad.

The two halves combine as a product: availability = request ratio x time ratio, so the
error (1 - availability) is about the sum of the two error fractions. The request half
alone misses an outage nobody happened to call into (quiet hours, a balancer that already
sent clients elsewhere because /health/ready said 503); the time half alone misses a box
that is "ready" but answers 500s. The minimum would let the smaller failure hide behind
the bigger one; the product counts both. A crash under load is counted twice (its failed
requests and its down time): deliberate, a crash under load hurts users twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

OBJECTIVE = 0.999
BUDGET_PERIOD_S = 30 * 86400.0
# The windows the daemon reports from its own history, shortest first.
WINDOWS_S: dict[str, float] = {"1d": 86400.0, "7d": 7 * 86400.0, "30d": BUDGET_PERIOD_S}


class RequestClass(StrEnum):
    GOOD = "good"
    BAD = "bad"
    EXCLUDED = "excluded"


class TimeClass(StrEnum):
    UP = "up"
    DOWN = "down"
    EXCLUDED = "excluded"


# Answered: the whole answer, or the part a client's deadline left time for (by design).
_ANSWERED = frozenset({"ok", "deadline"})
# Readiness reasons someone chose: an operator's pause, a SIGTERM's drain, a stopped engine.
_CHOSEN = frozenset({"paused", "draining", "stopped"})
# Readiness reasons that are planned unless the start behind them follows a crash or failed.
_STARTS = frozenset({"starting", "restarting"})


def classify_time(reason: str, unplanned: bool = False) -> TimeClass:
    """What a moment with readiness `reason` ("ready" or a /health/ready reason) counts as.

    `unplanned`: the start in progress follows a crash of the previous daemon run, or an
    engine start has failed since the engine was last ready.

    Thermal `protect` is DOWN. The appliance refuses all but realtime traffic on purpose,
    to save the hardware, but nobody planned it: a hot room or a failing fan caused it, and
    users lose service exactly as in a crash. Excluding it would show 100 % through a
    cooling failure, which is what the budget exists to surface.
    """
    if reason == "ready":
        return TimeClass.UP
    if reason in _CHOSEN:
        return TimeClass.EXCLUDED
    if reason in _STARTS:
        return TimeClass.DOWN if unplanned else TimeClass.EXCLUDED
    return TimeClass.DOWN  # engine_dead, protect, and anything unknown: not chosen by anyone


def classify_request(status: str, readiness: TimeClass) -> RequestClass:
    """What a request that ended with accounting `status` counts as, given the readiness
    class at that moment (which tells a planned 503 from an unplanned one).

    Bad: a server-side failure (`error`: a 5xx or an engine failure mid-answer) and a 503
    `not_ready` outside planned time. Excluded: refusals by design or by the client (429
    `rejected`/`rate_limited`, 408 `deadline_queued`, 4xx, `cancelled` by a client that
    went away) and a 503 in planned time: the server neither answered nor failed them.
    """
    if status in _ANSWERED:
        return RequestClass.GOOD
    if status == "error":
        return RequestClass.BAD
    if status == "not_ready":
        return RequestClass.EXCLUDED if readiness is TimeClass.EXCLUDED else RequestClass.BAD
    return RequestClass.EXCLUDED


@dataclass(frozen=True)
class SloTotals:
    """What a window holds: requests good and bad, seconds up and down."""

    good: float = 0.0
    bad: float = 0.0
    up_s: float = 0.0
    down_s: float = 0.0

    def __add__(self, other: SloTotals) -> SloTotals:
        return SloTotals(
            self.good + other.good,
            self.bad + other.bad,
            self.up_s + other.up_s,
            self.down_s + other.down_s,
        )


@dataclass(frozen=True)
class Availability:
    """A window's availability: each half and their product; None where there is no data."""

    request_ratio: float | None
    time_ratio: float | None
    ratio: float | None


@dataclass(frozen=True)
class ErrorBudget:
    """The budget of one period: the error the objective allows, the share used and left.

    `remaining_ratio` is 1 with nothing spent and goes below 0 once the budget is overspent
    (the SRE workbook's convention: the overspend is worth seeing).
    """

    objective: float
    allowed_error_ratio: float
    consumed_ratio: float
    remaining_ratio: float


def _ratio(good: float, bad: float) -> float | None:
    total = good + bad
    return None if total <= 0 else good / total


def availability_of(totals: SloTotals) -> Availability:
    """Both halves and their product; a half with no data does not count against the other."""
    req = _ratio(totals.good, totals.bad)
    up = _ratio(totals.up_s, totals.down_s)
    if req is None and up is None:
        return Availability(None, None, None)
    return Availability(req, up, (1.0 if req is None else req) * (1.0 if up is None else up))


def error_budget(availability: float | None, objective: float = OBJECTIVE) -> ErrorBudget:
    """The budget a period's availability leaves; no data spends nothing."""
    if not 0 < objective < 1:
        raise ValueError(f"objective must be in (0, 1), got {objective}")
    allowed = 1.0 - objective
    consumed = 0.0 if availability is None else (1.0 - availability) / allowed
    return ErrorBudget(objective, allowed, consumed, 1.0 - consumed)


def burn_rate(error_ratio: float, objective: float = OBJECTIVE) -> float:
    """How many times faster than the objective allows the budget burns (1: exactly used up
    at the end of the period)."""
    return error_ratio / (1.0 - objective)
