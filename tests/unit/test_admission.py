"""Admission queue: lane order, bounds, waits, cancellation, limit changes."""

from __future__ import annotations

import asyncio

import pytest

from appliance.config import AdmissionConfig, LaneConfig
from appliance.domain.api_keys import KeySpec
from appliance.errors import Overloaded
from appliance.services.admission import AdmissionQueue, DeadlineExceeded, Lane


class ManualClock:
    """A monotonic clock the test moves by hand.

    The queue reads waits, holds and deadlines from it, so a test states "an hour passed"
    instead of sleeping and bounding wall time. The queue still waits on real timers of the
    length it computes, so a waiter notices a moved clock on its next timer (at most the
    queue bound or deadline it computed, in real seconds): keep those short.
    """

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _queue(
    limit: int = 1,
    cap: int = 4,
    wait_s: float = 5.0,
    reserved: float = 0.0,
    clock: ManualClock | None = None,
) -> AdmissionQueue:
    cfg = AdmissionConfig(
        concurrency_limit=limit,
        max_queue_wait_s=wait_s,
        realtime_reserved_share=reserved,
        queue_capacity=LaneConfig(realtime=cap, interactive=cap, batch=cap),
        retry_after_s=3,
    )
    q = AdmissionQueue(cfg) if clock is None else AdmissionQueue(cfg, clock)
    q.open()
    return q


async def _enter(q: AdmissionQueue, lane: Lane, deadline_s: float | None = None) -> None:
    """Take a slot and give it back at once."""
    async with q.slot(lane, deadline_s=deadline_s):
        pass


async def _hold(
    q: AdmissionQueue, lane: Lane, order: list[str], name: str, release: asyncio.Event
) -> None:
    async with q.slot(lane):
        order.append(name)
        await release.wait()


async def test_lanes_are_served_realtime_first_then_fifo():
    q = _queue(limit=1)
    gate = asyncio.Event()
    order: list[str] = []
    first = asyncio.create_task(_hold(q, Lane.BATCH, order, "b0", gate))
    await asyncio.sleep(0)
    tasks = [
        asyncio.create_task(_hold(q, lane, order, name, gate))
        for lane, name in [
            (Lane.BATCH, "b1"),
            (Lane.INTERACTIVE, "i1"),
            (Lane.REALTIME, "r1"),
            (Lane.INTERACTIVE, "i2"),
        ]
    ]
    await asyncio.sleep(0.01)
    assert q.queued() == 4 and q.in_flight == 1
    gate.set()
    await asyncio.gather(first, *tasks)
    assert order == ["b0", "r1", "i1", "i2", "b1"]
    assert q.in_flight == 0 and q.queued() == 0


async def test_full_lane_is_rejected_with_retry_after():
    q = _queue(limit=1, cap=1)
    gate = asyncio.Event()
    order: list[str] = []
    running = asyncio.create_task(_hold(q, Lane.BATCH, order, "run", gate))
    waiting = asyncio.create_task(_hold(q, Lane.BATCH, order, "wait", gate))
    await asyncio.sleep(0.01)
    with pytest.raises(Overloaded) as err:
        async with q.slot(Lane.BATCH):
            pass
    assert err.value.retry_after_s == 3 and "batch queue is full (1 waiting)" in err.value.message
    # Another lane still has room.
    other = asyncio.create_task(_hold(q, Lane.INTERACTIVE, order, "other", gate))
    await asyncio.sleep(0.01)
    assert q.queued(Lane.INTERACTIVE) == 1
    gate.set()
    await asyncio.gather(running, waiting, other)


async def test_queue_wait_is_bounded():
    # The real clock on purpose (the daemon's): only that the wait ends in queue_timeout is
    # asserted, never how long it took.
    q = _queue(limit=1, wait_s=0.05)
    gate = asyncio.Event()
    running = asyncio.create_task(_hold(q, Lane.INTERACTIVE, [], "run", gate))
    await asyncio.sleep(0)
    with pytest.raises(Overloaded) as err:
        async with q.slot(Lane.INTERACTIVE):
            pass
    assert err.value.code == "queue_timeout" and "max_queue_wait_s" in err.value.message
    assert q.queued() == 0
    gate.set()
    await running


