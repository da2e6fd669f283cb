"""The prefill backlog: its busy-time rate, the budget policy, and admission keeping to it."""

from __future__ import annotations

import asyncio

import pytest

from appliance.domain.prefill import PrefillTracker, budget_moved, prefill_budget, shed_verdict
from appliance.domain.request_scope import Outcome
from appliance.errors import Overloaded
from appliance.services.admission import Lane
from tests.unit.test_admission import ManualClock, _queue


def test_rate_counts_busy_time_only() -> None:
    t = PrefillTracker(min_samples=2)
    # 1000 tokens prefilled in 0.5 s, then 10 s idle, then 1000 more in 0.5 s.
    t.start(1000, 0.0)
    t.finish(1000, 0.5, first_token=True)
    t.start(1000, 10.5)
    t.finish(1000, 11.0, first_token=True)
    assert t.rate_tok_s(11.0) == pytest.approx(2000.0)


def test_overlapping_prefills_share_the_busy_time() -> None:
    t = PrefillTracker(min_samples=2)
    t.start(1500, 0.0)
    t.start(1500, 0.1)
    t.finish(1500, 1.0, first_token=True)
    t.finish(1500, 1.5, first_token=True)
    # 3000 tokens over 1.5 busy seconds.
    assert t.rate_tok_s(1.5) == pytest.approx(2000.0)
    assert t.outstanding_tokens == 0 and t.outstanding_requests == 0


def test_a_cancelled_prefill_gives_no_sample_and_its_time_slows_the_next() -> None:
    t = PrefillTracker(min_samples=1)
    t.start(1000, 0.0)
    t.finish(1000, 1.0, first_token=False)  # cancelled after a busy second
    assert t.rate_tok_s(1.0) is None
    t.start(1000, 1.0)
    t.finish(1000, 1.5, first_token=True)
    assert t.rate_tok_s(1.5) == pytest.approx(1000 / 1.5)


def test_too_few_or_old_samples_give_no_rate() -> None:
    t = PrefillTracker(window_s=30, min_samples=2)
    t.start(100, 0.0)
    t.finish(100, 0.1, first_token=True)
    assert t.rate_tok_s(0.1) is None
    t.start(100, 1.0)
    t.finish(100, 1.1, first_token=True)
    assert t.rate_tok_s(1.1) == pytest.approx(1000.0)
    assert t.rate_tok_s(100.0) is None  # both samples left the window


def test_tracker_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="window_s"):
        PrefillTracker(window_s=0)
    t = PrefillTracker()
    with pytest.raises(ValueError, match="tokens"):
        t.start(-1, 0.0)
    with pytest.raises(ValueError, match="without a matching start"):
        t.finish(1, 0.0, first_token=True)


def test_budget_is_rate_times_the_share_of_the_slo() -> None:
    b = prefill_budget(4000.0, 2.0, 0.5, auto=True)
    assert b.tokens == 4000
    assert "4000 prompt tok/s" in b.reason and "0.5 of the 2 s TTFT SLO" in b.reason


@pytest.mark.parametrize(
    ("rate", "share", "auto", "why"),
    [
        (4000.0, 0.5, False, "manual mode"),
        (4000.0, None, True, "off"),
        (None, 0.5, True, "too few first tokens"),
        (0.0, 0.5, True, "too few first tokens"),
    ],
)
def test_no_budget_without_auto_a_share_or_a_rate(
    rate: float | None, share: float | None, auto: bool, why: str
) -> None:
    b = prefill_budget(rate, 2.0, share, auto=auto)
    assert b.tokens is None and why in b.reason


def test_budget_moves_worth_an_event() -> None:
    assert budget_moved(None, 100) and budget_moved(100, None)
    assert not budget_moved(None, None)
    assert not budget_moved(1000, 1200)
    assert budget_moved(1000, 1300) and budget_moved(1000, 700)


def test_outcome_reports_its_first_token_once() -> None:
    seen: list[float] = []
    o = Outcome(on_first_token=seen.append)
    o.tokens_out(1, 5.0)
    o.tokens_out(3, 6.0)
    assert seen == [5.0] and o.completion_tokens == 4


