"""`appliance bench --concurrency 1,4,16` against the real daemon (real vLLM on the CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, Daemon

pytestmark = pytest.mark.engine


def test_bench_sweep_completes_with_sane_numbers(daemon: Daemon, tmp_path: Path):
    token_file = tmp_path / "admin.token"
    token_file.write_text(daemon.token)
    out_file, png = tmp_path / "bench.json", tmp_path / "bench.png"
    cmd = [
        sys.executable,
        "-m",
        "appliance",
        "bench",
        "--url",
        daemon.url,
        "--concurrency",
        "1,4,16",
        # Small on purpose: ~30 tok/s at batch 1 on an idle box, a third of that while other
        # tests share its 2 cores; the sweep takes 15-45 s.
        "--requests-per-level",
        "4",
        "--max-tokens",
        "16",
        "--token-file",
        str(token_file),
        "--json",
        "--output",
        str(out_file),
        "--plot",
        str(png),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert json.loads(out_file.read_text()) == doc
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert doc["model"] == daemon.model_name and doc["max_model_len"] == 2048

    levels = {lv["concurrency"]: lv for lv in doc["levels"]}
    assert sorted(levels) == [1, 4, 16]
    for c, lv in levels.items():
        assert lv["failed"] == 0 and lv["ok"] == max(4, c), lv["errors"]
        assert 0 < lv["output_tokens"] <= 16 * lv["ok"]  # the model may stop before 16
        p = lv["point"]
        assert 0 < p["ttft_p50_s"] <= p["ttft_p99_s"] <= p["e2e_p99_s"] < 120
        assert 0.002 < p["tpot_p50_s"] < 1.0  # measured on the CPU engine: ~30 ms at batch 1
        # The rates are the counts over the level's wall time.
        assert p["output_tok_s"] * lv["duration_s"] == pytest.approx(lv["output_tokens"])
        assert p["request_per_s"] * lv["duration_s"] == pytest.approx(lv["ok"])
        # A closed loop of c workers: the level lasts at least its slowest request.
        assert lv["duration_s"] >= p["e2e_p99_s"] * 0.99
        tel = lv["telemetry"]
        assert tel is not None and tel["readings"] >= 2
        assert 0 <= tel["kv_cache_usage_max_ratio"] <= 1
    tok = {c: levels[c]["point"]["output_tok_s"] for c in levels}
    # Batching pays on this engine (31 -> 192 tok/s from batch 1 to 8 offline); on a 2-core
    # box shared with other tests the gain shrinks (1.3x was seen), but it never turns into
    # a loss.
    assert tok[4] > tok[1], tok
    # At 16 the daemon's limit (8 in the test config) holds the rest in its queue: TTFT grows.
    assert levels[16]["point"]["ttft_p99_s"] > levels[1]["point"]["ttft_p50_s"]
    assert doc["knee"]["concurrency"] in (1, 4, 16) and doc["knee"]["reason"]
    assert doc["pareto"] and set(doc["pareto"]) <= {1, 4, 16}
    assert doc["scores"]["best_concurrency"] in (1, 4, 16)
    # Recorded in the daemon's SQLite store (POST /admin/benchmarks), not only printed.
    assert "stored as benchmark" in proc.stderr, proc.stderr[-2000:]
    stored = daemon.admin.get("/admin/benchmarks")
    newest = stored["benchmarks"][0]
    assert newest["source"] == "cli" and newest["result"]["levels"] == doc["levels"]
    limit = levels[16]["telemetry"]["daemon_limit_max"]
    if limit is not None and limit < 16:
        assert any(f"concurrency limit was {limit}" in n for n in doc["notes"])