async def test_time_held_closed_does_not_count_against_the_queue_wait():
    # A restart holds the queue for longer than max_queue_wait_s: the waiters must run after
    # it, not get 429s. Once the queue is open again the bound applies as usual.
    clock = ManualClock()
    q = _queue(limit=1, wait_s=0.02, clock=clock)
    q.close()
    order: list[str] = []
    gate = asyncio.Event()
    gate.set()
    waiting = [
        asyncio.create_task(_hold(q, Lane.INTERACTIVE, order, f"w{i}", gate)) for i in range(3)
    ]
    await asyncio.sleep(0)
    clock.advance(3600)  # an hour-long hold, 180 000 times the bound
    # Real time for each waiter to re-read the clock several times (its timer is 0.02 s):
    # one that counted the hold would give up here.
    await asyncio.sleep(0.1)
    assert q.queued() == 3 and q.held_s() == 3600
    q.open()
    await asyncio.gather(*waiting)
    assert order == ["w0", "w1", "w2"]
    # Open again: a request stuck behind a running one times out at the bound, not before.
    block = asyncio.Event()
    running = asyncio.create_task(_hold(q, Lane.INTERACTIVE, [], "run", block))
    await asyncio.sleep(0)
    stuck = asyncio.create_task(_enter(q, Lane.INTERACTIVE))
    await asyncio.sleep(0)
    clock.advance(0.019)  # just short of the bound
    await asyncio.sleep(0.1)  # real time passes; it is the clock the bound is read from
    assert not stuck.done() and q.queued() == 1
    clock.advance(0.002)  # past it
    with pytest.raises(Overloaded) as err:
        await stuck
    assert err.value.code == "queue_timeout"
    assert q.queued() == 0 and q.in_flight == 1
    block.set()
    await running


async def test_deadline_while_held_still_expires():
    # Holding the queue pauses its own bound, never the client's deadline.
    clock = ManualClock()
    q = _queue(limit=1, wait_s=0.02, clock=clock)
    q.close()
    waiter = asyncio.create_task(_enter(q, Lane.INTERACTIVE, deadline_s=clock() + 0.05))
    await asyncio.sleep(0)
    clock.advance(0.04)  # twice the queue bound, short of the deadline
    await asyncio.sleep(0.1)
    assert not waiter.done() and q.queued() == 1
    clock.advance(0.02)
    with pytest.raises(DeadlineExceeded):
        await waiter
    assert q.queued() == 0 and q.in_flight == 0


async def test_deadline_while_queued_is_its_own_error():
    clock = ManualClock()
    q = _queue(limit=1, wait_s=5, clock=clock)
    gate = asyncio.Event()
    running = asyncio.create_task(_hold(q, Lane.INTERACTIVE, [], "run", gate))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(_enter(q, Lane.INTERACTIVE, deadline_s=clock() + 0.05))
    await asyncio.sleep(0)
    clock.advance(0.06)  # past the deadline, far inside the 5 s queue bound
    with pytest.raises(DeadlineExceeded):
        await waiter
    assert q.queued() == 0 and q.in_flight == 1
    gate.set()
    await running


async def test_cancelled_waiter_leaves_the_queue_and_never_runs():
    q = _queue(limit=1)
    gate = asyncio.Event()
    order: list[str] = []
    running = asyncio.create_task(_hold(q, Lane.INTERACTIVE, order, "run", gate))
    await asyncio.sleep(0)
    victim = asyncio.create_task(_hold(q, Lane.INTERACTIVE, order, "victim", gate))
    await asyncio.sleep(0.01)
    assert q.queued() == 1
    victim.cancel()
    await asyncio.sleep(0)
    assert q.queued() == 0
    gate.set()
    await running
    assert order == ["run"] and q.in_flight == 0


async def test_closed_queue_holds_requests_until_open():
    q = _queue(limit=4)
    q.close()
    order: list[str] = []
    gate = asyncio.Event()
    gate.set()
    tasks = [
        asyncio.create_task(_hold(q, Lane.INTERACTIVE, order, f"r{i}", gate)) for i in range(3)
    ]
    await asyncio.sleep(0.02)
    assert order == [] and q.queued() == 3
    q.open()
    await asyncio.gather(*tasks)
    assert order == ["r0", "r1", "r2"]


async def test_raising_the_limit_dispatches_waiters():
    q = _queue(limit=1)
    gate = asyncio.Event()
    order: list[str] = []
    tasks = [
        asyncio.create_task(_hold(q, Lane.INTERACTIVE, order, f"r{i}", gate)) for i in range(3)
    ]
    await asyncio.sleep(0.01)
    assert q.in_flight == 1
    q.set_limit(3)
    await asyncio.sleep(0)
    assert q.in_flight == 3 and q.queued() == 0
    with pytest.raises(ValueError, match=">= 1"):
        q.set_limit(0)
    gate.set()
    await asyncio.gather(*tasks)


