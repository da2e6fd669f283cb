"""API keys as principals (pure): what a key may do, and whether it may do it now.

A key carries a lane ceiling, optional per-minute request and token limits and an optional
share of the concurrency limit. `entitle` turns a requested lane into the lane served (or a
403), `RateWindow` answers whether a request fits the key's last minute (or a 429 with OpenAI's
x-ratelimit-* headers), `key_cap` says how many requests the key may have in flight.
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass
from typing import Final

from appliance.domain.lanes import Lane
from appliance.errors import ApplianceError

NAME_PATTERN: Final = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
MAX_WEIGHT: Final = 100
WINDOW_S: Final = 60.0


class InvalidKeySpec(ValueError):
    """A key's field is outside its limit; `field` names the KeySpec field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class KeySpec:
    """What one key may do. Checked on construction: a bad value raises InvalidKeySpec."""

    name: str
    # The highest-priority lane allowed: REALTIME allows all three, BATCH only batch.
    max_lane: Lane
    # Asked above the ceiling: served at the ceiling instead of a 403.
    downgrade: bool = False
    requests_per_min: int | None = None
    tokens_per_min: int | None = None
    # In (0, 1]: at most ceil(share * limit) of the key's requests in flight.
    concurrency_share: float | None = None
    # Fairness weight inside a lane.
    weight: int = 1

    def __post_init__(self) -> None:
        if not NAME_PATTERN.fullmatch(self.name):
            raise InvalidKeySpec(
                "name",
                "must be 1 to 64 of a-z 0-9 _ . - starting with a letter or digit, "
                f"got {self.name!r}",
            )
        for field, value in (
            ("requests_per_min", self.requests_per_min),
            ("tokens_per_min", self.tokens_per_min),
        ):
            if value is not None and (isinstance(value, bool) or value < 1):
                raise InvalidKeySpec(field, f"must be at least 1, got {value}")
        share = self.concurrency_share
        if share is not None and not 0.0 < share <= 1.0:
            raise InvalidKeySpec("concurrency_share", f"must be in (0, 1], got {share}")
        if not 1 <= self.weight <= MAX_WEIGHT:
            raise InvalidKeySpec("weight", f"must be 1 to {MAX_WEIGHT}, got {self.weight}")

    @property
    def lanes(self) -> tuple[Lane, ...]:
        """The lanes this key may use, highest priority first."""
        return tuple(lane for lane in Lane if lane >= self.max_lane)

    def as_dict(self) -> dict[str, object]:
        """What the key may do, as JSON-able fields (the same in the CLI and the admin API)."""
        return {
            "name": self.name,
            "max_lane": self.max_lane.label,
            "lanes": [lane.label for lane in self.lanes],
            "downgrade": self.downgrade,
            "requests_per_min": self.requests_per_min,
            "tokens_per_min": self.tokens_per_min,
            "concurrency_share": self.concurrency_share,
            "weight": self.weight,
        }

    @property
    def limited(self) -> bool:
        """True when the key has a per-minute limit (so it needs a RateWindow)."""
        return self.requests_per_min is not None or self.tokens_per_min is not None


# Open mode (no keys configured): today's behaviour, every lane and no limits.
ANONYMOUS: Final = KeySpec(name="anonymous", max_lane=Lane.REALTIME)


# --- lanes -------------------------------------------------------------------------------


class LaneForbidden(ApplianceError):
    """The key asked for a lane above its ceiling and is not configured to be downgraded."""

    status = 403
    type = "permission_error"
    code = "lane_not_allowed"


@dataclass(frozen=True)
class LaneGrant:
    """The lane a request is served in, and why."""

    lane: Lane
    downgraded: bool
    reason: str


def entitle(spec: KeySpec, asked: Lane | None) -> LaneGrant:
    """The lane served for `asked` (None: the client named none); LaneForbidden above the
    key's ceiling unless the key is configured to be downgraded."""
    ceiling = spec.max_lane
    if asked is None:
        # No priority named: interactive, or the ceiling when the key may not go that high.
        # Never a 403 then: the client did not ask for anything it may not have.
        lane = max(Lane.INTERACTIVE, ceiling)
        why = "no priority asked: " + (
            "interactive, the default" if lane == Lane.INTERACTIVE else "the key's ceiling"
        )
        return LaneGrant(lane, downgraded=False, reason=f"{why} ({lane.label})")
    if asked >= ceiling:
        return LaneGrant(asked, downgraded=False, reason=f"{asked.label}: within the ceiling")
    if spec.downgrade:
        return LaneGrant(
            ceiling,
            downgraded=True,
            reason=f"{asked.label} asked, above the ceiling: downgraded to {ceiling.label}",
        )
    allowed = ", ".join(lane.label for lane in spec.lanes)
    raise LaneForbidden(
        f"priority: key {spec.name!r} may not use the {asked.label} lane; its ceiling is "
        f"{ceiling.label} (allowed: {allowed})",
        param="priority",
    )


