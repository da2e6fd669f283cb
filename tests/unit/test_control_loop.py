"""The controller loop over the real admission queue and latency window, on a fake clock."""

from __future__ import annotations

import pytest

from appliance.config import AdmissionConfig
from appliance.domain.controller import Action, ControlDecision, ControllerConfig, ControlMode
from appliance.domain.lanes import Lane
from appliance.domain.latency_window import LatencyWindow
from appliance.domain.step_latency import StepLatencyLog
from appliance.services.admission import AdmissionQueue
from appliance.services.control_loop import ControlLoop
from appliance.services.events import EventBus


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def _loop(
    clock: Clock,
    forecast=None,
    steps: StepLatencyLog | None = None,
    slo_tpot_p99_s: float | None = None,
) -> tuple[ControlLoop, AdmissionQueue, LatencyWindow, EventBus]:
    admission = AdmissionQueue(AdmissionConfig(concurrency_limit=4), clock=clock)
    latency = LatencyWindow(window_s=60)
    events = EventBus()
    cfg = ControllerConfig(
        slo_ttft_p99_s=1.0,
        slo_tpot_p99_s=slo_tpot_p99_s,
        min_limit=1,
        max_limit=8,
        min_samples=2,
        hold_ticks_after_decrease=0,
        hold_ticks_after_increase=0,
        fast_probe_hold_ticks=0,
    )
    loop = ControlLoop(
        cfg,
        ControlMode.AUTO,
        admission,
        latency,
        kv_usage=lambda: 0.1,
        events=events,
        clock=clock,
        forecast=forecast,
        step_latency=None if steps is None else steps.since,
    )
    return loop, admission, latency, events


def test_breach_cuts_and_an_slo_change_judges_only_later_samples():
    clock = Clock()
    loop, admission, latency, events = _loop(clock)
    for _ in range(3):
        latency.add(clock.now_s, 3.0)
    clock.now_s += 1
    d = loop.tick()
    assert d.action is Action.DOWN and admission.base_limit == 3
    assert "p99 TTFT 3 s > SLO 1 s" in d.reason
    assert loop.state.breach_base == 4

    clock.now_s += 1
    loop.configure(slo_ttft_p99_s=10.0)
    cfg_events = [e for e in events.recent() if e.kind == "controller_config"]
    assert cfg_events and "SLO p99 TTFT 10 s" in cfg_events[-1].reason
    # The breach was against the old SLO: forgotten, and its samples no longer count.
    assert loop.state.breach_base is None and not loop.state.barrier
    clock.now_s += 1
    d = loop.tick()
    assert d.action is Action.HOLD and "2 needed to judge the SLO" in d.reason
    assert admission.base_limit == 3

    # The same latency measured after the change sits inside the new SLO: no cut.
    for _ in range(3):
        latency.add(clock.now_s, 3.0)
    clock.now_s += 1
    d = loop.tick()
    assert d.action is Action.HOLD and admission.base_limit == 3, d.reason


def test_manual_mode_sets_the_operator_limit_and_bounds_clamp_it():
    clock = Clock()
    loop, admission, _, _ = _loop(clock)
    loop.configure(mode="manual", limit=6)
    assert admission.base_limit == 6 and loop.last is not None
    assert loop.last.action is Action.MANUAL
    loop.configure(max_limit=5)
    assert admission.base_limit == 5 and "clamped to [1, 5]" in loop.last.reason


class _Forecast:
    pending_now = 2.0
    pending_expected = 30.0
    horizon_s = 30.0
    source = "ewma"
    reason = "test"


async def test_the_latest_fresh_forecast_feeds_the_tick():
    clock = Clock()
    loop, _, latency, _ = _loop(clock, forecast=_Forecast)
    cfg = loop.cfg
    for _ in range(3):
        latency.add(clock.now_s, 0.1)
    clock.now_s += 1
    assert loop.tick().action is Action.HOLD  # no queue, no forecast yet
    await loop.refresh_forecast()
    d = loop.tick()
    assert d.action is Action.UP and "forecast 30.0 pending in 30 s (ewma)" in d.reason
    assert loop.snapshot()["forecast"]["pending_expected"] == 30.0
    clock.now_s += 10 * cfg.tick_s  # a stale forecast is not used
    for _ in range(3):
        latency.add(clock.now_s, 0.1)
    assert loop.tick().action is Action.HOLD


