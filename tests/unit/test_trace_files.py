"""bench/trace_files.py: which stored trace-bench files a reader reads, and what it says."""

from __future__ import annotations

import json
from pathlib import Path

from bench.trace_files import load, max_hit_ratio, prompts_isolated


def _doc(*hits: float | None) -> dict:
    return {"runs": [{"trace": "thermal", "prefix_cache_hit_ratio": h} for h in hits]}


def test_a_file_is_isolated_only_where_every_run_recorded_its_hit_ratio() -> None:
    assert prompts_isolated(_doc(0.0, 0.01))
    assert not prompts_isolated(_doc(0.0, None))  # one run reused from an older file
    assert not prompts_isolated({"runs": [{"trace": "thermal"}]})  # from before the field
    assert not prompts_isolated({"runs": []})
    assert max_hit_ratio([_doc(0.0, None), _doc(0.02)]) == 0.02
    assert max_hit_ratio([_doc(None)]) is None


def test_load_reads_each_matched_file_once_and_names_those_it_leaves_out(
    tmp_path: Path,
) -> None:
    (tmp_path / "b-own.json").write_text(json.dumps(_doc(0.0)))
    (tmp_path / "a-shared.json").write_text(json.dumps(_doc(None)))
    pats = [str(tmp_path / "*.json"), str(tmp_path / "b-*.json")]  # b matched twice
    stored = load(pats, with_shared_cache=False)
    assert [p.name for p in stored.named] == ["a-shared.json", "b-own.json"]
    assert stored.docs == (_doc(0.0),)
    assert stored.left_out == (str(tmp_path / "a-shared.json"),)
    assert stored.flag == ""
    notes = stored.notes()
    assert notes[0].startswith("Left out, 1 files whose arms shared the engine's prefix cache")
    assert notes[1] == "Highest prefix-cache hit ratio of a run read: 0.0%"
    assert stored.markdown_notes() == "".join(f"\n- {n}" for n in notes) + "\n"
    assert "on prompts of its own (--with-shared-cache)" in str(stored.none_read("nothing"))

    every = load(pats, with_shared_cache=True)
    assert len(every.docs) == 2 and every.left_out == () and every.flag == " --with-shared-cache"
    assert str(every.none_read("nothing")) == "files: nothing"
    assert load([str(tmp_path / "none-*.json")], False).markdown_notes() == ""
