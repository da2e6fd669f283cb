"""bench/trace_pooled.py: one controller's ratio to the oracle over several stored runs."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict
from pathlib import Path

import pytest

from bench.goodput_trace import PhaseResult, TraceRun
from bench.trace_pooled import Pooled, main, pool, t975


def _run(trace: str, arm: str, seed: int, good: int, hits: float | None = 0.02) -> dict:
    phases = (PhaseResult(0, 100, good),)
    return asdict(
        TraceRun(
            trace, arm, seed, 10, 100, good, good, 0, 0, good / 10, None, None, phases,
            prefix_cache_hit_ratio=hits,
        )
    )  # fmt: skip


def _doc(
    when: float, ctl: tuple[int, ...], trace: str = "thermal", hits: float | None = 0.02
) -> dict:
    runs = [_run(trace, "static:32", 0, 1, hits)]  # a worse limit on seed 0: 24 is the oracle
    runs += [_run(trace, "static:24", s, 100, hits) for s in range(len(ctl))]
    runs += [_run(trace, "controller", s, g, hits) for s, g in enumerate(ctl)]
    runs += [_run(trace, "controller<=24", s, 200, hits) for s in range(len(ctl))]
    return {"measured_at_unix_s": when, "runs": runs}


def test_runs_are_the_units_oldest_first_each_its_seeds_geometric_mean() -> None:
    later, earlier = _doc(2.0, (100, 400)), _doc(1.0, (50, 50))
    (row,) = pool([later, earlier], "controller", 1.1, 0.97)
    assert row.seeds == 4
    assert row.run_means == pytest.approx((math.log(0.5), math.log(2.0)))
    assert row.ratio == pytest.approx(1.0)
    # Another arm of the same runs pools on its own.
    (ceiling,) = pool([later, earlier], "controller<=24", 1.1, 0.97)
    assert ceiling.ratio == pytest.approx(2.0)


def test_the_interval_is_a_t_interval_over_the_run_means() -> None:
    means = (math.log(0.8), math.log(0.9), math.log(0.85))
    row = Pooled("thermal", 9, means, 1.1)
    half = t975(2) * statistics.stdev(means) / math.sqrt(3)
    low, high = row.interval or (0.0, 0.0)
    assert (low, high) == pytest.approx(
        (math.exp(statistics.fmean(means) - half), math.exp(statistics.fmean(means) + half))
    )
    assert row.verdict == "missed"  # all of it under 1.1x
    met = (math.log(1.2), math.log(1.22), math.log(1.25))
    assert Pooled("phase_change", 9, met, 1.1).verdict == "met"
    assert Pooled("diurnal", 6, (math.log(1.0), math.log(1.2)), 1.1).verdict == "open"
    assert Pooled("diurnal", 3, (math.log(1.3),), 1.1).verdict == "one run"
    assert Pooled("diurnal", 3, (math.log(1.3),), 1.1).interval is None


def test_t_quantiles() -> None:
    assert t975(1) == pytest.approx(12.706)
    assert t975(30) == pytest.approx(2.042)
    assert t975(100) == 2.0
    with pytest.raises(ValueError, match="dof"):
        t975(0)


def test_steady_traces_are_held_to_even_and_changing_ones_to_the_win() -> None:
    docs = [_doc(1.0, (100,), "steady_poisson"), _doc(1.0, (100,), "diurnal")]
    targets = {r.trace: r.target for r in pool(docs, "controller", 1.1, 0.97)}
    assert targets == {"steady_poisson": 0.97, "diurnal": 1.1}


def test_the_command_names_its_files_and_refuses_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.json").write_text(json.dumps(_doc(1.0, (90, 110, 100))))
    (tmp_path / "b.json").write_text(json.dumps(_doc(2.0, (80, 80, 80))))
    assert main([str(tmp_path / "*.json")]) == 0
    out = capsys.readouterr().out
    assert "| thermal | 2 | 6 | 1.00, 0.80 |" in out
    assert "a.json" in out and "b.json" in out
    # The command as published runs when pasted: an arm like controller<=24 is quoted.
    assert main([str(tmp_path / "*.json"), "--arm", "controller<=24"]) == 0
    assert "--arm 'controller<=24'" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no run with a static sweep"):
        main([str(tmp_path / "none-*.json")])
    with pytest.raises(SystemExit, match="target-steady: must be > 0"):
        main([str(tmp_path / "*.json"), "--target-steady", "0"])


def test_files_whose_arms_shared_the_prefix_cache_are_left_out_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "own.json").write_text(json.dumps(_doc(2.0, (80, 80, 80), hits=0.03)))
    (tmp_path / "shared.json").write_text(json.dumps(_doc(1.0, (200, 200, 200), hits=None)))
    assert main([str(tmp_path / "*.json")]) == 0
    out = capsys.readouterr().out
    assert "| thermal | 1 | 3 | 0.80 |" in out
    assert "Left out, 1 files whose arms shared the engine's prefix cache" in out
    assert out.count("shared.json") == 2  # in the command, and among those left out
    assert "Highest prefix-cache hit ratio of a run read: 3.0%" in out
    # Asked for, they pool too, and the command says so.
    assert main([str(tmp_path / "*.json"), "--with-shared-cache"]) == 0
    out = capsys.readouterr().out
    assert "| thermal | 2 | 6 | 2.00, 0.80 |" in out and "--with-shared-cache" in out
    assert "Left out" not in out
    (tmp_path / "own.json").unlink()
    with pytest.raises(SystemExit, match="on prompts of its own"):
        main([str(tmp_path / "*.json")])


def test_against_another_arm_each_seed_is_over_that_arms_good_and_zeros_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _doc(1.0, (100, 100, 100, 0))
    doc["runs"] += [_run("thermal", "unbounded", s, g) for s, g in enumerate((50, 0, 25, 10))]
    # Seed 1's unbounded made no good request: an unbounded ratio, in no mean (counted as
    # one, the controller's own 100 would stand in for a ratio). Seed 3's controller made
    # none: no ratio, left out, and the section says so of both.
    (row,) = pool([doc], "controller", 1.5, 0.97, against="unbounded")
    logs = [math.log(2), math.log(4)]
    assert row.run_means == pytest.approx((statistics.fmean(logs),))
    assert (row.seeds, row.base_zero, row.unscored, row.target) == (3, 1, 1, 1.5)
    (tmp_path / "a.json").write_text(json.dumps(doc))
    pat = str(tmp_path / "*.json")
    assert main([pat, "--against", "unbounded", "--target-changing", "1.5"]) == 0
    out = capsys.readouterr().out
    assert "## `controller` against `unbounded`, pooled" in out
    assert "--arm controller --against unbounded --target-changing 1.5" in out
    assert "| thermal | 1 | 3 | 2.83 | 2.83x | - | 1.5x | one run |" in out
    assert "Seeds left out where `controller` made no good request: thermal 1" in out
    assert "each ratio unbounded (in no run's mean;" in out and ": thermal 1 of 3." in out
    with pytest.raises(SystemExit, match="no run with an 'nothing' arm"):
        main([pat, "--against", "nothing"])


def test_a_base_that_never_made_a_good_request_is_met_from_two_runs_without_an_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def zero_base(when: float, ctl: tuple[int, ...]) -> dict:
        doc = _doc(when, ctl)
        doc["runs"] += [_run("thermal", "unbounded", s, 0) for s in range(len(ctl))]
        return doc

    def set_good(doc: dict, arm: str, seed: int, good: int) -> None:
        (run,) = [r for r in doc["runs"] if (r["arm"], r["seed"]) == (arm, seed)]
        run["good"] = good

    # Every seed's ratio is unbounded: the lower bounds' spread (here 2x to 400x, the
    # controller's own count) is no interval, and a second day makes the verdict.
    days = [zero_base(1.0, (2, 3, 4)), zero_base(2.0, (300, 350, 400))]
    (one,) = pool(days[:1], "controller", 1.5, 0.97, against="unbounded")
    assert (one.base_never_good, one.interval, one.verdict) == (True, None, "one run")
    (row,) = pool(days, "controller", 1.5, 0.97, against="unbounded")
    assert (row.seeds, row.base_zero, row.unscored) == (6, 6, 0)
    assert row.base_never_good and row.interval is None
    assert row.verdict == "met (base made no good request in any seed)"
    for i, doc in enumerate(days):
        (tmp_path / f"{i}.json").write_text(json.dumps(doc))
    assert main([str(tmp_path / "*.json"), "--against", "unbounded"]) == 0
    out = capsys.readouterr().out
    assert "| thermal | 2 | 6 | ∞, ∞ | ∞x | - | 1.1x | met (base made no good request" in out
    assert "thermal 6 of 6. Where that is every seed" in out
    # One seed where the base made some: that run's mean is over that seed alone (400/100),
    # and one such run gives no interval.
    set_good(days[1], "unbounded", 2, 100)
    (mixed,) = pool(days, "controller", 1.5, 0.97, against="unbounded")
    assert not mixed.base_never_good and mixed.interval is None
    assert mixed.run_means == (None, pytest.approx(math.log(4)))
    assert (mixed.base_zero, mixed.verdict) == (5, "1 of 2 runs where the base made some")
    # A second such run (about 4x): the interval is over those two, and the seeds at zero
    # (with the arm's counts of 2 to 350 as lower bounds, they spread it to nothing) are out.
    third = _doc(3.0, (390, 400, 410))
    third["runs"] += [_run("thermal", "unbounded", s, 100) for s in range(3)]
    (both,) = pool([*days, third], "controller", 1.5, 0.97, against="unbounded")
    assert both.interval is not None and both.interval[0] >= 1.5
    assert both.verdict == "met"
    assert both.ratio == pytest.approx(math.exp(statistics.fmean(both.run_means[1:])))
    # All under the target, but some seeds wholly in the arm's favour were left out: open,
    # where the same runs without them are missed.
    runs = (math.log(4.0), math.log(4.1))
    assert Pooled("thermal", 6, runs, 10.0).verdict == "missed"
    assert Pooled("thermal", 7, runs, 10.0, base_zero=1).verdict == "open"
    # A seed where the controller made none: that seed has no ratio, so not every one is
    # unbounded.
    set_good(days[1], "unbounded", 2, 0)
    set_good(days[0], "controller", 2, 0)
    (gap,) = pool(days, "controller", 1.5, 0.97, against="unbounded")
    assert (gap.unscored, gap.base_never_good) == (1, False)
    assert gap.verdict == "0 of 2 runs where the base made some"