# --- concurrency share -------------------------------------------------------------------


def key_cap(spec: KeySpec, limit: int) -> int | None:
    """The most requests the key may have in flight under `limit`; None means no cap."""
    if spec.concurrency_share is None:
        return None
    # Rounded first: 0.3 * 10 is 3.0000000000000004, whose ceiling would give 4, not 3.
    return max(1, math.ceil(round(spec.concurrency_share * limit, 9)))


# --- per-minute limits -------------------------------------------------------------------


@dataclass(frozen=True)
class RateDecision:
    """Whether a request fits the key's last minute. When allowed, remaining and reset are as
    they will be once the request is counted (what the response's headers should say); when
    refused, as they are now. None: the key has no such limit."""

    allowed: bool
    limit_requests: int | None
    remaining_requests: int | None
    reset_requests_s: float | None
    limit_tokens: int | None
    remaining_tokens: int | None
    reset_tokens_s: float | None
    # Seconds until the request would fit; None when allowed, or when it never can (a
    # request that asks more tokens than the key's whole minute).
    retry_after_s: float | None
    reason: str


@dataclass
class _Use:
    """One counted request (or a correction): when, how many requests, how many tokens."""

    at_s: float
    requests: int
    tokens: int
    settled: bool = False


class RateWindow:
    """A key's usage over the last 60 s, as an exact sliding log of what it was charged.

    A sliding log rather than a token bucket: a bucket of a minute's size that refills
    continuously lets through up to twice the limit in some 60 s span (a full bucket, then
    its refill), while the issue's limit is "per minute" and the log holds it in every 60 s
    span. The cost is one entry per request of the last minute, bounded by what admission
    lets through; and reset times are exact (when the charged entries leave the window).
    """

    def __init__(self, requests_per_min: int | None, tokens_per_min: int | None) -> None:
        self.requests_per_min = requests_per_min
        self.tokens_per_min = tokens_per_min
        self._log: deque[_Use] = deque()
        # Running totals of the log, so a check costs nothing per request in the window.
        self._requests = 0
        self._tokens = 0

    def check(self, now_s: float, tokens: int) -> RateDecision:
        """Would one request charged `tokens` fit now? Counts nothing."""
        self._expire(now_s)
        used_req, used_tok = self._requests, self._tokens
        waits: list[float] = []
        problems: list[str] = []
        never = False
        rpm, tpm = self.requests_per_min, self.tokens_per_min
        if rpm is not None and used_req + 1 > rpm:
            waits.append(self._wait_until_freed(now_s, used_req + 1 - rpm, "requests"))
            problems.append(f"{rpm} requests per minute ({used_req} in the last 60 s)")
        if tpm is not None and tokens > tpm:
            never = True
            problems.append(f"{tpm} tokens per minute (this request alone needs {tokens})")
        elif tpm is not None and used_tok + tokens > tpm:
            waits.append(self._wait_until_freed(now_s, used_tok + tokens - tpm, "tokens"))
            problems.append(
                f"{tpm} tokens per minute ({used_tok} in the last 60 s, this request needs "
                f"{tokens})"
            )
        allowed = not problems
        add_req, add_tok = (1, tokens) if allowed else (0, 0)
        after_req, after_tok = used_req + add_req, used_tok + add_tok
        return RateDecision(
            allowed=allowed,
            limit_requests=rpm,
            remaining_requests=None if rpm is None else max(0, rpm - after_req),
            reset_requests_s=None if rpm is None else self._reset_s(now_s, add_req, "requests"),
            limit_tokens=tpm,
            remaining_tokens=None if tpm is None else max(0, tpm - after_tok),
            reset_tokens_s=None if tpm is None else self._reset_s(now_s, add_tok, "tokens"),
            retry_after_s=None if allowed or never else max(waits),
            reason="within the limits" if allowed else "over " + " and ".join(problems),
        )

    def consume(self, now_s: float, tokens: int) -> None:
        """Count one request charged `tokens` (an estimate, settled after the answer)."""
        self._expire(now_s)
        self._append(_Use(now_s, requests=1, tokens=tokens))

    def admit(self, now_s: float, tokens: int) -> RateDecision:
        """check, and consume when allowed: one call for the admission path."""
        decision = self.check(now_s, tokens)
        if decision.allowed:
            self.consume(now_s, tokens)
        return decision

    def settle(self, now_s: float, charged: int, actual: int) -> None:
        """Replace a request's estimate by its real token count, once it is known."""
        self._expire(now_s)
        # The request's own entry: the oldest unsettled one charged this much (requests with
        # the same estimate are interchangeable). None when it has left the window already.
        use = next(
            (u for u in self._log if u.requests and not u.settled and u.tokens == charged),
            None,
        )
        if use is not None:
            use.settled = True
        if actual < charged and use is not None:
            # A refund goes back where it was charged; one that left counts nothing anyway.
            use.tokens = actual
            self._tokens -= charged - actual
        elif actual > charged:
            # The excess was generated up to now: it counts for the next 60 s.
            self._append(_Use(now_s, requests=0, tokens=actual - charged, settled=True))

    def _append(self, use: _Use) -> None:
        self._log.append(use)
        self._requests += use.requests
        self._tokens += use.tokens

    def _expire(self, now_s: float) -> None:
        # The window is (now - 60, now]: a use at t counts until t + 60, exclusive.
        while self._log and self._log[0].at_s <= now_s - WINDOW_S:
            gone = self._log.popleft()
            self._requests -= gone.requests
            self._tokens -= gone.tokens

    def _wait_until_freed(self, now_s: float, needed: int, what: str) -> float:
        """Seconds until `needed` requests or tokens have left the window."""
        freed = 0
        for use in self._log:
            freed += use.requests if what == "requests" else use.tokens
            if freed >= needed:
                return use.at_s + WINDOW_S - now_s
        return WINDOW_S  # not reached while needed <= what the log holds

    def _reset_s(self, now_s: float, adding: int, what: str) -> float:
        """Seconds until the window is back to its initial state (nothing counted); `adding`
        is what the request being decided adds (0 when refused)."""
        if adding:
            # The request being admitted is the newest use: it leaves last.
            return WINDOW_S
        newest = next(
            (u for u in reversed(self._log) if (u.requests if what == "requests" else u.tokens)),
            None,
        )
        return 0.0 if newest is None else newest.at_s + WINDOW_S - now_s


