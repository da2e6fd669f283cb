"""The bench runner, `appliance bench` and the goodput arms against the HTTP app (fake engine).

The fake engine sleeps a fixed time per token, so a request's speed does not depend on how
many run at once: throughput grows with concurrency until the daemon's limit caps it. With
limit 4 the sweep must show exactly that knee.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from appliance.adapters.hf_tokenizer import HfTokenizer
from appliance.bench_runner import (
    BenchError,
    BenchSettings,
    Target,
    document_prompt,
    is_document,
    parse_status,
    run_sweep,
    run_tuning,
    stream_chat,
)
from appliance.client import AdminClient, DaemonAddress, read_token_file
from appliance.commands import bench as bench_cmd
from appliance.config import parse_config
from appliance.daemon.app import build_app
from appliance.domain.sweep_analysis import Slo
from bench import goodput
from bench.servers import free_port
from tests.conftest import ensure_model
from tests.fakes import FakeEngine, WordTokenizer

MODEL = "fake-model"
TOKEN_DELAY_S = 0.02
MAX_MODEL_LEN = 256
LIMIT = 4


class App:
    def __init__(self, url: str, state_dir: Path, engines: list[FakeEngine]) -> None:
        self.url = url
        self.state_dir = state_dir
        self.engines = engines

    @property
    def token_file(self) -> Path:
        return self.state_dir / "admin.token"

    @property
    def token(self) -> str:
        return self.token_file.read_text().strip()

    @property
    def address(self) -> DaemonAddress:
        return DaemonAddress(self.url, read_token_file(self.token_file))

    def admin(self) -> AdminClient:
        return AdminClient.at(self.address)


async def _start(tmp_path: Path, **admission: object) -> tuple[TestServer, App]:
    cfg = parse_config(
        {
            "state_dir": str(tmp_path),
            "engine": {
                "served_model_name": MODEL,
                "max_model_len": MAX_MODEL_LEN,
                "max_tokens_default": 8,
                "drain_timeout_s": 5,
                "health_interval_s": 0.05,
            },
            "admission": {
                "concurrency_limit": LIMIT,
                "realtime_reserved_share": 0,
                "max_queue_wait_s": 30,
                "queue_capacity": {"realtime": 8, "interactive": 256, "batch": 8},
                **admission,
            },
            # Manual: the knee must be the configured limit, not where the controller
            # happened to move it while the sweep ran.
            "controller": {"mode": "manual"},
        }
    )
    engines: list[FakeEngine] = []

    def factory() -> FakeEngine:
        engines.append(FakeEngine(token_delay_s=TOKEN_DELAY_S, max_model_len=MAX_MODEL_LEN))
        return engines[-1]

    server = TestServer(build_app(cfg, factory, WordTokenizer()))
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    async with aiohttp.ClientSession() as s:
        for _ in range(500):
            async with s.get(url + "/health/ready") as r:
                if r.status == 200:
                    break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the app never got ready")
    return server, App(url, tmp_path, engines)


@pytest.fixture
async def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[App]:
    monkeypatch.delenv("APPLIANCE_ADMIN_TOKEN", raising=False)
    server, a = await _start(tmp_path)
    yield a
    await server.close()


def settings(app: App, **kw: object) -> BenchSettings:
    base: dict[str, object] = {
        "url": app.url,
        "concurrency": (1, 2, 4, 8),
        "requests_per_level": 8,
        "max_tokens": 8,
        "admin_token": app.token,
        "telemetry_interval_s": 0.05,
    }
    base.update(kw)
    return BenchSettings(**base)  # type: ignore[arg-type]


async def test_sweep_numbers_are_sane_and_the_knee_is_the_daemon_limit(app: App):
    seen = []
    report = await run_sweep(settings(app), progress=seen.append)
    assert report.model == MODEL and report.max_model_len == MAX_MODEL_LEN
    assert [lv.concurrency for lv in report.levels] == [1, 2, 4, 8]
    for lv in report.levels:
        p = lv.point
        assert p is not None and lv.ok == lv.requests == 8 and lv.failed == 0, lv.errors
        assert lv.output_tokens == 8 * 8  # the fake engine always runs to max_tokens
        # 8 tokens at 20 ms each: the first after ~20 ms, one every ~20 ms after it.
        assert TOKEN_DELAY_S * 0.9 <= p.ttft_p50_s <= p.ttft_p99_s <= p.e2e_p99_s
        assert TOKEN_DELAY_S * 0.9 <= p.tpot_p50_s <= TOKEN_DELAY_S * 5  # slack for a busy box
        assert p.e2e_p99_s >= 8 * TOKEN_DELAY_S * 0.9
        assert p.request_per_s == pytest.approx(p.output_tok_s / 8)
        assert lv.telemetry is not None and lv.telemetry.daemon_limit_max == LIMIT
    tok = {lv.concurrency: lv.point.output_tok_s for lv in report.levels if lv.point}
    # Scales up to the limit (ideal 2x per doubling; slack for 2 shared cores) and not past
    # it: the rest waits in the daemon's queue.
    assert tok[2] > 1.4 * tok[1] and tok[4] > 1.4 * tok[2], tok
    assert tok[8] < 1.3 * tok[4], tok
    assert report.knee is not None and report.knee.concurrency == LIMIT
    by_c = {lv.concurrency: lv.point for lv in report.levels if lv.point}
    # Queueing shows in TTFT: at 8 half the requests wait a whole request (~160 ms) first.
    assert by_c[8].ttft_p99_s > by_c[4].ttft_p99_s + 2 * TOKEN_DELAY_S, by_c
    assert any("the daemon's concurrency limit was 4" in n for n in report.notes)
    assert report.pareto and set(report.pareto) <= {1, 2, 4, 8}
    # The app's telemetry is the simulated GPU: numbers come, and the report says so.
    assert report.scores is not None and report.scores.best_concurrency in (1, 2, 4, 8)
    for lv in report.levels:
        assert lv.telemetry is not None and lv.telemetry.simulated
        assert lv.point is not None and lv.point.utilisation is not None
        assert 0 <= lv.point.utilisation <= 1
    assert any(n == "level 1: GPU telemetry is simulated" for n in report.notes)
    # A knee found at the daemon's own cap says nothing about the engine: no ceiling from it.
    assert report.capped_by_daemon_limit == LIMIT and report.knee_limit is None
    assert any(n.startswith("knee 4 not used as a ceiling") for n in report.notes)
    # Progress: a start and an end per level, counts climbing to the total.
    level_events = [e for e in seen if e.phase == "level"]
    assert {(e.level, e.done) for e in level_events if e.done == e.total} == {
        (c, 8) for c in (1, 2, 4, 8)
    }
    assert level_events[-1].level_index == level_events[-1].levels_total == 4
    doc = json.loads(report.to_json())
    assert doc["knee"]["concurrency"] == LIMIT and doc["settings"]["admin_token"] == "***"
    assert doc["levels"][0]["point"]["output_tok_s"] > 0


async def test_document_prompts_fill_the_context(app: App):
    report = await run_sweep(
        settings(app, scenario="document", concurrency=(2,), requests_per_level=4, max_tokens=16)
    )
    (lv,) = report.levels
    assert lv.ok == 4 and lv.documents == 4
    room = MAX_MODEL_LEN - 16
    assert lv.prompt_tokens_mean is not None and 0.8 * room <= lv.prompt_tokens_mean <= room


async def test_mixed_sends_a_quarter_documents(app: App):
    report = await run_sweep(
        settings(app, scenario="mixed", concurrency=(4,), requests_per_level=8, max_tokens=4)
    )
    (lv,) = report.levels
    assert (lv.ok, lv.documents) == (8, 2)
    assert [is_document(i, "mixed", 0.25) for i in range(8)].count(True) == 2
    # A mean between a short prompt (< 40 tokens) and a document (~200).
    assert lv.prompt_tokens_mean is not None and 40 < lv.prompt_tokens_mean < 150


async def test_tuning_runs_baseline_then_up_to_the_knee(app: App):
    report = await run_tuning(
        settings(app, requests_per_level=8), max_concurrency=32, slo=Slo(ttft_p99_s=5.0)
    )
    assert report.tuning is not None
    assert [lv.concurrency for lv in report.levels] == [8, 16]  # 16 shows the flat curve
    assert report.tuning.baseline is not None and report.tuning.baseline.concurrency == 8
    assert report.tuning.recommended_limit == 8
    assert report.knee_limit is None and report.capped_by_daemon_limit == LIMIT


async def test_failures_are_counted_and_explained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("APPLIANCE_ADMIN_TOKEN", raising=False)
    server, a = await _start(
        tmp_path, concurrency_limit=1, queue_capacity={"realtime": 1, "interactive": 1, "batch": 1}
    )
    try:
        report = await run_sweep(settings(a, concurrency=(1, 6), requests_per_level=6))
    finally:
        await server.close()
    lv1, lv6 = report.levels
    assert lv1.failed == 0
    # One runs, one waits, the rest of the first wave gets 429 at once.
    assert lv6.failed >= 3 and lv6.ok + lv6.failed == 6
    assert any("HTTP 429" in e and "queue is full" in e for e in lv6.errors)
    assert any(n.startswith("level 6: ") and "HTTP 429" in n for n in report.notes)


async def test_stream_errors_become_failed_samples(app: App):
    async with aiohttp.ClientSession() as s:
        target = Target(app.url, "no-such-model", None, {})
        sample = await stream_chat(s, target, "hello", 4)
    assert not sample.ok and sample.status == 404 and "no-such-model" in (sample.error or "")
    assert sample.ttft_s is None


async def test_unreachable_endpoint_is_a_bench_error():
    with pytest.raises(BenchError, match="not reachable"):
        await run_sweep(BenchSettings(url=f"http://127.0.0.1:{free_port()}", concurrency=(1,)))


def test_parse_status_reads_gpus_and_engine():
    r = parse_status(
        {
            "engine": {"stats": {"kv_cache_usage_ratio": 0.4}},
            "admission": {"limit": 12},
            "telemetry": {
                "gpus": [
                    {"gpu_util_pct": 80.0, "energy_j": 100.0, "simulated": True},
                    {"gpu_util_pct": 60.0, "energy_j": 50.0, "simulated": True},
                ]
            },
        }
    )
    assert (r.kv_ratio, r.limit, r.util_pct, r.energy_j, r.simulated) == (
        0.4,
        12,
        70.0,
        150.0,
        True,
    )
    r = parse_status({"telemetry": {"energy_total_j": 9.5, "gpus": [{"energy_j": 1e6}]}})
    assert r.energy_j == 9.5 and not r.simulated  # the daemon's running total wins
    empty = parse_status({})
    assert (empty.kv_ratio, empty.limit, empty.util_pct, empty.energy_j) == (None, None, None, None)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"concurrency": (0, 2)}, "concurrency: each level must be >= 1"),
        ({"concurrency": ()}, "concurrency: need at least one level"),
        ({"concurrency": (2, 2)}, "concurrency: level 2 appears more than once"),
        ({"requests_per_level": 0}, "requests-per-level: must be >= 1"),
        ({"max_tokens": 0}, "max-tokens: must be >= 1"),
        ({"scenario": "poetry"}, "scenario: must be one of chat, document, mixed"),
        ({"url": "localhost:8000"}, "url: must start with http://"),
    ],
)
def test_bad_settings_name_the_field(kw: dict, message: str):
    base = {"url": "http://127.0.0.1:1"}
    with pytest.raises(ValueError, match=message):
        BenchSettings(**{**base, **kw})


# -- the command --------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="appliance")
    sub = parser.add_subparsers(dest="command", required=True)
    bench_cmd.register(sub)
    return parser


async def test_cli_writes_json_and_a_png(app: App, tmp_path: Path, capsys: pytest.CaptureFixture):
    png, out = tmp_path / "sweep.png", tmp_path / "sweep.json"
    args = _parser().parse_args(
        [
            "bench",
            "--url",
            app.url,
            "--concurrency",
            "4,1,2",
            "--requests-per-level",
            "4",
            "--max-tokens",
            "4",
            "--token-file",
            str(app.token_file),
            "--json",
            "--plot",
            str(png),
            "--output",
            str(out),
        ]
    )
    rc = await asyncio.to_thread(args.func, args)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    doc = json.loads(captured.out)
    assert [lv["concurrency"] for lv in doc["levels"]] == [1, 2, 4]
    assert doc["knee"]["concurrency"] in (1, 2, 4) and doc["pareto"]
    assert json.loads(out.read_text()) == doc
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert "level 4: done, 0 failed" in captured.err  # plain progress off a terminal


async def test_cli_table_shows_knee_front_and_scores(app: App, capsys: pytest.CaptureFixture):
    argv = ["--url", app.url, "--concurrency", "1,4", "--requests-per-level", "4"]
    rc = await asyncio.to_thread(bench_cmd.main, [*argv, "--max-tokens", "4"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "TTFT p99" in out and "<- knee" in out and "Pareto front (*):" in out
    assert "best score:" in out and "note: telemetry: no admin token" in out


async def test_cli_objective_hands_the_best_score_on_as_the_ceiling(
    app: App, capsys: pytest.CaptureFixture
):
    argv = ["--url", app.url, "--concurrency", "1,2", "--requests-per-level", "2"]
    argv += ["--max-tokens", "2", "--token-file", str(app.token_file), "--json"]
    rc = await asyncio.to_thread(bench_cmd.main, [*argv, "--objective", "score"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    best = json.loads(captured.out)["scores"]["best_concurrency"]
    assert f"the controller's ceiling is now {best} (the best weighted score" in captured.err
    async with aiohttp.ClientSession() as s:
        headers = {"Authorization": f"Bearer {app.token}"}
        async with s.get(app.url + "/admin/status", headers=headers) as r:
            assert (await r.json())["controller"]["ceiling"] == best


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--concurrency", "0"], "bench: concurrency: each level must be >= 1"),
        (["--concurrency", "1,x"], "bench: concurrency: 'x' is not a whole number"),
        (["--concurrency", "2,2"], "bench: concurrency: level 2 appears more than once"),
        (["--requests-per-level", "0"], "bench: requests-per-level: must be >= 1, got 0"),
        (["--max-tokens", "-1"], "bench: max-tokens: must be >= 1, got -1"),
        (["--slo-ttft-s", "0"], "bench: slo-ttft-s: must be > 0, got 0.0"),
        (["--token-file", "/nonexistent/token"], "bench: token-file: cannot read"),
        (["--objective", "best"], "bench: objective: must be one of knee, score, level"),
        (["--extend-to", "0"], "bench: extend-to: must be >= 1, got 0"),
    ],
)
def test_cli_bad_input_exits_2_naming_the_option(
    argv: list[str], message: str, capsys: pytest.CaptureFixture
):
    rc = bench_cmd.main(["--url", "http://127.0.0.1:1", *argv])
    assert rc == 2
    assert message in capsys.readouterr().err


def test_cli_unreachable_exits_1(capsys: pytest.CaptureFixture):
    rc = bench_cmd.main(["--url", f"http://127.0.0.1:{free_port()}", "--concurrency", "1"])
    assert rc == 1 and "not reachable" in capsys.readouterr().err


# -- goodput --------------------------------------------------------------------------------


def test_arrivals_have_the_asked_rate_and_bursts():
    for kind in goodput.ARRIVALS:
        times = goodput.arrival_times(kind, rate_rps=20, duration_s=200, seed=3)
        assert times == sorted(times) and times[0] >= 0 and times[-1] < 200
        assert len(times) == pytest.approx(4000, rel=0.08)
    bursty = goodput.arrival_times("bursty", rate_rps=20, duration_s=200, seed=3)
    in_burst = sum((t % 10) < 2.5 for t in bursty)
    # Hot quarter: (20 - 0.75 x 5) / 0.25 = 65 req/s for 50 s of the 200 -> ~81 % of arrivals.
    assert in_burst / len(bursty) == pytest.approx(0.81, abs=0.04)
    with pytest.raises(ValueError, match="arrival: must be one of poisson, bursty"):
        goodput.arrival_times("steady", 1, 1)


async def test_goodput_arm_counts_requests_within_the_slo(app: App):
    plan = goodput.Plan(
        rates=(2.0,),
        arrivals=("poisson",),
        slo=goodput.GoodputSlo(ttft_s=0.5, tpot_s=0.2),
        duration_s=1.5,
        drain_s=5.0,
        max_tokens=4,
        sweep_levels=(1, 2),
    )
    # Capacity of limit 4 x 4 tokens x 20 ms = 50 req/s; at "2x" of 5 req/s nothing queues.
    async with aiohttp.ClientSession() as s, app.admin() as admin:
        daemon = goodput.Daemon(admin)
        results = await goodput.run_arm(s, app.url, "static", plan, 5.0, daemon, log=lambda m: None)
    (r,) = results
    assert r.sent == pytest.approx(15, abs=10) and r.good == r.ok == r.sent
    assert r.goodput_rps == pytest.approx(r.sent / 1.5)
    assert r.ttft_p99_s is not None and r.ttft_p99_s < 0.5


def _tiny_plan(**kw: object) -> goodput.Plan:
    base: dict[str, object] = {
        "rates": (1.5,),
        "arrivals": ("bursty",),
        "slo": goodput.GoodputSlo(ttft_s=1.0, tpot_s=None),
        "duration_s": 1.0,
        "drain_s": 5.0,
        "max_tokens": 4,
        "sweep_levels": (1, 2, 4, 8),
    }
    base.update(kw)
    return goodput.Plan(**base)  # type: ignore[arg-type]


async def test_goodput_switches_every_arm_and_restores_the_controller(app: App):
    async with app.admin() as admin:
        before = await goodput.Daemon(admin).status()
    doc = await goodput.run_against_url(app.address, _tiny_plan(), {}, log=lambda m: None)
    assert [r["arm"] for r in doc["runs"]] == ["controller", "unbounded", "static"]
    notes = "\n".join(doc["notes"])
    # The sweep ran with the daemon's cap out of the way, so 8 was not held at the limit of 4.
    assert doc["best_static"]["concurrency"] == 8 and doc["capacity_rps"] > 0
    assert 'static: PUT /admin/controller {"mode": "manual", "limit": 8}: applied' in notes
    assert all(r["sent"] > 0 and r["good"] <= r["ok"] <= r["sent"] for r in doc["runs"])
    (row,) = doc["ratios"]
    assert set(row) >= {"controller", "unbounded", "static", "controller_vs_unbounded"}
    async with app.admin() as admin:
        after = await goodput.Daemon(admin).status()
    assert before is not None and after is not None
    for key in ("mode", "min", "max", "manual_limit"):
        assert after["controller"][key] == before["controller"][key], key
    assert "| bursty | 1.5x |" in goodput.render_markdown(doc)


async def test_goodput_without_the_controller_endpoint_skips_arms(
    app: App, monkeypatch: pytest.MonkeyPatch
):
    async def no_endpoint(self: goodput.Daemon, body: dict) -> tuple[bool, str]:
        return False, "PUT /admin/controller answered 404: not found"

    monkeypatch.setattr(goodput.Daemon, "set_controller", no_endpoint)
    doc = await goodput.run_against_url(
        app.address, _tiny_plan(sweep_levels=(1, 2, 4)), {}, log=lambda m: None
    )
    notes = "\n".join(doc["notes"])
    assert "PUT /admin/controller answered 404" in notes
    assert "controller: skipped (PUT /admin/controller not available)" in notes
    assert "unbounded: skipped" in notes and "static: skipped" in notes
    assert f"as-is: measured the daemon with its configured limit {LIMIT}" in notes
    assert [r["arm"] for r in doc["runs"]] == ["static"]
    md = goodput.render_markdown(doc)
    assert "| bursty | 1.5x | - | - |" in md


def _tiny_trace_plan(trace: Any, **kw: Any) -> Any:
    """The trace bench's plan for a trace of a second or two against the app."""
    from bench import goodput_trace as gt

    base: dict[str, object] = {
        "traces": (trace,),
        "runs": 1,
        "levels": (1, 4),
        "slo": goodput.GoodputSlo(ttft_s=1.0, tpot_s=None),
        "max_tokens": 4,
        "drain_s": 5.0,
        "max_limit": 8,
        "capacity_rps": 5.0,
        "warmup_s": 0.5,
    }
    return gt.Plan(**{**base, **kw})


