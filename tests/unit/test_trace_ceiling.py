"""bench/trace_ceiling.py: how far a controller could beat the oracle in stored runs."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from bench.goodput_trace import PhaseResult, TraceRun
from bench.trace_ceiling import ceilings, main


def _run(trace: str, arm: str, seed: int, good: int, ok: int) -> dict:
    run = TraceRun(trace, arm, seed, 10, 100, ok, good, 0, 0, good / 10, None, None, ())
    phases = (PhaseResult(0, 100, good, ok=ok),)
    return asdict(replace(run, phases=phases, prefix_cache_hit_ratio=0.0))


DOC = {
    "runs": [
        _run("thermal", "static:24", 0, 90, 90),
        _run("thermal", "static:32", 0, 80, 95),
        _run("thermal", "controller", 0, 60, 92),
        _run("thermal", "static:24", 1, 70, 84),
        _run("thermal", "controller", 1, 72, 80),
        _run("steady", "controller", 0, 50, 50),  # no static sweep: not counted
    ]
}


def test_each_seed_is_bounded_by_the_busiest_arm_over_the_oracles_good() -> None:
    (row,) = ceilings([DOC, DOC], target=1.1)
    # Seed 0: static 32 served 95 over static 24's 90 good; seed 1: 84 over 70. Twice.
    assert row.trace == "thermal" and row.files == 2
    assert row.ceilings == pytest.approx((95 / 90, 1.2, 95 / 90, 1.2))
    assert row.under_target == 2


def test_the_command_reads_globs_and_names_what_it_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.json").write_text(json.dumps(DOC))
    assert main([str(tmp_path / "*.json")]) == 0
    assert "| thermal | 1 | 2 | 1.13x [1.06-1.20] | 1 |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="target"):
        main([str(tmp_path / "*.json"), "--target", "0"])
    with pytest.raises(SystemExit, match="no run with a static sweep"):
        main([str(tmp_path / "none-*.json")])


def test_files_whose_arms_shared_the_prefix_cache_are_read_only_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shared = {"runs": [{**r, "prefix_cache_hit_ratio": None} for r in DOC["runs"]]}
    (tmp_path / "shared.json").write_text(json.dumps(shared))
    with pytest.raises(SystemExit, match="on prompts of its own"):
        main([str(tmp_path / "*.json")])
    assert main([str(tmp_path / "*.json"), "--with-shared-cache"]) == 0
    out = capsys.readouterr().out
    assert "| thermal | 1 | 2 |" in out and "--target 1.1 --with-shared-cache`" in out