def window_for(spec: KeySpec) -> RateWindow | None:
    """A fresh window for the key's limits; None when the key has none."""
    if not spec.limited:
        return None
    return RateWindow(spec.requests_per_min, spec.tokens_per_min)


# --- OpenAI's headers and the 429 ---------------------------------------------------------


def format_reset(seconds: float) -> str:
    """A duration as OpenAI writes it (Go's time.Duration): "20ms", "1s", "1.5s", "6m0s"."""
    ms = max(0, round(seconds * 1000))
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest_ms = divmod(ms, 3_600_000)
    minutes, rest_ms = divmod(rest_ms, 60_000)
    secs = f"{rest_ms / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def ratelimit_headers(d: RateDecision) -> dict[str, str]:
    """OpenAI's x-ratelimit-* headers, for the limits the key has (none without limits)."""
    headers: dict[str, str] = {}
    for what, limit, remaining, reset in (
        ("requests", d.limit_requests, d.remaining_requests, d.reset_requests_s),
        ("tokens", d.limit_tokens, d.remaining_tokens, d.reset_tokens_s),
    ):
        if limit is None:
            continue
        headers[f"x-ratelimit-limit-{what}"] = str(limit)
        headers[f"x-ratelimit-remaining-{what}"] = str(remaining if remaining is not None else 0)
        headers[f"x-ratelimit-reset-{what}"] = format_reset(reset or 0.0)
    return headers


class RateLimited(ApplianceError):
    """The key is over a per-minute limit: 429 with Retry-After and x-ratelimit-* headers."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after_s: int, headers: dict[str, str]) -> None:
        super().__init__(message)
        self.retry_after_s = max(1, int(retry_after_s))
        # The x-ratelimit-* headers; api/errors.py adds Retry-After from retry_after_s.
        self.headers = headers


def rate_limited(spec: KeySpec, decision: RateDecision) -> RateLimited:
    """The 429 for a refused decision: names the key and the limit it is over."""
    if decision.retry_after_s is None:
        # A request bigger than the key's minute never fits; a minute is the honest wait
        # for a smaller one, and the message says why this one cannot pass.
        retry_s, when = WINDOW_S, "it cannot pass as it is; ask for fewer tokens"
    else:
        retry_s = decision.retry_after_s
        when = f"retry in {max(1, math.ceil(retry_s))} s"
    limits = decision.reason.removeprefix("over ")
    return RateLimited(
        f"key {spec.name!r} is over its limit of {limits}; {when}",
        retry_after_s=max(1, math.ceil(retry_s)),
        headers=ratelimit_headers(decision),
    )
