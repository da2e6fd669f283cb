"""bench/trace_onset.py: where the controller stood when a stored trace run's load changed."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from bench.goodput_trace import PhaseResult, TraceRun
from bench.trace_onset import band_of, boundaries_s, collect, limit_before, main, rows

DURATIONS = {"thermal": [30.0, 45.0, 30.0]}


def _run(arm: str, seed: int, goods: tuple[int, int, int], limits: dict[float, int]) -> dict:
    phases = tuple(PhaseResult(i, 100, g) for i, g in enumerate(goods))
    timeline = tuple({"t_s": t, "limit": lim, "reason": "holding"} for t, lim in limits.items())
    run = TraceRun("thermal", arm, seed, 105, 300, 0, sum(goods), 0, 0, 0.0, None, None, phases)
    return asdict(run) | {"timeline": list(timeline), "prefix_cache_hit_ratio": 0.0}


def _doc() -> dict[str, Any]:
    return {
        "runs": [
            _run("static:24", 0, (90, 40, 90), {}),
            _run("static:32", 0, (85, 30, 90), {}),  # seed 0's best is 24: the oracle
            _run("static:24", 1, (80, 50, 80), {}),
            # Seed 0 stood at 45 (1.9x the oracle's 24) before the hot room and at 20 before
            # the cool phase after; seed 1 at 24 and 30 (1.25x).
            _run("controller", 0, (60, 30, 100), {18.0: 40, 26.0: 45, 30.0: 12, 70.0: 20}),
            _run("controller", 1, (82, 48, 84), {22.0: 24, 68.0: 30, 80.0: 60}),
        ]
    }


def test_boundaries_and_the_limit_in_the_span_before_a_change() -> None:
    assert boundaries_s([30.0, 45.0, 30.0]) == [30.0, 75.0]
    timeline = [{"t_s": 18.0, "limit": 40}, {"t_s": 26.0, "limit": 45}, {"t_s": 30.0, "limit": 60}]
    # The span is [at - before, at): the sample at the change itself is not before it.
    assert limit_before(timeline, 30.0, 10.0) == 45
    assert limit_before(timeline, 30.0, 5.0) == 45
    assert limit_before(timeline, 30.0, 3.0) is None  # nothing in [27, 30)
    assert limit_before(timeline, 18.0, 5.0) is None


def test_bands_are_the_controllers_limit_over_the_oracles() -> None:
    assert band_of(24, 24) == "at or under the oracle's"
    assert band_of(31, 24) == "up to 1.3x the oracle's"
    assert band_of(45, 24) == "over 1.3x the oracle's"


def test_each_seed_at_each_change_is_set_against_the_oracle_of_its_own_seed() -> None:
    found = collect([_doc()], DURATIONS, before_s=10.0)
    by = {(o.boundary, o.limit): o for o in found}
    assert set(by) == {(0, 45), (1, 20), (0, 24), (1, 30)}
    hot = by[(0, 45)]
    assert hot.oracle_limit == 24
    assert hot.run_ratio == pytest.approx(190 / 220)
    assert (hot.before_diff, hot.after_diff) == (60 - 90, 30 - 40)
    seed1 = by[(1, 30)]
    # Seed 1 against static 24's seed 1 (the oracle arm), not seed 0's.
    assert seed1.run_ratio == pytest.approx(214 / 210)
    assert (seed1.before_diff, seed1.after_diff) == (48 - 50, 84 - 80)
    table = rows(found, {"thermal": [30.0, 75.0]})
    assert [(r.boundary, r.band, r.seeds) for r in table] == [
        (0, "at or under the oracle's", 1),
        (0, "over 1.3x the oracle's", 1),
        (1, "at or under the oracle's", 1),
        (1, "up to 1.3x the oracle's", 1),
    ]


def test_runs_without_a_sweep_or_with_another_shape_are_left_out() -> None:
    doc = _doc()
    no_sweep = {"runs": [r for r in doc["runs"] if not r["arm"].startswith("static")]}
    assert collect([no_sweep], DURATIONS, before_s=10.0) == []
    assert collect([doc], {"thermal": [30.0, 75.0]}, before_s=10.0) == []  # 2 segments, 3 phases


def test_the_command_reads_globs_and_names_what_it_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.json").write_text(json.dumps(_doc()))
    assert main([str(tmp_path / "*.json")]) == 0
    out = capsys.readouterr().out
    assert "| thermal | 30 s | over 1.3x the oracle's | 1 | 0.86x | -30 | -10 |" in out
    with pytest.raises(SystemExit, match="before-s"):
        main([str(tmp_path / "*.json"), "--before-s", "0"])
    with pytest.raises(SystemExit, match="no controller run"):
        main([str(tmp_path / "none-*.json")])


def test_files_whose_arms_shared_the_prefix_cache_are_read_only_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shared = _doc()
    shared["runs"] = [{**r, "prefix_cache_hit_ratio": None} for r in shared["runs"]]
    (tmp_path / "shared.json").write_text(json.dumps(shared))
    with pytest.raises(SystemExit, match="on prompts of its own"):
        main([str(tmp_path / "*.json")])
    assert main([str(tmp_path / "*.json"), "--with-shared-cache"]) == 0
    out = capsys.readouterr().out
    assert "over 1.3x the oracle's | 1 | 0.86x" in out and "--with-shared-cache`" in out