def test_opened_holds_a_manual_limit_for_the_block_then_puts_everything_back():
    clock = Clock()
    loop, admission, _, events = _loop(clock)
    loop.set_ceiling(3, "an older run")
    loop.tick()
    assert admission.base_limit == 3
    with loop.opened(16, "the monthly benchmark"):
        # Above the ceiling and the configured max (8): the benchmark measures the engine.
        assert loop.mode is ControlMode.MANUAL and admission.base_limit == 16
        assert loop.cfg.max_limit == 16
        loop.clear_ceiling("a run still rising")
    assert loop.mode is ControlMode.AUTO and loop.cfg.max_limit == 8
    assert admission.base_limit == 3  # the limit auto mode had (the ceiling's), not 16
    assert loop.ceiling is None  # what the run decided stays
    sources = [e.data["source"] for e in events.recent() if e.kind == "controller_config"]
    assert sources == ["the monthly benchmark", "the monthly benchmark, ended"]


def test_ceiling_changes_are_kept_except_when_restored():
    clock = Clock()
    kept: list[tuple[int | None, str]] = []
    loop, *_ = _loop(clock)
    loop._keep_ceiling = lambda ceiling, source: kept.append((ceiling, source))
    loop.set_ceiling(6, "run 1")
    loop.set_ceiling(6, "the kept ceiling (run 1)", keep=False)
    loop.clear_ceiling("run 2")
    assert kept == [(6, "run 1"), (None, "run 2")]


def _prefill_samples(admission: AdmissionQueue, clock: Clock, n: int, tokens: int, s: float):
    """n prompts of `tokens`, each reaching its first token `s` after admission, one by one."""
    for _ in range(n):
        admission.prefill.start(tokens, clock.now_s)
        clock.now_s += s
        admission.prefill.finish(tokens, clock.now_s, first_token=True)


def test_auto_sets_the_prefill_budget_from_the_measured_rate_and_manual_drops_it():
    clock = Clock()
    loop, admission, _, events = _loop(clock)
    loop.tick()
    assert admission.prefill_budget is None
    assert "too few first tokens" in loop.snapshot()["prefill"]["reason"]
    # 1000 prompt tokens a busy second; half the 1 s TTFT SLO: a 500-token budget.
    _prefill_samples(admission, clock, 4, 500, 0.5)
    loop.tick()
    assert admission.prefill_budget == 500
    snap = loop.snapshot()["prefill"]
    assert snap["budget_tokens"] == 500 and snap["rate_tok_s"] == 1000.0
    budget_events = [e for e in events.recent() if e.kind == "prefill_budget"]
    assert budget_events and "prefill budget 500 tokens" in budget_events[-1].reason
    # A small move is no event; a switch to manual drops the budget, with one.
    loop.configure(mode="manual", limit=4)
    assert admission.prefill_budget is None
    assert [e for e in events.recent() if e.kind == "prefill_budget"][-1].data["tokens"] is None


def test_switching_to_auto_forgets_where_the_slo_broke_before():
    clock = Clock()
    loop, admission, latency, _ = _loop(clock)
    for _ in range(3):
        latency.add(clock.now_s, 3.0)
    clock.now_s += 1
    loop.tick()
    assert loop.state.breach_base == 4
    loop.configure(mode="manual", limit=6)
    assert loop.state.breach_base == 4  # manual keeps the record...
    clock.now_s += 1
    loop.configure(mode="auto")
    # ...auto starts afresh from the limit in force, judging only what comes after.
    assert loop.state.breach_base is None and not loop.state.barrier
    assert admission.base_limit == 6


async def _queued(admission: AdmissionQueue, n: int) -> list:
    """Fill the limit and queue n more behind it (tasks to cancel)."""
    import asyncio

    async def hold() -> None:
        async with admission.slot(Lane.INTERACTIVE):
            await asyncio.sleep(3600)

    tasks = [asyncio.create_task(hold()) for _ in range(admission.limit + n)]
    await asyncio.sleep(0.01)
    return tasks


async def _cancel(tasks: list) -> None:
    """End the tasks _queued started."""
    import asyncio

    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _after_a_fast_probe(
    clock: Clock, steps: StepLatencyLog | None = None
) -> tuple[ControlLoop, AdmissionQueue, LatencyWindow, list]:
    """A full limit of 4 with 3 queued, and the first probe: far below the 1 s SLO, +50 %
    (4 -> 6), judged on requests admitted after start. Returns the tasks to cancel."""
    loop, admission, latency, _ = _loop(clock, steps=steps)
    admission.open()
    tasks = await _queued(admission, 3)
    for _ in range(3):
        latency.add(clock.now_s, 0.1, admitted_s=clock.now_s - 0.5)
    clock.now_s += 1
    d = loop.tick()
    assert (d.action, admission.base_limit) == (Action.UP, 6), d.reason
    return loop, admission, latency, tasks