async def test_trace_bench_runs_every_arm_over_a_trace(app: App, tmp_path: Path):
    """bench/goodput_trace.py against the app: the static sweep, then controller, unbounded
    and the best static for each seed, over a two-segment trace with a fault episode."""
    from bench import goodput_trace as gt

    trace = gt.parse_trace(
        {
            "name": "tiny",
            "segments": [
                {"duration_s": 1.0, "rate_x": 1.0, "prompt_tokens": 40},
                {"duration_s": 1.0, "rate_x": 1.0, "prompt_tokens": 120, "fault": "hot_room"},
            ],
        }
    )
    plan = _tiny_trace_plan(trace, runs=2)
    doc = await gt.run(plan, app.url, app.token, log=lambda m: None)
    arms = [(r["arm"], r["seed"]) for r in doc["runs"]]
    (row,) = doc["cells"]
    best = row["best_static"]
    assert arms == [
        ("static:1", 0),
        ("static:4", 0),
        ("controller", 0),
        ("unbounded", 0),
        ("unbounded", 1),  # seed 1's arms run rotated by one (goodput_trace.seed_order)
        (best, 1),
        ("controller", 1),
    ]
    for r in doc["runs"]:
        assert r["sent"] > 0 and r["good"] <= r["ok"] <= r["sent"]
        assert [p["segment"] for p in r["phases"]] == [0, 1]
        assert sum(p["sent"] for p in r["phases"]) == r["sent"]
        assert r["timeline"], "the daemon's limit was watched"
        assert all(isinstance(x["changes"], list) for x in r["timeline"])
    assert row["static"]["n"] == 2 and row["controller"]["n"] == 2
    text = gt.render_markdown({**doc, "command": "x", "machine": "y"})
    assert "| tiny |" in text and "Static sweep" in text
    # The fault episode was undone: nothing left active on the simulated GPU.
    async with app.admin() as admin:
        status = await goodput.Daemon(admin).status()
    assert status is not None and status["telemetry"]["faults"] == []

    # Reused: the oracle's seed 0 runs again first, unscored, then only the controller.
    import dataclasses
    import json

    then = tmp_path / "then.json"
    then.write_text(json.dumps(doc))
    one_seed = dataclasses.replace(plan, runs=1, reuse_tolerance=0.9)
    reuse, _ = gt.load_reuse(then, one_seed)
    seen: list[str] = []
    plan_again = dataclasses.replace(one_seed, reuse=reuse)
    again = await gt.run(plan_again, app.url, app.token, seen.append)
    assert [(r["arm"], r["seed"]) for r in again["runs"]] == [
        ("static:1", 0),
        ("static:4", 0),
        ("unbounded", 0),
        ("controller", 0),
    ]
    assert any(f"reuse check, tiny: {best} seed 0 ran again here" in n for n in again["notes"])
    assert any("[reuse check, not scored]" in m for m in seen)
    # The box moved (here: the file says ten times the goodput): refused before the controller.
    for r in doc["runs"]:
        if r["arm"] == best and r["seed"] == 0:
            r["goodput_rps"] = 10 * r["goodput_rps"] + 1
    then.write_text(json.dumps(doc))
    reuse, _ = gt.load_reuse(then, one_seed)
    seen.clear()
    with pytest.raises(gt.ReuseRefused, match="the box moved"):
        await gt.run(dataclasses.replace(one_seed, reuse=reuse), app.url, app.token, seen.append)
    assert not any("controller" in m for m in seen)