async def test_never_more_in_flight_than_the_limit():
    q = _queue(limit=3, cap=100)
    peak = 0

    async def one() -> None:
        nonlocal peak
        async with q.slot(Lane.INTERACTIVE):
            peak = max(peak, q.in_flight)
            await asyncio.sleep(0.001)

    await asyncio.gather(*(one() for _ in range(50)))
    assert peak == 3 and q.in_flight == 0


async def test_realtime_share_is_kept_free_of_batch():
    q = _queue(limit=4, cap=100, reserved=0.25)
    assert q.reserved_realtime == 1
    gate = asyncio.Event()
    order: list[str] = []
    batch = [asyncio.create_task(_hold(q, Lane.BATCH, order, f"b{i}", gate)) for i in range(10)]
    await asyncio.sleep(0.01)
    assert q.in_flight == 3 and q.queued(Lane.BATCH) == 7  # one slot stays free
    rt = asyncio.create_task(_hold(q, Lane.REALTIME, order, "rt", gate))
    await asyncio.sleep(0.01)
    assert "rt" in order and q.in_flight == 4
    gate.set()
    await asyncio.gather(*batch, rt)


async def test_derate_scales_the_limit_and_protect_admits_realtime_only():
    from appliance.errors import NotReady

    q = _queue(limit=8, cap=100)
    q.set_derate(0.5)
    assert q.limit == 4 and q.base_limit == 8
    q.set_derate(0.01)
    assert q.limit == 1  # never below one running request
    q.set_derate(1.0, protect=True)
    with pytest.raises(NotReady) as err:
        async with q.slot(Lane.BATCH):
            pass
    assert err.value.reason == "protect"
    async with q.slot(Lane.REALTIME):
        assert q.in_flight == 1
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        q.set_derate(0)


def _key(name: str, concurrency_share: float | None = None) -> KeySpec:
    return KeySpec(name, Lane.REALTIME, concurrency_share=concurrency_share)


async def _hold_as(
    q: AdmissionQueue, who: KeySpec, order: list[str], name: str, release: asyncio.Event
) -> None:
    async with q.slot(Lane.INTERACTIVE, claimant=who):
        order.append(name)
        await release.wait()


async def test_keys_in_one_lane_take_turns_instead_of_first_come():
    q = _queue(limit=1, cap=16)
    flood, other = _key("flood"), _key("other")
    order: list[str] = []
    gates = {name: asyncio.Event() for name in ["f0", "f1", "f2", "f3", "o0", "o1"]}
    tasks = [asyncio.create_task(_hold_as(q, flood, order, "f0", gates["f0"]))]
    await asyncio.sleep(0)
    for name in ("f1", "f2", "f3"):
        tasks.append(asyncio.create_task(_hold_as(q, flood, order, name, gates[name])))
    await asyncio.sleep(0)
    for name in ("o0", "o1"):
        tasks.append(asyncio.create_task(_hold_as(q, other, order, name, gates[name])))
    await asyncio.sleep(0.01)
    assert q.snapshot().queued_by_key == {"flood": 3, "other": 2}
    for _ in range(6):
        gates[order[-1]].set()
        await asyncio.sleep(0.01)
    await asyncio.gather(*tasks)
    # The other key's first request runs after one more of the flood's, not after all three.
    assert order == ["f0", "f1", "o0", "f2", "o1", "f3"]


async def test_a_key_holds_no_more_than_its_share_and_others_go_past():
    q = _queue(limit=4, cap=16)
    half = _key("half", concurrency_share=0.5)
    order: list[str] = []
    gate = asyncio.Event()
    tasks = [asyncio.create_task(_hold_as(q, half, order, f"h{i}", gate)) for i in range(4)]
    await asyncio.sleep(0.01)
    assert q.in_flight == 2 and q.snapshot().running_by_key == {"half": 2}
    # Two slots are free and the half key waits at its share: another key takes them.
    tasks += [asyncio.create_task(_hold_as(q, _key("b"), order, f"b{i}", gate)) for i in range(2)]
    await asyncio.sleep(0.01)
    assert order == ["h0", "h1", "b0", "b1"] and q.queued() == 2
    gate.set()
    await asyncio.gather(*tasks)
    assert q.in_flight == 0 and q.snapshot().running_by_key == {}
