"""bench/trace_noise.py: how far one seed moves the controller's ratio to the oracle."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest

from bench.goodput_trace import PhaseResult, TraceRun
from bench.trace_noise import Noise, log_ratios, main, pooled


def _run(arm: str, seed: int, good: int) -> dict:
    phases = (PhaseResult(0, 100, good),)
    return asdict(
        TraceRun(
            "thermal", arm, seed, 10, 100, good, good, 0, 0, good / 10, None, None, phases,
            prefix_cache_hit_ratio=0.0,
        )
    )  # fmt: skip


def _doc(ctl: tuple[int, ...], oracle: tuple[int, ...]) -> dict:
    runs = [_run("static:32", 0, 1)]  # a worse limit on seed 0: 24 is the oracle
    runs += [_run("static:24", s, g) for s, g in enumerate(oracle)]
    runs += [_run("controller", s, g) for s, g in enumerate(ctl)]
    runs += [_run("controller<=24", s, 1) for s in range(len(ctl))]  # variants do not count
    return {"runs": runs}


def test_each_seed_is_set_against_its_own_oracle_run() -> None:
    from bench.trace_ceiling import runs_of

    (runs,) = runs_of(_doc((90, 120), (100, 100))).values()
    assert log_ratios(runs) == pytest.approx([math.log(0.9), math.log(1.2)])


def test_each_runs_mean_is_taken_out_before_the_seeds_are_pooled() -> None:
    # Two runs a factor 2 apart (another code, another day) with the same seed-to-seed
    # spread: the pooled sd is the spread's, not the runs' difference.
    a = _doc((100, 200), (100, 100))
    b = _doc((200, 400), (100, 100))
    (row,) = pooled([a, b])
    assert (row.trace, row.runs, row.seeds) == ("thermal", 2, 4)
    assert row.sd_log == pytest.approx(math.sqrt(2 * 2 * (math.log(2) / 2) ** 2 / 2))
    assert pooled([_doc((100,), (100,))]) == []  # one seed: no spread to read


def test_the_interval_and_the_seeds_a_resolution_needs() -> None:
    noise = Noise("thermal", 1, 3, 0.18)
    assert noise.interval(3) == pytest.approx(math.exp(0.36 / math.sqrt(3)))
    assert noise.seeds_for(1.05) == math.ceil((0.36 / math.log(1.05)) ** 2)


def test_the_command_reads_globs_and_names_what_it_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.json").write_text(json.dumps(_doc((90, 110, 100), (100, 100, 100))))
    assert main([str(tmp_path / "*.json")]) == 0
    assert "| thermal | 1 | 3 | 0.10 | x/÷ 1.12 | 17 |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="seeds"):
        main([str(tmp_path / "*.json"), "--seeds", "0"])
    with pytest.raises(SystemExit, match="no run with a static sweep"):
        main([str(tmp_path / "none-*.json")])


def test_files_whose_arms_shared_the_prefix_cache_are_left_out_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "own.json").write_text(json.dumps(_doc((90, 110, 100), (100, 100, 100))))
    shared = _doc((50, 200, 100), (100, 100, 100))
    shared["runs"] = [{**r, "prefix_cache_hit_ratio": None} for r in shared["runs"]]
    (tmp_path / "shared.json").write_text(json.dumps(shared))
    assert main([str(tmp_path / "*.json")]) == 0
    out = capsys.readouterr().out
    assert "| thermal | 1 | 3 | 0.10 |" in out
    assert "Left out, 1 files whose arms shared the engine's prefix cache" in out
    assert main([str(tmp_path / "*.json"), "--with-shared-cache"]) == 0
    out = capsys.readouterr().out
    assert "| thermal | 2 | 6 |" in out and "--seeds 3 --with-shared-cache`" in out