async def test_trace_bench_gives_each_run_prompts_of_its_own(
    app: App, monkeypatch: pytest.MonkeyPatch
):
    """Every arm of a seed replays the same prompts; each run's carry its own tag (warm-up
    included), so the engine's prefix cache keeps nothing one run could find of another's."""
    import itertools

    from bench import goodput_trace as gt

    numbers = itertools.count(1)
    monkeypatch.setattr(gt, "run_tag", lambda: f"[run-{next(numbers)}] ")
    trace = gt.parse_trace(
        {"name": "tiny", "segments": [{"duration_s": 1.0, "rate_x": 1.0, "prompt_tokens": 40}]}
    )
    plan = _tiny_trace_plan(trace, skip_unbounded=("tiny",))
    before = len(app.engines[-1].seen)
    doc = await gt.run(plan, app.url, app.token, log=lambda m: None)
    assert [r["arm"] for r in doc["runs"]] == ["static:1", "static:4", "controller"]
    # The fake engine keeps no prefix cache: the bench reads no hit ratio from it.
    assert all(r["prefix_cache_hit_ratio"] is None for r in doc["runs"])
    # The requests reach the fake engine through vLLM's serving layer: the model's tokens.
    tokenizer = HfTokenizer(ensure_model())
    prompts = [tokenizer.decode(r.prompt_token_ids) for r in app.engines[-1].seen[before:]]
    tags = [re.findall(r"\[run-\d+\]", p) for p in prompts]
    # Untagged: only the calibration's two prompts, which measure the tokenizer.
    calibration = [document_prompt(0, 0, 20), document_prompt(0, 0, 120)]
    untagged = [p for t, p in zip(tags, prompts, strict=True) if not t]
    assert len(untagged) == 2 and all(any(c in p for c in calibration) for p in untagged)
    assert all(len(t) <= 1 for t in tags)
    counts = Counter(t[0] for t in tags if t)
    assert sorted(counts) == ["[run-1]", "[run-2]", "[run-3]"]
    for i, r in enumerate(doc["runs"], 1):
        # Each run's warm-up and scored requests carry its tag, and no other run's do.
        assert counts[f"[run-{i}]"] >= r["sent"] > 0