async def test_admission_holds_a_document_behind_the_budget_until_a_first_token() -> None:
    clock = ManualClock()
    q = _queue(limit=8, clock=clock)
    q.set_prefill_budget(2000)
    async with q.slot(Lane.INTERACTIVE, prefill_tokens=1500) as first:
        # A second document would take the backlog to 3000 > 2000: it waits, though the
        # count limit (8) has room.
        second = asyncio.create_task(_hold(q, 1500))
        await asyncio.sleep(0.05)
        assert q.queued(Lane.INTERACTIVE) == 1 and q.in_flight == 1
        assert q.snapshot().prefill_outstanding_tokens == 1500
        clock.advance(0.5)
        first.first_token()
        await asyncio.sleep(0.05)
        assert q.in_flight == 2 and q.queued() == 0
        second.cancel()
        await asyncio.gather(second, return_exceptions=True)
    assert q.prefill.outstanding_tokens == 0 and q.prefill.outstanding_requests == 0
    assert q.prefill.samples_in_window() == 1


async def test_admission_always_lets_one_in_and_realtime_past_the_budget() -> None:
    q = _queue(limit=8)
    q.set_prefill_budget(100)
    # Over the budget with an empty backlog, then realtime, which the budget never holds back.
    async with (
        q.slot(Lane.INTERACTIVE, prefill_tokens=1500),
        q.slot(Lane.REALTIME, prefill_tokens=1500),
    ):
        assert q.in_flight == 2
    q.set_prefill_budget(None)
    async with (
        q.slot(Lane.INTERACTIVE, prefill_tokens=1500),
        q.slot(Lane.INTERACTIVE, prefill_tokens=1500),
    ):
        assert q.in_flight == 2
    with pytest.raises(ValueError, match="prefill budget"):
        q.set_prefill_budget(0)


async def _hold(q: object, tokens: int) -> None:
    async with q.slot(Lane.INTERACTIVE, prefill_tokens=tokens):  # type: ignore[attr-defined]
        await asyncio.sleep(3600)


async def test_a_lower_lane_does_not_slip_past_a_prompt_the_budget_holds() -> None:
    q = _queue(limit=8)
    q.set_prefill_budget(2000)
    async with (
        q.slot(Lane.INTERACTIVE, prefill_tokens=1500),
        q.slot(Lane.INTERACTIVE, prefill_tokens=100) as chat,
    ):
        doc = asyncio.create_task(_hold(q, 1500))  # 1600 + 1500 > 2000: waits
        await asyncio.sleep(0.02)
        small = asyncio.create_task(_hold_lane(q, Lane.BATCH, 100))
        await asyncio.sleep(0.02)
        assert q.queued(Lane.INTERACTIVE) == 1 and q.queued(Lane.BATCH) == 1
        # The chat's first token: 1500 left, the document still does not fit (3000), and
        # the batch prompt (1600) would: it must wait behind the higher lane all the same.
        chat.first_token()
        await asyncio.sleep(0.02)
        assert q.queued(Lane.INTERACTIVE) == 1 and q.queued(Lane.BATCH) == 1
        assert q.in_flight == 2
        for t in (doc, small):
            t.cancel()
        await asyncio.gather(doc, small, return_exceptions=True)


async def _hold_lane(q: object, lane: Lane, tokens: int) -> None:
    async with q.slot(lane, prefill_tokens=tokens):  # type: ignore[attr-defined]
        await asyncio.sleep(3600)


