"""Admission: bounded priority lanes in front of a concurrency limit."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from appliance.config import AdmissionConfig
from appliance.domain.api_keys import ANONYMOUS, KeySpec, key_cap
from appliance.domain.fair_queue import FairQueue
from appliance.domain.lanes import Lane
from appliance.domain.prefill import PrefillTracker, shed_verdict
from appliance.errors import ApplianceError, NotReady, Overloaded


class DeadlineExceeded(ApplianceError):
    """The request's deadline passed before it reached the engine."""

    status = 408
    type = "timeout_error"
    code = "deadline_exceeded"
    retryable = False


@dataclass(eq=False)
class _Waiter:
    lane: Lane
    claimant: KeySpec
    future: asyncio.Future[None]
    enqueued_s: float
    held_at_enqueue_s: float  # the queue's held-time counter when this request joined
    prefill_tokens: int = 0


class Slot:
    """One granted engine slot; tells admission when the request's prefill ended."""

    def __init__(self, queue: AdmissionQueue, prefill_tokens: int) -> None:
        self._queue = queue
        self.prefill_tokens = prefill_tokens
        self.prefill_done = False

    def first_token(self, now_s: float | None = None) -> None:
        """The first token came: the prompt's work is out of the prefill backlog."""
        if not self.prefill_done:
            self.prefill_done = True
            self._queue._prefill_finished(self, now_s, first_token=True)


@dataclass(frozen=True)
class AdmissionSnapshot:
    """What the queue looks like right now."""

    limit: int
    base_limit: int
    derate_factor: float
    reserved_realtime: int
    protect: bool
    in_flight: int
    running: dict[str, int]
    queued: dict[str, int]
    dispatching: bool
    admitted_total: int
    running_by_key: dict[str, int]
    queued_by_key: dict[str, int]
    prefill_budget_tokens: int | None = None
    prefill_outstanding_tokens: int = 0
    shed_above_s: float | None = None
    shed_total: dict[str, int] = field(default_factory=dict)