async def test_trace_bench_steers_a_headroom_arm_through_the_daemon(
    app: App, monkeypatch: pytest.MonkeyPatch
):
    """--headroom-tpot-s and --ceiling-arms against the app: each controller arm runs with
    the TPOT it steers to and the ceiling it runs under in force on the daemon (the scored
    SLO, the headroom one, then the scored SLO under a ceiling of 6), and the daemon has its
    own TPOT SLO back after the bench."""
    from bench import goodput_trace as gt

    trace = gt.parse_trace(
        {"name": "tiny", "segments": [{"duration_s": 1.0, "rate_x": 1.0, "prompt_tokens": 40}]}
    )
    plan = gt.Plan(
        traces=(trace,),
        runs=1,
        levels=(4,),
        slo=goodput.GoodputSlo(ttft_s=1.0, tpot_s=1.0),
        max_tokens=4,
        drain_s=5.0,
        max_limit=8,
        capacity_rps=5.0,
        skip_unbounded=("tiny",),
        headroom_tpot_s=(0.3,),
        ceilings=(6,),
    )
    in_force: list[float] = []
    ceilings: list[int] = []
    set_controller = goodput.Daemon.set_controller

    async def watched(self: goodput.Daemon, body: dict[str, object]) -> tuple[bool, str]:
        out = await set_controller(self, body)
        if body.get("mode") == "auto":  # the arm is set up: what the daemon now steers to
            status = await self.status()
            assert status is not None
            in_force.append(status["controller"]["slo_tpot_p99_s"])
            ceilings.append(status["controller"]["max"])
        return out

    monkeypatch.setattr(goodput.Daemon, "set_controller", watched)
    async with app.admin() as admin:
        before = ((await goodput.Daemon(admin).status()) or {})["controller"]
    assert before["slo_tpot_p99_s"] not in (1.0, 0.3)
    doc = await gt.run(plan, app.url, app.token, log=lambda m: None)
    assert [(r["arm"], r["seed"]) for r in doc["runs"]] == [
        ("static:4", 0),
        ("controller", 0),
        ("controller@0.3s", 0),
        ("controller<=6", 0),
    ]
    assert in_force == [1.0, 0.3, 1.0]
    assert ceilings == [8, 8, 6]
    (row,) = doc["cells"]
    assert row["variants"]["controller@0.3s"]["n"] == 1
    assert row["variants"]["controller<=6"]["n"] == 1
    assert "controller@0.3s" in gt.render_markdown({**doc, "command": "x", "machine": "y"})
    async with app.admin() as admin:
        after = ((await goodput.Daemon(admin).status()) or {})["controller"]
    assert after["slo_tpot_p99_s"] == before["slo_tpot_p99_s"]