def test_shed_verdict_refuses_what_would_reach_its_first_token_too_late() -> None:
    # 3000 tokens ahead + 1500 own at 600 tok/s: 7.5 s, past 5 s: shed, back in ~3 s.
    v = shed_verdict(3000, 1500, 600.0, 5.0)
    assert v.shed and v.predicted_s == pytest.approx(7.5) and v.retry_after_s == 3
    assert "7.5 s" in v.reason and "5 s" in v.reason and "600 tok/s" in v.reason
    # 1500 ahead + 1500 own: 5.0 s, on the mark: queued.
    v = shed_verdict(1500, 1500, 600.0, 5.0)
    assert not v.shed and v.predicted_s == pytest.approx(5.0)
    # No rate measured yet, or no threshold (manual mode, off): never shed.
    assert not shed_verdict(10**6, 1500, None, 5.0).shed
    assert not shed_verdict(10**6, 1500, 600.0, None).shed
    assert not shed_verdict(10**6, 1500, 0.0, 5.0).shed


def _rated_queue(clock: ManualClock, rate_tok_s: float) -> object:
    """A queue whose tracker measured `rate_tok_s` from 4 first tokens of 600 tokens."""
    q = _queue(limit=1, clock=clock)
    for _ in range(4):
        q.prefill.start(600, clock())
        clock.advance(600 / rate_tok_s)
        q.prefill.finish(600, clock(), first_token=True)
    return q


async def test_admission_sheds_an_interactive_request_its_backlog_makes_late() -> None:
    clock = ManualClock()
    q = _rated_queue(clock, 600.0)
    q.set_shed_above(5.0)  # type: ignore[attr-defined]
    async with q.slot(Lane.INTERACTIVE, prefill_tokens=1500):  # type: ignore[attr-defined]
        # 1500 running + 1500 queued ahead + 1500 own = 7.5 s at 600 tok/s.
        queued = asyncio.create_task(_hold(q, 1500))  # 3000 / 600 = 5 s: queued
        await asyncio.sleep(0.02)
        assert q.queued(Lane.INTERACTIVE) == 1  # type: ignore[attr-defined]
        with pytest.raises(Overloaded) as exc:
            await _hold(q, 1500)
        assert exc.value.status == 429 and exc.value.code == "ttft_unreachable"
        assert exc.value.retry_after_s == 3
        assert "shed_above_ttft_ratio" in exc.value.message
        # Realtime (served first, by vLLM too) and batch (there to wait) are never shed.
        rt = asyncio.create_task(_hold_lane(q, Lane.REALTIME, 1500))
        batch = asyncio.create_task(_hold_lane(q, Lane.BATCH, 5000))
        await asyncio.sleep(0.02)
        assert q.queued(Lane.REALTIME) == 1 and q.queued(Lane.BATCH) == 1  # type: ignore[attr-defined]
        snap = q.snapshot()  # type: ignore[attr-defined]
        assert snap.shed_total == {"realtime": 0, "interactive": 1, "batch": 0}
        assert snap.shed_above_s == 5.0
        for t in (queued, rt, batch):
            t.cancel()
        await asyncio.gather(queued, rt, batch, return_exceptions=True)


async def test_admission_never_sheds_while_held_or_without_a_threshold() -> None:
    clock = ManualClock()
    q = _rated_queue(clock, 600.0)
    q.set_shed_above(5.0)  # type: ignore[attr-defined]
    q.close()  # type: ignore[attr-defined]  # a restart: the rate says nothing about this wait
    waiting = [asyncio.create_task(_hold(q, 1500)) for _ in range(4)]
    await asyncio.sleep(0.02)
    assert q.queued(Lane.INTERACTIVE) == 4  # type: ignore[attr-defined]
    q.open()  # type: ignore[attr-defined]
    q.set_shed_above(None)  # type: ignore[attr-defined]
    more = asyncio.create_task(_hold(q, 1500))
    await asyncio.sleep(0.02)
    assert q.queued(Lane.INTERACTIVE) == 4 and q.in_flight == 1  # type: ignore[attr-defined]
    assert sum(q.snapshot().shed_total.values()) == 0  # type: ignore[attr-defined]
    for t in (*waiting, more):
        t.cancel()
    await asyncio.gather(*waiting, more, return_exceptions=True)
    with pytest.raises(ValueError, match="shed threshold"):
        q.set_shed_above(0.0)  # type: ignore[attr-defined]