async def test_fast_probes_wait_for_requests_admitted_after_the_last_change():

    clock = Clock()
    loop, admission, latency, tasks = await _after_a_fast_probe(clock)
    # Requests that finish now were admitted before that change: a one-step probe only.
    for _ in range(3):
        latency.add(clock.now_s, 0.1, admitted_s=clock.now_s - 0.5)
    clock.now_s += 1
    d = loop.tick()
    assert (d.action, admission.base_limit) == (Action.UP, 7), d.reason
    # Two admitted after that change finish, far below: half the limit (capped at 8).
    clock.now_s += 1
    for _ in range(2):
        latency.add(clock.now_s, 0.1, admitted_s=clock.now_s - 0.2)
    d = loop.tick()
    assert (d.action, admission.base_limit) == (Action.UP, 8), d.reason
    assert "of the 2 admitted since the last change" in d.reason
    await _cancel(tasks)


async def test_the_engines_steps_after_a_change_size_the_next_probe():

    clock = Clock()
    steps = StepLatencyLog()
    loop, admission, latency, tasks = await _after_a_fast_probe(clock, steps)
    # The requests finishing now were admitted before the change; the engine's steps taken
    # before it are no evidence either: one step.
    for _ in range(3):
        latency.add(clock.now_s, 0.1, admitted_s=clock.now_s - 0.5)
    for _ in range(10):
        steps.add(clock.now_s - 0.5, (), (0.1,))
    clock.now_s += 1
    d = loop.tick()
    assert (d.action, admission.base_limit) == (Action.UP, 7), d.reason
    # Steps after that change with first tokens far below the SLO: a sized probe, on them.
    clock.now_s += 1
    for _ in range(8):
        steps.add(clock.now_s - 0.2, (0.02,), (0.1,))
    latency.add(clock.now_s, 0.1, admitted_s=clock.now_s - 5)
    latency.add(clock.now_s, 0.1, admitted_s=clock.now_s - 5)
    d = loop.tick()
    assert (d.action, admission.base_limit) == (Action.UP, 8), d.reason
    assert "of the engine's 8 steps since the last change" in d.reason
    assert loop.snapshot()["live"] == {
        "steps": 8,
        "tpot_s": 0.02,
        "ttft_p99_s": 0.1,
        "batch": 2.0,
        "request_tpot_s": 0.02,
        "request_steps": 8,
        "decode_gaps": 1.0,
        "gap_median_s": 0.02,
    }
    await _cancel(tasks)


def test_a_cut_on_the_engines_steps_sees_only_the_last_seconds():
    clock = Clock()
    steps = StepLatencyLog()
    loop, admission, latency, _ = _loop(clock, steps=steps)
    # First tokens 3 s late (the SLO is 1 s), 10 s ago: the span (4 s) has forgotten them.
    for _ in range(10):
        steps.add(clock.now_s - 10, (0.01,), (3.0,))
    for _ in range(3):
        latency.add(clock.now_s, 0.1, admitted_s=clock.now_s - 0.5)
    d = loop.tick()
    assert d.action is not Action.DOWN, d.reason
    # The same in the last seconds: a cut on them, before any request finished late.
    for _ in range(10):
        steps.add(clock.now_s - 1, (0.01,), (3.0,))
    clock.now_s += 1
    d = loop.tick()
    assert (d.action, admission.base_limit) == (Action.DOWN, 2), d.reason
    assert "the engine's last 10 steps: p99 TTFT 3 s > SLO 1 s" in d.reason


def _tick_on_steps_of(step_s: float) -> tuple[ControlDecision, int]:
    """One tick over 15 engine steps of step_s each (3 requests a step, TPOT SLO 0.5 s)."""
    clock = Clock()
    steps = StepLatencyLog()
    loop, admission, _, _ = _loop(clock, steps=steps, slo_tpot_p99_s=0.5)
    for i in reversed(range(15)):
        steps.add(clock.now_s - step_s * i, (step_s,) * 3, ())
    return loop.tick(), admission.base_limit


