"""The trace bench's pure parts: traces, their schedules, and the cells of the table."""

from __future__ import annotations

import json

import pytest

from appliance.bench_runner import RequestSample
from bench.goodput import GoodputSlo
from bench.goodput_trace import (
    TRACES_DIR,
    Arrival,
    PhaseResult,
    TraceRun,
    arm_bodies,
    cells,
    load_trace,
    parse_trace,
    schedule,
    summarise,
)


def _seg(**kw: object) -> dict[str, object]:
    return {"duration_s": 10, "rate_x": 1.0, "prompt_tokens": 100, **kw}


def test_every_shipped_trace_loads() -> None:
    names = sorted(p.stem for p in TRACES_DIR.glob("*.json"))
    assert {"phase_change", "diurnal", "thermal", "steady_poisson", "steady_bursty"} <= set(names)
    for name in names:
        assert load_trace(name).duration_s > 0


def test_the_phase_change_keeps_the_rate_and_moves_the_prompt() -> None:
    t = load_trace("phase_change")
    assert len({s.rate_x for s in t.segments}) == 1
    assert [s.prompt_tokens for s in t.segments] == [100, 1500, 100]


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({"segments": [_seg()]}, "name: required"),
        ({"name": "x", "segments": []}, "segments: required"),
        ({"name": "x", "segments": [_seg(rate=1)]}, "segments[0].rate: unknown field"),
        ({"name": "x", "segments": [{"duration_s": 1, "rate_x": 1}]}, "prompt_tokens: required"),
        ({"name": "x", "segments": [_seg(duration_s=0)]}, "duration_s: must be a number > 0"),
        ({"name": "x", "segments": [_seg(rate_x=0)]}, "a segment with no arrivals"),
        ({"name": "x", "segments": [_seg(prompt_tokens=5000)]}, "prompt_tokens: must be"),
        ({"name": "x", "segments": [_seg(arrival="wave")]}, "arrival: must be one of"),
        ({"name": "x", "segments": [_seg(fault="fire")]}, "fault: must be one of"),
        ({"name": "x", "segments": [_seg(slowdown_procs=99)]}, "slowdown_procs"),
    ],
)
def test_bad_traces_name_the_field(doc: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        parse_trace(doc)


def test_schedule_follows_rates_ramps_and_segments() -> None:
    t = parse_trace(
        {
            "name": "t",
            "segments": [
                _seg(duration_s=100, rate_x=1.0),
                _seg(duration_s=100, rate_x=0.0, rate_x_end=2.0, prompt_tokens=1500),
            ],
        }
    )
    arrivals = schedule(t, capacity_rps=2.0, seed=3)
    assert arrivals == schedule(t, capacity_rps=2.0, seed=3)  # one seed, one schedule
    first = [a for a in arrivals if a.segment == 0]
    ramp = [a for a in arrivals if a.segment == 1]
    assert all(a.at_s < 100 and a.prompt_tokens == 100 for a in first)
    assert all(100 <= a.at_s < 200 and a.prompt_tokens == 1500 for a in ramp)
    # 2 req/s for 100 s, and a ramp 0 -> 4 req/s (mean 2): about 200 each.
    assert 160 < len(first) < 240 and 160 < len(ramp) < 240
    # The ramp is thin early and dense late.
    assert sum(a.at_s < 150 for a in ramp) < sum(a.at_s >= 150 for a in ramp) / 2


def test_the_controller_arm_starts_from_the_chosen_limit() -> None:
    bodies = arm_bodies("controller", 64)
    assert bodies[0] == {"mode": "manual", "limit": 8} and bodies[-1]["mode"] == "auto"
    # The shipped daemon's start: engine.max_num_seqs.
    assert arm_bodies("controller", 64, 64)[0] == {"mode": "manual", "limit": 64}
    with pytest.raises(ValueError, match=r"controller start: must be in \[1, 64\], got 65"):
        arm_bodies("controller", 64, 65)
    assert arm_bodies("static:16", 64) == [{"mode": "manual", "limit": 16, "max": 64}]
    with pytest.raises(ValueError, match="arm"):
        arm_bodies("fastest", 64)


def test_a_headroom_arm_steers_the_controller_to_its_own_tpot() -> None:
    from bench.goodput_trace import headroom_arm, headroom_tpot_s, is_controller

    arm = headroom_arm(0.3)
    assert arm == "controller@0.3s" and headroom_tpot_s(arm) == 0.3 and is_controller(arm)
    assert headroom_tpot_s("controller") is None and not is_controller("static:24")
    assert arm_bodies(arm, 64) == [
        {"mode": "manual", "limit": 8},
        {"mode": "auto", "max": 64, "slo_tpot_p99_s": 0.3},
    ]
    # Beside a headroom arm the shipped controller puts the scored SLO back; alone, the
    # daemon's own TPOT SLO stands.
    assert arm_bodies("controller", 64, 8, 0.5)[-1]["slo_tpot_p99_s"] == 0.5
    assert "slo_tpot_p99_s" not in arm_bodies("controller", 64)[-1]
    assert arm_bodies(arm, 64, 8, 0.5)[-1]["slo_tpot_p99_s"] == 0.3


def test_headroom_targets_are_under_the_scored_tpot_slo_each_once() -> None:
    from bench.goodput_trace import _headroom_targets

    assert _headroom_targets("0.3, 0.3,0.4,", 0.5) == (0.3, 0.4)
    assert _headroom_targets("", 0.5) == ()
    with pytest.raises(
        SystemExit, match=r"headroom-tpot-s: must be in \(0, --slo-tpot-s 0.5\), got 0.5"
    ):
        _headroom_targets("0.5", 0.5)
    with pytest.raises(SystemExit, match="--slo-tpot-s 0"):
        _headroom_targets("0.3", 0.0)  # no TPOT SLO: nothing to keep headroom under
    with pytest.raises(SystemExit, match="'fast' is not a number of seconds"):
        _headroom_targets("fast", 0.5)


async def test_every_seed_runs_each_controller_arm_with_its_own_tpot(monkeypatch) -> None:
    import bench.goodput_trace as gt

    bodies: list[dict[str, object]] = []

    class FakeDaemon:
        async def wait_idle(self) -> None:
            return None

        async def set_controller(self, body: dict[str, object]) -> tuple[bool, str]:
            bodies.append(body)
            return True, "applied"

        async def prefix_cache_tokens(self) -> tuple[int, int]:
            # Each reading 1000 tokens looked up and 250 found after the last.
            self.readings += 1
            return 1_000 * self.readings, 250 * self.readings

        readings = 0

    async def cool(*_: object, **__: object) -> None:
        return None

    async def replay(*args: object) -> tuple[list[RequestSample], list[dict[str, object]]]:
        return [], []

    def summarise(trace, arm, seed, *rest):  # type: ignore[no-untyped-def]
        return _run(arm, seed, 3.0 if arm == "static:16" else 1.0)

    monkeypatch.setattr(gt, "wait_thermal_normal", cool)
    monkeypatch.setattr(gt, "replay", replay)
    monkeypatch.setattr(gt, "summarise", summarise)
    plan = _plan({"name": "t", "segments": [_seg()]}, headroom_tpot_s=(0.3,), skip_unbounded=("t",))
    calib = gt.Calibration(1.3, 20.0)
    daemon = FakeDaemon()
    runs = await gt.run_trace_arms(None, None, daemon, plan.traces[0], plan, 4.0, calib, log=str)
    # Each run's hit ratio is read around its own replay.
    assert {r.prefix_cache_hit_ratio for r in runs} == {0.25}
    assert [(r.arm, r.seed) for r in runs] == [
        ("static:16", 0),
        ("controller", 0),
        ("controller@0.3s", 0),
        ("controller@0.3s", 1),
        ("static:16", 1),
        ("controller", 1),
    ]
    # Each controller arm set its own target before it ran: a headroom arm's never lingers.
    autos = [b for b in bodies if b.get("mode") == "auto"]
    assert [b["slo_tpot_p99_s"] for b in autos] == [0.5, 0.3, 0.3, 0.5]
    # Without headroom arms every run is still kept, and the daemon's own TPOT SLO stands.
    bodies.clear()
    plain = _plan({"name": "t", "segments": [_seg()]}, skip_unbounded=("t",))
    runs = await gt.run_trace_arms(None, None, daemon, plain.traces[0], plain, 4.0, calib, log=str)
    assert [(r.arm, r.seed) for r in runs] == [
        ("static:16", 0),
        ("controller", 0),
        ("static:16", 1),
        ("controller", 1),
    ]
    assert not any("slo_tpot_p99_s" in b for b in bodies)
    # A ceiling arm runs every seed under its own max, in the seed's rotated order; the
    # shipped arm's max is the daemon's again when it runs after the ceiling arm.
    bodies.clear()
    capped = _plan({"name": "t", "segments": [_seg()]}, ceilings=(24,), skip_unbounded=("t",))
    runs = await gt.run_trace_arms(
        None, None, daemon, capped.traces[0], capped, 4.0, calib, log=str
    )
    assert [(r.arm, r.seed) for r in runs] == [
        ("static:16", 0),
        ("controller", 0),
        ("controller<=24", 0),
        ("controller<=24", 1),
        ("static:16", 1),
        ("controller", 1),
    ]
    assert [b["max"] for b in bodies if b.get("mode") == "auto"] == [64, 24, 24, 64]


def test_a_seeds_arms_rotate_so_no_arm_always_follows_another() -> None:
    from bench.goodput_trace import seed_order

    arms = ["controller", "controller<=24", "static:24"]
    orders = [seed_order(arms, seed) for seed in range(3)]
    assert orders == [
        ["controller", "controller<=24", "static:24"],
        ["controller<=24", "static:24", "controller"],
        ["static:24", "controller", "controller<=24"],
    ]
    # Over the seeds the ceiling arm runs both before and after the shipped arm.
    before = [o.index("controller<=24") < o.index("controller") for o in orders]
    assert True in before and False in before
    assert seed_order(arms, 3) == arms  # the rotation wraps
    assert seed_order([], 2) == []


def test_hit_ratio_reads_the_share_found_between_two_readings() -> None:
    from bench.goodput_trace import hit_ratio

    assert hit_ratio((1_000, 200), (3_000, 700)) == 0.25
    assert hit_ratio((1_000, 200), (3_000, 200)) == 0.0
    assert hit_ratio(None, (3_000, 700)) is None
    assert hit_ratio((1_000, 200), None) is None
    assert hit_ratio((1_000, 200), (1_000, 200)) is None  # nothing looked up
    assert hit_ratio((1_000, 200), (400, 100)) is None  # the engine restarted: totals went back


def test_each_run_gets_a_tag_of_its_own() -> None:
    from bench.goodput import run_tag

    tags = {run_tag() for _ in range(1_000)}
    assert len(tags) == 1_000
    # A tag leads the prompt as words of its own, so the first block differs run to run.
    assert all(t.startswith("[run ") and t.endswith("] ") for t in tags)


def _run(arm: str, seed: int, goodput: float) -> TraceRun:
    return TraceRun("t", arm, seed, 10, 1, 1, 1, 0, 0, goodput, None, None, (PhaseResult(0, 1, 1),))


def _sample(status: int, ttft_s: float | None = None, tpot_s: float | None = None) -> RequestSample:
    ok = status == 200
    return RequestSample(ok, "chat", status, None, 100, 32 if ok else 0, ttft_s, tpot_s, 1.0, 0.0)


def test_each_phase_says_why_its_requests_were_not_good() -> None:
    trace = parse_trace({"name": "t", "segments": [_seg(), _seg()]})
    arrivals = [Arrival(float(i), 100, 0 if i < 4 else 1) for i in range(6)]
    samples = [
        _sample(200, 1.0, 0.1),  # good
        _sample(200, 6.0, 0.1),  # late first token
        _sample(200, 6.0, 0.9),  # late on both
        _sample(429),
        _sample(200, 1.0, 0.6),  # slow decode
        _sample(200, 1.0, 0.2),  # good
    ]
    run = summarise(trace, "controller", 0, arrivals, samples, GoodputSlo(5.0, 0.5))
    assert run.phases == (
        PhaseResult(
            0, 4, 1, ok=3, late_ttft=2, late_tpot=1, rejected=1, tpot_p50_s=0.1, tpot_p99_s=0.9
        ),
        PhaseResult(
            1, 2, 1, ok=2, late_ttft=0, late_tpot=1, rejected=0, tpot_p50_s=0.2, tpot_p99_s=0.6
        ),
    )
    assert (run.good, run.ok, run.rejected) == (2, 5, 1)


def test_cells_take_the_best_static_of_seed_zero_and_medians() -> None:
    runs = [
        _run("static:8", 0, 2.0),
        _run("static:16", 0, 3.0),
        _run("static:16", 1, 2.0),
        _run("static:16", 2, 4.0),
        *(_run("controller", s, g) for s, g in enumerate((3.3, 3.6, 3.0))),
        *(_run("unbounded", s, 1.0) for s in range(3)),
    ]
    (row,) = cells(runs)
    assert row["best_static"] == "static:16"
    assert row["static"] == {"median": 3.0, "min": 2.0, "max": 4.0, "n": 3}
    assert row["controller"]["median"] == 3.3
    assert row["controller_vs_static"] == pytest.approx(1.1)
    assert row["controller_vs_unbounded"] == pytest.approx(3.3)
    assert row["variants"] == {}


def test_a_headroom_arm_gets_its_spread_and_ratio_in_the_cells_and_the_table() -> None:
    from bench.goodput_trace import render_markdown

    runs = [
        _run("static:16", 0, 3.0),
        _run("static:16", 1, 2.0),
        *(_run("controller", s, g) for s, g in enumerate((2.0, 2.2))),
        *(_run("controller@0.3s", s, g) for s, g in enumerate((2.7, 3.3))),
    ]
    (row,) = cells(runs)
    assert row["controller"]["median"] == pytest.approx(2.1)  # the shipped arm's alone
    head = row["variants"]["controller@0.3s"]
    assert head["median"] == pytest.approx(3.0) and (head["min"], head["max"]) == (2.7, 3.3)
    assert head["vs_static"] == pytest.approx(3.0 / 2.5)
    doc = {
        "plan": {"warmup_s": 45, "slo": {"ttft_s": 5.0, "tpot_s": 0.5}, "max_tokens": 32},
        "measured_at_unix_s": 0.0,
        "command": "python bench/goodput_trace.py --headroom-tpot-s 0.3",
        "machine": "m",
        "capacity_rps": 4.0,
        "cells": [row],
        "notes": [],
    }
    assert "- t, controller@0.3s: 3.00 [2.70-3.30] (1.20x the best static)" in render_markdown(doc)
    # A file from before ceiling arms kept its headroom arms under "headroom".
    old = {
        **doc,
        "cells": [
            {
                **{k: v for k, v in row.items() if k != "variants"},
                "headroom": {"controller@0.3s": head},
            }
        ],
    }
    assert "- t, controller@0.3s: 3.00 [2.70-3.30] (1.20x the best static)" in render_markdown(old)


def test_a_ceiling_arm_runs_the_controller_under_its_own_max() -> None:
    from bench.goodput_trace import _ceilings, arm_ceiling, ceiling_arm, is_controller

    arm = ceiling_arm(32)
    assert arm == "controller<=32" and arm_ceiling(arm) == 32 and is_controller(arm)
    assert arm_ceiling("controller") is None and arm_ceiling("controller@0.3s") is None
    assert arm_bodies(arm, 64) == [{"mode": "manual", "limit": 8}, {"mode": "auto", "max": 32}]
    # It starts at its ceiling where that is under the shipped start, and beside headroom
    # arms it puts the scored TPOT back like the shipped arm.
    assert arm_bodies("controller<=4", 64)[0] == {"mode": "manual", "limit": 4}
    assert arm_bodies(arm, 64, 8, 0.5)[-1] == {"mode": "auto", "max": 32, "slo_tpot_p99_s": 0.5}
    assert _ceilings("32, 48,32,", 64) == (32, 48)
    assert _ceilings("", 64) == ()
    with pytest.raises(SystemExit, match=r"ceiling-arms: must be in \[1, --max-limit 64\), got 64"):
        _ceilings("64", 64)
    with pytest.raises(SystemExit, match="'big' is not a whole number"):
        _ceilings("big", 64)


def test_the_ceiling_of_a_ratio_is_the_most_any_arm_served_over_the_oracles_good_ones() -> None:
    from dataclasses import replace

    from bench.goodput_trace import render_markdown, served_vs_static

    def run(arm: str, seed: int, good: int, ok: int) -> TraceRun:
        return replace(_run(arm, seed, good / 10), good=good, ok=ok)

    runs = [
        run("static:24", 0, 90, 90),  # every request it served was good
        run("static:32", 0, 80, 95),
        run("controller", 0, 60, 92),  # served more, many late: it bounds nothing
        run("static:24", 1, 70, 75),
        run("controller", 1, 72, 84),
        run("static:32", 2, 50, 50),  # not the best limit: no seed of its own counts
    ]
    got = served_vs_static(runs, "static:24")
    # Seed 0: the most served is static 32's 95 over 90 good; seed 1: 84 over 70.
    assert got == pytest.approx(
        {"median": (95 / 90 + 84 / 70) / 2, "min": 95 / 90, "max": 1.2, "n": 2}
    )
    assert served_vs_static([run("static:24", 0, 0, 5)], "static:24") is None
    (row,) = cells(runs)
    assert row["served_vs_static"] == got
    doc = {
        "plan": {"slo": {"ttft_s": 5.0, "tpot_s": 0.5}, "max_tokens": 32, "warmup_s": 0},
        "measured_at_unix_s": 0,
        "command": "x",
        "machine": "m",
        "capacity_rps": 4.0,
        "cells": [row],
        "notes": [],
    }
    assert "- t: 1.13x [1.06-1.20]" in render_markdown(doc)


def test_goodput_counts_ttft_and_tpot() -> None:
    slo = GoodputSlo(5.0, 0.5)
    from appliance.bench_runner import RequestSample

    ok = RequestSample(True, "chat", 200, None, 10, 32, 4.9, 0.4, 6.0, 0.0)
    late = RequestSample(True, "chat", 200, None, 10, 32, 5.1, 0.4, 6.0, 0.0)
    slow = RequestSample(True, "chat", 200, None, 10, 32, 1.0, 0.6, 6.0, 0.0)
    assert slo.good(ok) and not slo.good(late) and not slo.good(slow)


def test_the_warmup_is_the_first_segments_load_unscored() -> None:
    from bench.goodput_trace import warmup_schedule

    t = parse_trace(
        {
            "name": "t",
            "segments": [
                _seg(duration_s=50, rate_x=1.0, rate_x_end=3.0, fault="hot_room"),
                _seg(prompt_tokens=1500),
            ],
        }
    )
    lead = warmup_schedule(t, 2.0, 0, 30.0)
    assert lead and all(a.segment == -1 and 0 <= a.at_s < 30 for a in lead)
    assert all(a.prompt_tokens == 100 for a in lead)
    assert 40 < len(lead) < 85  # the segment's starting rate (2 req/s), not its ramp
    assert warmup_schedule(t, 2.0, 0, 0.0) == []


def test_a_repeating_trace_warms_up_on_its_own_end() -> None:
    from bench.goodput_trace import schedule, warmup_schedule

    doc = {
        "name": "day",
        "lead_in": "tail",
        "segments": [
            _seg(duration_s=20, rate_x=0.5),
            _seg(duration_s=40, rate_x=2.0, prompt_tokens=400, fault="hot_room"),
        ],
    }
    t = parse_trace(doc)
    lead = warmup_schedule(t, 2.0, 0, 30.0)
    assert lead and all(a.segment == -1 and 0 <= a.at_s < 30 for a in lead)
    # The last 30 s of the day: the 400-token segment at 4 req/s, not the quiet start.
    assert all(a.prompt_tokens == 400 for a in lead) and 90 < len(lead) < 150
    # The same arrivals as the trace's own end (another seed), shifted to end at 0.
    mirror = [a for a in schedule(t, 2.0, 7_000) if a.at_s >= 30]
    assert [round(a.at_s - 30, 9) for a in mirror] == [round(a.at_s, 9) for a in lead]
    with pytest.raises(ValueError, match=r"day.lead_in: must be one of first, tail"):
        parse_trace({**doc, "lead_in": "loop"}, where="day")


def _plan(trace_doc: dict[str, object], **kw: object) -> object:
    from bench.goodput_trace import Plan

    base = {
        "traces": (parse_trace(trace_doc),),
        "runs": 2,
        "levels": (16,),
        "slo": GoodputSlo(5.0, 0.5),
        "max_tokens": 32,
        "drain_s": 15.0,
        "max_limit": 64,
        "capacity_rps": 5.68,
        "warmup_s": 45.0,
    }
    return Plan(**{**base, **kw})  # type: ignore[arg-type]


def test_fixed_arms_are_reused_only_from_a_run_that_matches(tmp_path) -> None:
    import json
    from dataclasses import asdict

    from bench.goodput_trace import load_reuse

    trace_doc = {"name": "t", "segments": [_seg(duration_s=10)]}
    then = {
        "measured_at_unix_s": 0.0,
        "command": "python bench/goodput_trace.py --traces t",
        "capacity_rps": 5.68,
        "plan": {
            "runs": 3,
            "warmup_s": 45.0,
            "slo": {"ttft_s": 5.0, "tpot_s": 0.5},
            "max_tokens": 32,
            "drain_s": 15.0,
        },
        "runs": [
            asdict(r)
            for r in (
                _run("static:16", 0, 3.0),
                _run("static:32", 0, 2.0),
                _run("static:16", 1, 2.5),
                _run("static:16", 2, 9.0),  # a seed this plan does not run
                _run("unbounded", 0, 1.0),
                _run("controller", 0, 5.0),  # never reused: it is what runs again
                _run("controller@0.3s", 0, 4.0),  # nor a headroom arm
                _run("controller<=24", 0, 4.0),  # nor a ceiling arm
            )
        ],
    }
    path = tmp_path / "then.json"
    path.write_text(json.dumps(then))
    reuse, notes = load_reuse(path, _plan(trace_doc))
    assert sorted((r.arm, r.seed) for r in reuse["t"]) == [
        ("static:16", 0),
        ("static:16", 1),
        ("static:32", 0),
        ("unbounded", 0),
    ]
    assert "only the controller ran here" in notes[0] and "then.json" in notes[0]
    # Another capacity, SLO or trace shape: the numbers would not compare; refused by name.
    with pytest.raises(SystemExit, match="capacity"):
        load_reuse(path, _plan(trace_doc, capacity_rps=6.0))
    with pytest.raises(SystemExit, match="slo"):
        load_reuse(path, _plan(trace_doc, slo=GoodputSlo(2.0, 0.5)))
    with pytest.raises(SystemExit, match="another shape"):
        load_reuse(path, _plan({"name": "t", "segments": [_seg(duration_s=20)]}))
    # A file from before lead-ins were named warmed up on the first segment: another
    # lead-in is another measurement.
    with pytest.raises(SystemExit, match="t lead_in first, here tail"):
        load_reuse(path, _plan({**trace_doc, "lead_in": "tail"}))


def test_a_reused_arm_stands_only_while_its_check_run_lands_where_it_did() -> None:
    from bench.goodput_trace import best_static_seed0, reuse_drift

    reused = [_run("static:16", 0, 4.0), _run("static:32", 0, 4.73), _run("static:32", 1, 4.5)]
    then = best_static_seed0(reused)
    assert (then.arm, then.seed) == ("static:32", 0)
    # Within the tolerance, either way: it stands, and the note gives both figures.
    for here in (4.60, 4.90):
        ok, note = reuse_drift(then, _run("static:32", 0, here), 0.05)
        assert ok, note
        assert "static:32 seed 0" in note and f"{here:.2f}" in note and "4.73" in note
    # The box a fifth slower (what issue 15's reused thermal arm hid): refused, by how much.
    ok, note = reuse_drift(then, _run("static:32", 0, 4.11), 0.05)
    assert not ok
    assert "-13%" in note and "refused" in note
    ok, _ = reuse_drift(then, _run("static:32", 0, 5.0), 0.05)
    assert not ok
    # A reused zero stands only against a zero.
    zero = _run("static:32", 0, 0.0)
    assert reuse_drift(zero, zero, 0.05)[0]
    assert not reuse_drift(zero, _run("static:32", 0, 0.5), 0.05)[0]


def test_the_oracle_is_the_best_seed_zero_and_the_smaller_limit_on_a_tie() -> None:
    from bench.goodput_trace import best_static_seed0

    runs = [_run("static:64", 0, 3.0), _run("static:16", 0, 3.0), _run("static:16", 1, 9.0)]
    assert best_static_seed0(runs).arm == "static:16"


def test_a_bench_publishes_its_table_into_its_section_and_every_number_to_json(tmp_path):
    from bench.report import publish_doc

    md, out = tmp_path / "b.md", tmp_path / "o.json"
    md.write_text("# Benchmarks\n\n<!-- other:start -->\nkept\n<!-- other:end -->\n")
    publish_doc("| a |\n", {"n": 1, "at": tmp_path}, str(md), "mine", str(out))
    publish_doc("| b |\n", {"n": 2}, str(md), "mine", None)  # run again: replaced, once
    text = md.read_text()
    assert "kept" in text and "| b |" in text and "| a |" not in text
    assert text.count("<!-- mine:start -->") == 1
    assert json.loads(out.read_text()) == {"n": 1, "at": str(tmp_path)}


def test_a_cpu_burner_goes_when_the_bench_that_started_it_goes():
    import os
    import subprocess
    import sys
    import time

    from bench.report import start_burner

    # While the bench runs, so does the burner.
    mine = start_burner()
    time.sleep(0.3)
    alive = mine.poll() is None
    mine.kill()
    mine.wait()
    assert alive
    # A bench that starts a burner and is gone at once (as a killed bench is).
    bench = subprocess.run(
        [
            sys.executable,
            "-c",
            "from bench.report import start_burner; print(start_burner().pid)",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=str(TRACES_DIR.parents[1]),
    )
    burner = int(bench.stdout.strip())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(burner, 0)
        except ProcessLookupError:
            return  # gone (reaped by init once its parent went)
        with open(f"/proc/{burner}/stat") as f:
            if f.read().split()[2] == "Z":
                return  # exited, not yet reaped
        time.sleep(0.1)
    os.kill(burner, 9)
    raise AssertionError("the burner outlived the bench that started it")


async def test_the_watch_keeps_each_change_of_the_controller_with_its_reason() -> None:
    import asyncio
    import time

    from bench import goodput_trace

    now = time.time()
    old = {"ts_s": now - 60, "reason": "manual limit 8: 64 -> 8"}  # before the watch began
    up = {"ts_s": now + 1, "reason": "p99 TTFT 1 s < 4 s: 8 -> 12"}
    down = {"ts_s": now + 3, "reason": "the engine's last 31 steps: TPOT 600 ms: 12 -> 9"}
    snaps = iter([[old], [old, up], [old, up], [old, up, down]])

    class Daemon:
        async def status(self) -> dict[str, object]:
            decisions = next(snaps, [old, up, down])
            return {"admission": {"limit": 8}, "controller": {"decisions": decisions}}

    out: list[dict[str, object]] = []
    task = asyncio.create_task(goodput_trace._watch(Daemon(), 0.0, out, 0.001))  # type: ignore[arg-type]
    while len(out) < 5:
        await asyncio.sleep(0.001)
    task.cancel()
    assert [x["changes"] for x in out[:5]] == [[], [up["reason"]], [], [down["reason"]], []]
