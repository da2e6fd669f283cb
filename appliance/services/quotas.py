"""Each key's per-minute window, kept from request to request."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from appliance.domain.api_keys import (
    KeySpec,
    RateWindow,
    rate_limited,
    ratelimit_headers,
    window_for,
)


@dataclass(frozen=True)
class Charge:
    """What one admitted request was charged, and the x-ratelimit-* headers its answer gets."""

    key: str
    tokens: int
    headers: dict[str, str] = field(default_factory=dict)


class Quotas:
    """Admits a request against its key's limits (RateLimited when over) and settles the
    token estimate with the real count afterwards."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._windows: dict[str, tuple[KeySpec, RateWindow]] = {}

    def admit(self, spec: KeySpec, tokens: int) -> Charge:
        """Count the request, or raise RateLimited naming the key and the limit."""
        window = self._window(spec)
        if window is None:
            return Charge(spec.name, 0)
        decision = window.admit(self._clock(), tokens)
        if not decision.allowed:
            raise rate_limited(spec, decision)
        return Charge(spec.name, tokens, ratelimit_headers(decision))

    def settle(self, charge: Charge, actual_tokens: int) -> None:
        """Replace the charge's estimate by what the request really used."""
        held = self._windows.get(charge.key)
        if held is not None and charge.tokens:
            held[1].settle(self._clock(), charge.tokens, actual_tokens)

    def _window(self, spec: KeySpec) -> RateWindow | None:
        held = self._windows.get(spec.name)
        if held is not None and held[0] == spec:
            return held[1]
        # New key, or its limits changed (a revoke and re-add under the same name): a fresh
        # window, so the old limits' history does not count against the new ones.
        window = window_for(spec)
        if window is None:
            self._windows.pop(spec.name, None)
            return None
        self._windows[spec.name] = (spec, window)
        return window