def test_steps_slower_than_the_tpot_slo_are_judged_though_few_fit_in_the_span():
    # A step takes about one TPOT: at 0.7 s (SLO 0.5 s) only 5 steps fit in the 4 s span,
    # fewer than the 8 a judgement needs. The loop reaches back to the last 8 (5.6 s), as
    # far as 8 steps take at 4x the SLO (16 s), and cuts before any request finished.
    d, base = _tick_on_steps_of(0.7)
    assert (d.action, base) == (Action.DOWN, 2), d.reason
    assert "the engine's last 8 steps: TPOT 700 ms > SLO 500 ms" in d.reason
    # Steps of 1.5 s (3x the SLO, a hot room's): 8 of them take 12 s, still within reach
    # (at 2x the SLO they never were, and the limit held while they ran).
    d, base = _tick_on_steps_of(1.5)
    assert (d.action, base) == (Action.DOWN, 2), d.reason
    # Steps of 2.5 s: 8 take 20 s, past the reach; no judgement on steps that old (the
    # finished requests show a breach that large soon enough).
    d, base = _tick_on_steps_of(2.5)
    assert d.action is not Action.DOWN and base == 4, d.reason


def test_a_cut_on_a_slowed_box_is_sized_to_the_steps_now_not_to_a_whole_decode():
    clock = Clock()
    steps = StepLatencyLog()
    loop, admission, _, _ = _loop(clock, steps=steps, slo_tpot_p99_s=0.5)
    admission.set_limit(8)
    # 20 steps of a running load at 300 ms a token (8 requests a step; 8 first tokens), then
    # the box slows: its last 8 steps at 1.2 s. A request decodes 28 steps (224 gaps over
    # 8 first tokens): through the last 28 it takes 557 ms, over the SLO of 500 ms, and
    # sized on that the cut would land at 5. The steps now run at 1.2 s: the cut lands at
    # half, 4, and says why.
    t = clock.now_s - 8 * 1.2 - 20 * 0.3
    for i in range(20):
        t += 0.3
        steps.add(t, (0.3,) * 8, (0.2,) if i < 8 else ())
    for _ in range(8):
        t += 1.2
        steps.add(t, (1.2,) * 8, ())
    d = loop.tick()
    assert (d.action, admission.base_limit) == (Action.DOWN, 4), d.reason
    assert "TPOT 557 ms > SLO 500 ms" in d.reason
    assert "(sized to the steps' recent median gap of 1.2 s): 8 -> 4" in d.reason
    assert loop.snapshot()["live"]["gap_median_s"] == 1.2


def test_steps_taken_while_the_old_limits_requests_drain_are_no_evidence():
    import dataclasses

    clock = Clock()
    steps = StepLatencyLog()
    loop, admission, _, _ = _loop(clock, steps=steps)
    # First tokens 3 s late (SLO 1 s), 3 s ago: inside the span, but taken while more ran
    # than the limit (the controller saw that 2 s ago): they judge nothing.
    for _ in range(10):
        steps.add(clock.now_s - 3, (0.01,), (3.0,))
    drained = dataclasses.replace(
        loop.state, last_change_s=clock.now_s - 10, over_limit_s=clock.now_s - 2
    )
    loop.state = drained
    d = loop.tick()
    assert d.action is not Action.DOWN and admission.base_limit == 4, d.reason
    # The same steps after the drain: a cut.
    loop.state = dataclasses.replace(drained, over_limit_s=clock.now_s - 5)
    d = loop.tick()
    assert (d.action, admission.base_limit) == (Action.DOWN, 2), d.reason


def _tick_after_a_change_on(
    gaps_s: list[float], change_ago_s: float = 9.0
) -> tuple[ControlDecision, int]:
    """A chat load's history (8 requests over 48 steps of 4, from 60 s ago), a change
    change_ago_s ago, then one engine step a second at these gaps (4 requests a step, a new
    one every 7); one tick (TPOT SLO 0.5 s)."""
    import dataclasses

    clock = Clock()
    steps = StepLatencyLog()
    loop, admission, _, _ = _loop(clock, steps=steps, slo_tpot_p99_s=0.5)
    clock.now_s = 100.0
    for i in range(48):
        steps.add(40.0 + 0.5 * i, (0.2,) * 4, (0.5,) if i % 6 == 0 else ())
    loop.state = dataclasses.replace(loop.state, last_change_s=clock.now_s - change_ago_s)
    for i, gap in enumerate(gaps_s):
        # A request starts every 7 steps, as it ends: a request's decode stays 28 gaps.
        steps.add(clock.now_s - len(gaps_s) + i, (gap,) * 4, (0.5,) if i % 7 == 6 else ())
    return loop.tick(), admission.base_limit