class AdmissionQueue:
    """Grants engine slots: realtime before interactive before batch; inside a lane, fair
    turns between keys (FIFO for one key), each key within its share of the limit.

    The effective limit is the base limit (config, later the controller) times the thermal
    derate factor. A share of it is reserved for realtime so a batch flood cannot take every
    slot; in PROTECT only realtime is dispatched.
    """

    def __init__(
        self,
        cfg: AdmissionConfig,
        clock: Callable[[], float] = time.monotonic,
        *,
        limit: int | None = None,
    ) -> None:
        """limit: the starting base limit (Config.concurrency_limit()); default: the config's."""
        base = limit if limit is not None else cfg.concurrency_limit
        if base is None:
            raise ValueError(
                "admission.concurrency_limit is null: pass limit=Config.concurrency_limit()"
            )
        self._cfg = cfg
        self._clock = clock
        self._base_limit = base
        self._derate = 1.0
        self._protect = False
        self._running = dict.fromkeys(Lane, 0)
        self._running_by_key: dict[str, int] = {}
        self._admitted_total = 0
        self._lanes: dict[Lane, FairQueue[_Waiter]] = {lane: FairQueue() for lane in Lane}
        self._capacity = {
            Lane.REALTIME: cfg.queue_capacity.realtime,
            Lane.INTERACTIVE: cfg.queue_capacity.interactive,
            Lane.BATCH: cfg.queue_capacity.batch,
        }
        # Closed while the engine restarts or is paused: requests wait instead of failing.
        self._dispatching = False
        self._changed = asyncio.Event()
        # Seconds the queue has been held closed (restart, pause), so that time does not
        # count against admission.max_queue_wait_s: a restart must not turn into 429s.
        self._held_total_s = 0.0
        self._held_since_s: float | None = self._clock()
        # Prompt tokens admitted whose first token has not come; the controller may cap them.
        self.prefill = PrefillTracker()
        self._prefill_budget: int | None = None
        # Interactive requests whose first token would come later than this are refused
        # at once (429) instead of queued; None: never (manual mode, or off).
        self._shed_above_s: float | None = None
        self.shed_total = dict.fromkeys(Lane, 0)

    @property
    def limit(self) -> int:
        """The effective limit: base x derate factor, at least 1."""
        return max(1, math.floor(self._base_limit * self._derate + 1e-9))

    @property
    def base_limit(self) -> int:
        return self._base_limit

    @property
    def reserved_realtime(self) -> int:
        """Slots only realtime may use (none when the limit is 1: someone must run)."""
        limit = self.limit
        if limit <= 1 or self._cfg.realtime_reserved_share <= 0:
            return 0
        return min(limit - 1, max(1, math.floor(limit * self._cfg.realtime_reserved_share)))

    @property
    def in_flight(self) -> int:
        return sum(self._running.values())

    @property
    def protect(self) -> bool:
        return self._protect

    def queued(self, lane: Lane | None = None) -> int:
        """Waiting requests in one lane, or in all."""
        if lane is not None:
            return len(self._lanes[lane])
        return sum(len(q) for q in self._lanes.values())

    def snapshot(self) -> AdmissionSnapshot:
        return AdmissionSnapshot(
            limit=self.limit,
            base_limit=self._base_limit,
            derate_factor=self._derate,
            reserved_realtime=self.reserved_realtime,
            protect=self._protect,
            in_flight=self.in_flight,
            running={lane.label: n for lane, n in self._running.items()},
            queued={lane.label: len(q) for lane, q in self._lanes.items()},
            dispatching=self._dispatching,
            admitted_total=self._admitted_total,
            running_by_key=dict(self._running_by_key),
            queued_by_key=self._queued_by_key(),
            prefill_budget_tokens=self._prefill_budget,
            prefill_outstanding_tokens=self.prefill.outstanding_tokens,
            shed_above_s=self._shed_above_s,
            shed_total={lane.label: n for lane, n in self.shed_total.items()},
        )

    def _queued_by_key(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for queue in self._lanes.values():
            for key, n in queue.by_key().items():
                out[key] = out.get(key, 0) + n
        return out

    def set_limit(self, limit: int) -> None:
        """Change the base limit: how many requests may run at once before derating (>= 1)."""
        if limit < 1:
            raise ValueError(f"concurrency limit must be >= 1, got {limit}")
        self._base_limit = limit
        self._dispatch()

    @property
    def prefill_budget(self) -> int | None:
        """The prefill backlog cap in prompt tokens (None: none)."""
        return self._prefill_budget

    def set_prefill_budget(self, tokens: int | None) -> None:
        """Cap the prompt tokens admitted and still without a first token (None: no cap).
        One request is always let in on an empty backlog, however long its prompt."""
        if tokens is not None and tokens < 1:
            raise ValueError(f"prefill budget must be >= 1 token or None, got {tokens}")
        self._prefill_budget = tokens
        self._dispatch()

    @property
    def shed_above_s(self) -> float | None:
        """Predicted seconds to a first token above which interactive requests are refused."""
        return self._shed_above_s

    def set_shed_above(self, seconds: float | None) -> None:
        """Refuse interactive requests predicted to reach their first token later than this
        (None: queue everything up to the lane's capacity and max_queue_wait_s)."""
        if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(
                f"shed threshold must be a number of seconds > 0 or None, got {seconds}"
            )
        self._shed_above_s = seconds

    def _prefill_ahead(self, lane: Lane) -> int:
        """Prompt tokens to prefill before a request joining `lane`: those admitted without a
        first token, and those queued in this lane and the ones served before it."""
        queued = sum(
            w.prefill_tokens for other in Lane if other <= lane for w in self._lanes[other]
        )
        return self.prefill.outstanding_tokens + queued

    def _shed_if_late(self, lane: Lane, prefill_tokens: int) -> None:
        """Raise Overloaded when this request's first token would come past the threshold.

        Only the interactive lane: the TTFT objective is about it. Realtime jumps the queue
        (and vLLM's own scheduler), and batch is there to wait. Never while the queue is
        held closed (restart, pause): the rate says nothing about that wait, and a restart
        must not turn into 429s."""
        if lane is not Lane.INTERACTIVE or self._shed_above_s is None or not self._dispatching:
            return
        verdict = shed_verdict(
            self._prefill_ahead(lane),
            prefill_tokens,
            self.prefill.rate_tok_s(self._clock()),
            self._shed_above_s,
        )
        if verdict.shed:
            self.shed_total[lane] += 1
            raise Overloaded(
                f"not queued: {verdict.reason} (controller.shed_above_ttft_ratio x "
                "slo.ttft_p99_s); retry later",
                retry_after_s=verdict.retry_after_s,
                code="ttft_unreachable",
            )

    def set_derate(self, factor: float, protect: bool = False) -> None:
        """Apply the thermal policy: scale the limit by factor; protect admits realtime only."""
        if not 0 < factor <= 1:
            raise ValueError(f"derate factor must be in (0, 1], got {factor}")
        self._derate = factor
        self._protect = protect
        self._dispatch()

    def check_lane(self, lane: Lane) -> None:
        """Raise NotReady for lanes that may not be admitted now (PROTECT)."""
        if self._protect and lane is not Lane.REALTIME:
            raise NotReady(
                "GPU thermal protection: only realtime requests are admitted",
                reason="protect",
                retry_after_s=self._cfg.retry_after_s,
            )

    def open(self) -> None:
        """Start handing slots to waiting requests."""
        if self._held_since_s is not None:
            self._held_total_s += self._clock() - self._held_since_s
            self._held_since_s = None
        self._dispatching = True
        self._dispatch()

    def close(self) -> None:
        """Stop handing out slots; new and waiting requests stay queued."""
        if self._held_since_s is None:
            self._held_since_s = self._clock()
        self._dispatching = False

    def held_s(self) -> float:
        """Total seconds the queue has been held closed so far."""
        now_held = 0.0 if self._held_since_s is None else self._clock() - self._held_since_s
        return self._held_total_s + now_held

    def _queue_wait_left_s(self, waiter: _Waiter) -> float:
        """What is left of max_queue_wait_s, not counting time the queue was held closed."""
        waited = self._clock() - waiter.enqueued_s - (self.held_s() - waiter.held_at_enqueue_s)
        return self._cfg.max_queue_wait_s - waited

    @asynccontextmanager
    async def slot(
        self,
        lane: Lane,
        deadline_s: float | None = None,
        claimant: KeySpec = ANONYMOUS,
        prefill_tokens: int = 0,
    ) -> AsyncIterator[Slot]:
        """Hold one engine slot for the body; waits in the lane's queue if needed.

        prefill_tokens: the prompt's estimated tokens, held in the prefill backlog until
        Slot.first_token() (or the slot's end)."""
        if prefill_tokens < 0:
            raise ValueError(f"prefill_tokens: must be >= 0, got {prefill_tokens}")
        await self._acquire(lane, deadline_s, claimant, prefill_tokens)
        slot = Slot(self, prefill_tokens)
        try:
            yield slot
        finally:
            if not slot.prefill_done:
                slot.prefill_done = True
                self._prefill_finished(slot, None, first_token=False)
            self._release(lane, claimant)

    def _prefill_finished(self, slot: Slot, now_s: float | None, *, first_token: bool) -> None:
        now = self._clock() if now_s is None else now_s
        self.prefill.finish(slot.prefill_tokens, now, first_token=first_token)
        self._changed.set()
        self._dispatch()

    async def _acquire(
        self, lane: Lane, deadline_s: float | None, claimant: KeySpec, prefill_tokens: int = 0
    ) -> None:
        self.check_lane(lane)
        if self._can_run_now(lane, claimant, prefill_tokens):
            self._grant(lane, claimant, prefill_tokens)
            return
        self._shed_if_late(lane, prefill_tokens)
        if len(self._lanes[lane]) >= self._capacity[lane]:
            raise Overloaded(
                f"the {lane.label} queue is full ({self._capacity[lane]} waiting); retry later",
                retry_after_s=self._cfg.retry_after_s,
            )
        loop = asyncio.get_running_loop()
        waiter = _Waiter(
            lane, claimant, loop.create_future(), self._clock(), self.held_s(), prefill_tokens
        )
        self._lanes[lane].push(claimant.name, waiter, claimant.weight)
        self._changed.set()
        # A waiter ahead may be held back only by its own key's share: this one may run now.
        self._dispatch()
        by_deadline = False
        try:
            while True:
                # The queue bound pauses while the queue is held (restart, pause); a
                # client's own deadline never does.
                timeout = self._queue_wait_left_s(waiter)
                by_deadline = deadline_s is not None and deadline_s - self._clock() < timeout
                if deadline_s is not None:
                    timeout = min(timeout, deadline_s - self._clock())
                if timeout <= 0:
                    break
                done, _ = await asyncio.wait({waiter.future}, timeout=timeout)
                if done:
                    return
        except asyncio.CancelledError:
            # The client went away while queued: it must never reach the engine.
            self._abandon(waiter)
            raise
        if not by_deadline and waiter.future.done() and not waiter.future.cancelled():
            return  # granted in the same tick its queue time ran out: it runs
        # A slot granted as the deadline passed is handed on: the engine would only cut it.
        self._abandon(waiter)
        if by_deadline:
            raise DeadlineExceeded("deadline_ms: the deadline passed while the request was queued")
        raise Overloaded(
            f"waited {self._cfg.max_queue_wait_s:g} s in the {lane.label} queue "
            "(admission.max_queue_wait_s); retry later",
            retry_after_s=self._cfg.retry_after_s,
            code="queue_timeout",
        )

    def _abandon(self, waiter: _Waiter) -> None:
        if waiter.future.done() and not waiter.future.cancelled():
            # granted in the same tick it gave up: hand it on
            self.prefill.finish(waiter.prefill_tokens, self._clock(), first_token=False)
            self._release(waiter.lane, waiter.claimant)
            return
        waiter.future.cancel()
        self._lanes[waiter.lane].remove(waiter.claimant.name, waiter)  # False: already popped
        self._changed.set()

    def _has_room(self, lane: Lane) -> bool:
        limit = self.limit
        if self.in_flight >= limit:
            return False
        if lane is Lane.REALTIME:
            return True
        if self._protect:
            return False
        non_realtime = self.in_flight - self._running[Lane.REALTIME]
        return non_realtime < limit - self.reserved_realtime

    def _under_cap(self, claimant: KeySpec) -> bool:
        cap = key_cap(claimant, self.limit)
        return cap is None or self._running_by_key.get(claimant.name, 0) < cap

    def _prefill_fits(self, lane: Lane, tokens: int) -> bool:
        """Within the prefill budget. Realtime is never held back by it (vLLM's priority
        scheduler runs its prefill first), and an empty backlog always takes one request."""
        budget = self._prefill_budget
        if budget is None or lane is Lane.REALTIME or self.prefill.outstanding_requests == 0:
            return True
        return self.prefill.outstanding_tokens + tokens <= budget

    def _can_run_now(self, lane: Lane, claimant: KeySpec, prefill_tokens: int = 0) -> bool:
        if not self._dispatching or not self._has_room(lane) or not self._under_cap(claimant):
            return False
        if not self._prefill_fits(lane, prefill_tokens):
            return False
        # Nobody of the same or a higher lane may be overtaken.
        return all(not self._lanes[other] for other in Lane if other <= lane)

    def _grant(self, lane: Lane, claimant: KeySpec, prefill_tokens: int = 0) -> None:
        self.prefill.start(prefill_tokens, self._clock())
        self._running[lane] += 1
        self._running_by_key[claimant.name] = self._running_by_key.get(claimant.name, 0) + 1
        self._admitted_total += 1
        self._changed.set()

    def _release(self, lane: Lane, claimant: KeySpec) -> None:
        self._running[lane] -= 1
        left = self._running_by_key.get(claimant.name, 0) - 1
        if left > 0:
            self._running_by_key[claimant.name] = left
        else:
            self._running_by_key.pop(claimant.name, None)
        self._changed.set()
        self._dispatch()

    def _dispatch(self) -> None:
        if not self._dispatching:
            return
        for lane in Lane:
            queue = self._lanes[lane]
            while queue and self._has_room(lane):
                # A key at its share waits; the other keys' requests go past it. Over the
                # prefill budget, a key's head waits too (FIFO within a key).
                waiter = queue.pop(
                    lambda head: (
                        self._under_cap(head.claimant)
                        and self._prefill_fits(head.lane, head.prefill_tokens)
                    )
                )
                if waiter is None:
                    if any(self._under_cap(head.claimant) for head in queue.heads()):
                        # Held by the prefill budget, not by a key's share: a lower lane's
                        # small prompt must not slip in ahead and keep this one waiting.
                        return
                    break
                if waiter.future.done():
                    continue
                waiter.future.set_result(None)
                self._grant(lane, waiter.claimant, waiter.prefill_tokens)

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until predicate() holds (re-checked on every change); False on timeout."""
        deadline = self._clock() + timeout_s
        while not predicate():
            remaining = deadline - self._clock()
            if remaining <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=min(remaining, 0.5))
        return True