async def test_step_time_bench_samples_the_engines_steps_at_each_limit(app: App):
    """bench/step_time.py against the app: every limit with and without a burner, each row
    from the steps /admin/status showed (the fake engine's gap is its token delay)."""
    from bench import step_time

    async with app.admin() as admin:
        before = (await goodput.Daemon(admin).status() or {}).get("controller") or {}
    s = step_time.Settings(
        levels=(1, 2), burners=(0, 1), settle_s=0.3, measure_s=2.5, every_s=0.25, max_tokens=6
    )
    doc = await step_time.run(s, app.url, app.token, log=lambda m: None)
    assert [(r["burners"], r["limit"]) for r in doc["rows"]] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    for r in doc["rows"]:
        assert r["samples"] > 0, r
        assert TOKEN_DELAY_S <= r["tpot_median_s"] < 10 * TOKEN_DELAY_S, r
        assert 0 < r["batch_median"] <= r["limit"], r
    text = step_time.render_markdown({**doc, "command": "x", "machine": "y"})
    assert "| 1 | 2 |" in text
    async with app.admin() as admin:
        status = await goodput.Daemon(admin).status()
    assert status is not None
    after = status["controller"]
    # Put back as it was (this app's controller: manual at its configured limit).
    assert (after["mode"], after["manual_limit"]) == (before["mode"], before["manual_limit"])
    assert before["manual_limit"] != 2


def test_step_time_bad_options_name_the_option(capsys: pytest.CaptureFixture):
    from bench import step_time

    for argv, words in (
        (["--start", "--levels", "0"], "levels"),
        (["--start", "--levels", "80"], "levels"),
        (["--start", "--burners", "-1"], "burners"),
        (["--start", "--every-s", "0"], "every-s"),
    ):
        with pytest.raises(SystemExit, match=words):
            step_time.main(argv)