def test_a_wave_of_prefill_in_a_few_steps_is_no_tpot_breach_but_a_slowdown_is():
    # Eight steps since the change read 0.55 s on average, over the 0.5 s SLO, because one of
    # them prefilled a wave of prompts (3 s). A request decodes 25 gaps (224 over 9 first
    # tokens); through these steps and typical ones after them it sees 0.3 s: no cut (the
    # span's mean cut to half).
    d, base = _tick_after_a_change_on([0.2, 0.2, 3.0, 0.2, 0.2, 0.2, 0.2, 0.2])
    assert d.action is not Action.DOWN and base == 4, d.reason
    # Every step at 0.6 s: the box slowed, and the steps say so before a request finishes.
    # Eight steps are a few seconds of a request's 25: a spike of a CPU neighbour reads the
    # same, so within 1.25x of the SLO the cut is one step.
    d, base = _tick_after_a_change_on([0.6] * 8)
    assert (d.action, base) == (Action.DOWN, 3), d.reason
    assert "the engine's last 8 steps (of a request's 25): TPOT 600 ms > SLO 500 ms" in d.reason
    assert "(mild, within 1.25x: one step)" in d.reason
    # The same steps over a whole request's decode since the change (30 s ago, past the 8 s
    # the steps that judge the moment reach): every request through them misses, the cut.
    d, base = _tick_after_a_change_on([0.6] * 30, change_ago_s=31.0)
    assert (d.action, base) == (Action.DOWN, 2), d.reason
    assert "the engine's last 26 steps: TPOT 600 ms > SLO 500 ms (a mean" in d.reason
    # Far over the SLO (1.5x) on a few steps: no spike to wait out, the full cut at once.
    d, base = _tick_after_a_change_on([0.75] * 8)
    assert (d.action, base) == (Action.DOWN, 2), d.reason


@pytest.mark.parametrize(
    ("ttft_s", "tpot_s", "firsts_s", "held", "let_go"),
    [
        # Requests that decoded through a slow spell finish at 450 ms a token: the window's
        # p99 sits in the dead band (probing needs < 400 ms). The engine's last 10 steps run
        # at 100 ms a token: that tail is history.
        (
            0.1,
            0.45,
            (),
            "p99 TPOT 450 ms within SLO 500 ms",
            "p99 TPOT 450 ms is from a slower engine",
        ),
        # Requests whose first tokens came through a slow spell: the window's p99 TTFT
        # (900 ms against the 1 s SLO) sits in the dead band. The engine's last 10 steps give
        # first tokens in 200 ms: that tail is the window's.
        (
            0.9,
            0.1,
            (0.2,),
            "p99 TTFT 900 ms within SLO 1 s (probing needs < 800 ms)",
            "p99 TTFT 900 ms within SLO 1 s is the window's (30 s): the engine's 10 first "
            "tokens among its last 10 steps take 200 ms",
        ),
    ],
)
async def test_a_tail_from_a_slow_spell_does_not_hold_the_limit_once_the_steps_run_fast(
    ttft_s: float, tpot_s: float, firsts_s: tuple[float, ...], held: str, let_go: str
):
    import dataclasses

    clock = Clock()
    steps = StepLatencyLog()
    loop, admission, latency, _ = _loop(clock, steps=steps, slo_tpot_p99_s=0.5)
    admission.open()
    tasks = await _queued(admission, 3)
    loop.state = dataclasses.replace(loop.state, last_change_s=clock.now_s - 20)
    # With no steps to say otherwise, the window's tail holds the limit.
    for _ in range(4):
        latency.add(clock.now_s - 1, ttft_s, tpot_s, admitted_s=clock.now_s - 15)
    d = loop.tick()
    assert (d.action, admission.base_limit) == (Action.HOLD, 4), d.reason
    assert held in d.reason
    # The engine's steps say otherwise: one step up.
    for i in range(10):
        steps.add(clock.now_s - 3 + 0.3 * i, (0.1,) * 4, firsts_s)
    clock.now_s += 0.5
    d = loop.tick()
    assert (d.action, admission.base_limit) == (Action.UP, 5), d.reason
    assert let_go in d.reason
    await _cancel(tasks)


async def test_a_breach_on_a_slower_box_is_let_go_once_the_steps_run_much_faster():
    import asyncio
    import dataclasses

    clock = Clock()
    clock.now_s = 100.0
    steps = StepLatencyLog()
    loop, admission, latency, _ = _loop(clock, steps=steps, slo_tpot_p99_s=0.5)
    admission.open()
    tasks = await _queued(admission, 3)
    # A chat load's history (8 requests), then a hot room: every step since the change
    # (31 s ago) at 0.8 s a token with 4 running, a request's whole decode. The full cut,
    # 4 -> 2; it remembers the box: ~0.2 s a step for each running request.
    for i in range(48):
        steps.add(40.0 + 0.5 * i, (0.2,) * 4, (0.5,) if i % 6 == 0 else ())
    loop.state = dataclasses.replace(loop.state, last_change_s=clock.now_s - 31)
    for i in range(30):
        steps.add(70.0 + i, (0.8,) * 4, (0.5,) if i % 7 == 6 else ())
    d = loop.tick()
    assert (d.action, admission.base_limit) == (Action.DOWN, 2), d.reason
    # 0.8 s over the recent steps' batch (4 decoding, a first token now and then).
    assert loop.state.breach_step_s == pytest.approx(0.8 / 4, rel=0.05)
    for t in tasks[:2]:  # two of the four running finish: 2 run, 3 wait
        t.cancel()
    await asyncio.sleep(0.01)
    # The room cooled: 40 s on, a request's decode of steps at 100 ms with 2 running, a
    # quarter of the box that broke, and finished requests far under the SLO. The breaking
    # point at 4 was that box's: let go.
    clock.now_s = 140.0
    for i in range(40):
        steps.add(130.0 + 0.25 * i, (0.1,) * 2, (0.3,) if i % 7 == 6 else ())
    for _ in range(3):
        latency.add(clock.now_s - 1, 0.3, 0.1, admitted_s=clock.now_s - 6)
    d = loop.tick()
    assert (d.action, admission.base_limit) == (Action.UP, 3), d.reason
    assert "a slower box's breaking point, let go" in d.reason
    assert not loop.state.barrier and loop.state.breach_base == 4
    await asyncio.sleep(0.01)
    # So the next probe goes on to 4, where it broke, with no wait for a retry.
    clock.now_s += 2
    for _ in range(3):
        latency.add(clock.now_s - 0.5, 0.3, 0.1, admitted_s=clock.now_s - 1.5)
    d = loop.tick()
    assert (d.action, admission.base_limit) == (Action.UP, 4), d.reason
    await _cancel(tasks)


async def test_after_a_cut_the_requests_admitted_since_gate_probes_not_the_windows_tail():
    import dataclasses

    clock = Clock()
    loop, admission, latency, _ = _loop(clock, slo_tpot_p99_s=0.5)
    admission.open()
    tasks = await _queued(admission, 3)
    # A cut 20 s ago. Requests admitted before it finish at 600 ms a token (over the SLO):
    # they decoded at the limit cut from. One admitted since has finished, at 100 ms.
    loop.state = dataclasses.replace(
        loop.state,
        tick=10,
        last_change_tick=10,
        last_decrease_tick=10,
        last_change_s=clock.now_s - 20,
    )
    for _ in range(3):
        latency.add(clock.now_s - 1, 0.3, 0.6, admitted_s=clock.now_s - 25)
    latency.add(clock.now_s - 1, 0.3, 0.1, admitted_s=clock.now_s - 10)
    d = loop.tick()
    assert (d.action, admission.base_limit) == (Action.HOLD, 4), d.reason
    assert "p99 TPOT 600 ms > SLO 500 ms from requests admitted before the last cut" in d.reason
    assert "1 of those admitted since have finished, 2 needed" in d.reason
    # Two more of them: their tail (100 ms) gates the probe, and the old one holds nothing.
    for _ in range(2):
        latency.add(clock.now_s - 0.5, 0.3, 0.1, admitted_s=clock.now_s - 9)
    clock.now_s += 2
    d = loop.tick()
    assert (d.action, admission.base_limit) == (Action.UP, 6), d.reason
    assert "every p99 of the 3 admitted since the last change < 50% of its SLO" in d.reason
    await _cancel(tasks)
