"""Log analysis: the recorded incident, the journal's format, and the rules one by one."""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from appliance.commands import logs as logs_command
from appliance.domain.incidents import (
    AnalysisConfig,
    LogRecord,
    Report,
    analyze,
    parse_journal_json,
    parse_lines,
)

INCIDENT = Path(__file__).resolve().parents[1] / "data" / "incident.log"
GiB = 1024**3


def at(hms: str) -> float:
    """Epoch seconds of a time on the incident's day (UTC)."""
    return datetime.fromisoformat(f"2026-12-02T{hms}+00:00").timestamp()


@pytest.fixture(scope="module")
def incident() -> Report:
    return analyze(parse_lines(INCIDENT.read_text().splitlines()))


# -- the recorded incident ----------------------------------------------------------------


def test_incident_is_read_whole(incident: Report) -> None:
    assert incident.lines == len(INCIDENT.read_text().splitlines())
    assert incident.raw_lines == 4  # vLLM's own plain-text lines
    assert incident.samples > 150 and incident.requests > 300
    assert incident.first_ts_s == pytest.approx(at("10:00:00.412"))


def test_incident_engine_death_is_the_one_failure(incident: Report) -> None:
    assert len(incident.failures) == 1
    failure = incident.failures[0]
    assert failure.ts_s == pytest.approx(at("10:14:04.1"))
    assert failure.kinds == ("engine_dead",)


def test_incident_memory_climbed_before_the_death(incident: Report) -> None:
    failure = incident.failures[0]
    by_resource = {c.resource: c for c in incident.precursors}
    assert set(by_resource) == {"kv_cache", "host_memory"}  # a CPU box: no GPU memory
    for climb in by_resource.values():
        assert climb.failure_ts_s == failure.ts_s
        # The long documents started piling up at 10:08.
        assert at("10:07:30") <= climb.start_ts_s <= at("10:08:30")
        assert climb.peak_ts_s <= failure.ts_s
        assert climb.peak_ratio >= 0.95
        assert climb.lead_s is not None and climb.lead_s > 300
        assert climb.rate_per_min > 0.05
    assert by_resource["kv_cache"].start_ratio < 0.3
    assert by_resource["host_memory"].start_ratio < 0.5
    assert incident.at_risk == ()  # after the restart memory is back to normal


def test_incident_spike_after_the_derate_is_tied_to_it(incident: Report) -> None:
    derate = next(e for e in incident.events if e.category == "derate")
    assert derate.ts_s == pytest.approx(at("10:20:00.3"))
    spike = next(s for s in incident.spikes if s.start_ts_s > derate.ts_s)
    assert spike.metric == "p99_ttft_s"
    assert 0 < spike.start_ts_s - derate.ts_s <= 30
    assert spike.factor > 5
    before = [c for c in spike.causes if c.offset_s <= 0]
    assert {c.event.category for c in before} == {"derate", "controller"}
    assert any(c.event is derate for c in before)
    assert all(c.event.category != "job" for c in spike.causes)


def test_incident_burst_spike_and_nothing_else(incident: Report) -> None:
    assert len(incident.spikes) == 2  # the burst and the derate; the restart drained quietly
    burst_spike = incident.spikes[0]
    assert at("10:06:00") <= burst_spike.start_ts_s <= at("10:06:20")
    # The rebenchmark job that ended two minutes before is not among the causes.
    assert [c.event.category for c in burst_spike.causes] == ["burst"]


def test_incident_timeline_has_every_kind_of_event(incident: Report) -> None:
    categories = [e.category for e in incident.events]
    assert {"job", "burst", "restart", "derate", "controller"} == set(categories)
    assert [e.ts_s for e in incident.events] == sorted(e.ts_s for e in incident.events)


# -- the journal --------------------------------------------------------------------------


def _journal(lines: Iterable[str], start_us: int) -> list[str]:
    """Wrap log lines the way `journalctl -o json` prints them."""
    out = []
    for i, line in enumerate(lines):
        entry = {
            "__REALTIME_TIMESTAMP": str(start_us + i * 1000),
            "_SYSTEMD_UNIT": "appliance.service",
            "PRIORITY": "3" if line.startswith("ERROR") else "6",
            "MESSAGE": line,
        }
        out.append(json.dumps(entry))
    return out


def test_journal_gives_the_same_findings_as_the_file(incident: Report) -> None:
    lines = INCIDENT.read_text().splitlines()
    from_journal = analyze(parse_journal_json(_journal(lines, int(at("10:00:00") * 1e6))))
    assert from_journal.failures == incident.failures
    assert from_journal.precursors == incident.precursors
    assert from_journal.spikes == incident.spikes


def test_journal_raw_lines_use_the_journal_time_and_priority() -> None:
    entries = [
        {"__REALTIME_TIMESTAMP": "1796205600000000", "PRIORITY": "6", "MESSAGE": "hello"},
        # systemd's own line when the kernel kills an engine child (OOMPolicy=continue)
        {
            "__REALTIME_TIMESTAMP": "1796205660500000",
            "PRIORITY": "4",
            "MESSAGE": "appliance.service: A process of this unit has been killed by the OOM "
            "killer.",
        },
        # non-UTF-8 messages arrive as a byte array
        {"__REALTIME_TIMESTAMP": "1796205661000000", "PRIORITY": "3", "MESSAGE": [98, 255, 99]},
    ]
    records = parse_journal_json(json.dumps(e) for e in entries)
    assert [r.ts_s for r in records] == [1796205600.0, 1796205660.5, 1796205661.0]
    assert [r.level for r in records] == ["info", "warning", "error"]
    assert records[2].msg == "b\ufffdc"
    failures = analyze(records).failures
    assert [(f.ts_s, f.kinds) for f in failures] == [(1796205660.5, ("oom",))]


def test_journal_cli_runs_the_real_journalctl(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An empty journal directory: journalctl answers with nothing and the report says so.
    assert _cli("--journal", "--journal-dir", str(tmp_path), "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["lines"] == 0 and report["failures"] == []
    assert _cli("--journal", "--journal-dir", str(tmp_path / "missing")) == 1
    assert "journalctl failed" in capsys.readouterr().err


def test_journal_command_line() -> None:
    assert logs_command.journal_command("appliance", "-2h", "/srv/j") == [
        "journalctl",
        "--unit",
        "appliance",
        "--output",
        "json",
        "--no-pager",
        "--directory",
        "/srv/j",
        "--since",
        "-2h",
    ]


# -- parsing ------------------------------------------------------------------------------


def test_raw_lines_inherit_the_time_before_them() -> None:
    records = parse_lines(
        [
            '{"ts": "2026-12-02T10:00:00.500Z", "level": "info", "logger": "a", "msg": "x"}',
            "",
            "Traceback (most recent call last):",
            "ERROR 12-02 10:00:01 [core.py:1] boom",
            '{"ts": "not a time", "level": "WARNING", "msg": "y", "event": "e", "ev_n": 3}',
        ]
    )
    assert [r.ts_s for r in records] == [at("10:00:00.5")] * 4
    assert [r.raw for r in records] == [False, True, True, False]
    assert [r.level for r in records] == ["info", "info", "error", "warning"]
    assert records[3].number("n") == 3.0 and records[3].value("n") == 3


# -- the rules, on small made-up logs -----------------------------------------------------


def _line(t: float, **fields: Any) -> str:
    ts = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    return json.dumps({"ts": ts, "level": "info", "logger": "t", "msg": "m", **fields})


def _sample(t: float, **values: float | None) -> str:
    return _line(t, event="metrics_sample", **{f"ev_{k}": v for k, v in values.items()})


def _event(t: float, kind: str, reason: str, **data: Any) -> str:
    return _line(t, event=kind, reason=reason, **{f"ev_{k}": v for k, v in data.items()})


def _death(t: float) -> str:
    return _event(t, "engine_state", "engine dead", state="engine_dead")


def _kv_log(values: list[float], death_at: float | None, step_s: float = 10) -> list[LogRecord]:
    lines = [_sample(i * step_s, kv_cache_usage_ratio=v) for i, v in enumerate(values)]
    if death_at is not None:
        lines.append(_death(death_at))
    return parse_lines(lines)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([0.2] * 10 + [0.4, 0.6, 0.8, 0.95], True),  # climb to the limit
        ([0.2, 0.4, 0.6, 0.8, 0.93, 0.92, 0.94, 0.95], True),  # small dips do not end it
        ([0.9] * 14, False),  # high but flat: no climb
        ([0.2] * 10 + [0.4, 0.6, 0.75, 0.8], False),  # climbs, but not near the limit
        ([0.2, 0.5, 0.96, 0.5, 0.3, 0.3], False),  # the climb ended long before the failure
        ([0.85] * 10 + [0.9, 0.95], False),  # rise too small
        # A tail that eases down after the peak, each dip inside the tolerance, ending below
        # everything before the peak (seen on a real engine-death log): the climb is the
        # rise before the peak, and it is judged as usual.
        ([0.2, 0.5, 0.8, 0.96, 0.95, 0.94, 0.93], True),
        ([0.55, 0.56, 0.545, 0.53, 0.515], False),
    ],
)
def test_precursor_rules(values: list[float], expected: bool) -> None:
    report = analyze(_kv_log(values, death_at=len(values) * 10))
    assert bool(report.precursors) is expected, report.precursors


def test_a_climb_outside_the_lookback_is_not_a_precursor() -> None:
    cfg = AnalysisConfig(lookback_s=60)
    values = [0.2, 0.5, 0.8, 0.96] + [0.2] * 3
    records = _kv_log(values, death_at=len(values) * 10)
    assert analyze(records, cfg).precursors == ()


def test_memory_share_uses_the_limit_field() -> None:
    lines = [
        _sample(i * 10, rss_bytes=(2 + i) * GiB, memory_limit_bytes=8 * GiB) for i in range(7)
    ]
    lines.append(_line(75, level="error", msg="worker: CUDA out of memory. Tried to allocate"))
    report = analyze(parse_lines(lines))
    assert [f.kinds for f in report.failures] == [("oom",)]
    (climb,) = report.precursors
    assert climb.resource == "host_memory"
    assert climb.start_ratio == pytest.approx(0.25) and climb.peak_ratio == pytest.approx(1.0)
    assert climb.rate_per_min == pytest.approx(0.75)


def test_close_failure_lines_are_one_failure() -> None:
    records = parse_lines(
        [_death(100), _line(104, level="error", msg="OutOfMemoryError in worker"), _death(500)]
    )
    failures = analyze(records).failures
    assert [(f.ts_s, f.kinds) for f in failures] == [
        (100, ("engine_dead", "oom")),
        (500, ("engine_dead",)),
    ]


def test_an_unfinished_climb_is_at_risk() -> None:
    report = analyze(_kv_log([0.3] * 5 + [0.5, 0.6, 0.7, 0.8, 0.85], death_at=None))
    (climb,) = report.at_risk
    assert climb.failure_ts_s is None and climb.peak_ratio == pytest.approx(0.85)
    assert climb.rate_per_min == pytest.approx((0.85 - 0.3) / (50 / 60))
    assert climb.minutes_to_limit == pytest.approx(0.15 / climb.rate_per_min)


def _ttft_log(values: list[float], *extra: str, step_s: float = 10) -> list[LogRecord]:
    lines = [_sample(i * step_s, p99_ttft_s=v) for i, v in enumerate(values)]
    return parse_lines([*lines, *extra])


QUIET = [0.5, 0.45, 0.55, 0.5, 0.5, 0.52]


def test_the_daemons_own_row_names_are_read() -> None:
    # The daemon logs its metric-history rows as they are stored (ttft_p99_s, queued, ...):
    # a spike in them after a thermal event is found and tied to it.
    lines = [
        _sample(i * 10, ttft_p99_s=v, queued=3, in_flight=4, limit=4)
        for i, v in enumerate([*QUIET, 3.0, 3.5, 0.5, 0.5])
    ]
    lines.append(_event(55, "thermal", "gpu0 hot: derate", level="derate"))
    (spike,) = analyze(parse_lines(lines)).spikes
    assert spike.metric == "p99_ttft_s" and spike.peak_s == 3.5
    assert [c.event.category for c in spike.causes] == ["derate"]


def test_spike_with_nothing_nearby_has_no_causes() -> None:
    (spike,) = analyze(_ttft_log([*QUIET, 3.0, 3.5, 0.5, 0.5])).spikes
    assert spike.causes == ()
    assert (spike.start_ts_s, spike.end_ts_s, spike.peak_ts_s) == (60, 70, 70)
    assert spike.baseline_s == pytest.approx(0.5) and spike.peak_s == 3.5


@pytest.mark.parametrize(
    ("event", "tied"),
    [
        (_event(55, "engine_state", "restart: manual", state="restarting"), True),
        (_event(50, "engine_restarted", "restart done in 30 s", cause="manual"), True),
        (_event(45, "thermal_level", "gpu0 hot: derate", level="derate"), True),
        (_event(65, "controller_limit", "limit 16 -> 8"), True),  # during the spike
        (_event(75, "thermal_level", "back to normal", level="normal"), False),  # after it
        (_event(-100, "thermal_level", "gpu0 hot: derate", level="derate"), False),  # too early
        (_event(55, "engine_state", "engine ready", state="ready"), False),  # not a cause
    ],
)
def test_spike_causes(event: str, tied: bool) -> None:
    (spike,) = analyze(_ttft_log([*QUIET, 3.0, 3.5, 0.5, 0.5], event)).spikes
    assert bool(spike.causes) is tied


def test_a_job_running_through_the_spike_explains_it() -> None:
    start = _event(-300, "job_started", "rebenchmark", job="rebenchmark")
    end = _event(200, "job_finished", "rebenchmark ok", job="rebenchmark", outcome="ok")
    (spike,) = analyze(_ttft_log([*QUIET, 3.0, 3.5, 0.5, 0.5], start, end)).spikes
    assert [c.event.kind for c in spike.causes] == ["job_started"]
    assert spike.causes[0].event.until_ts_s == 200


def test_bursts_come_from_arrival_rates() -> None:
    rates = [2.0, 2.1, 1.9, 2.0, 2.0, 9.0, 8.5, 2.0]
    lines = [_sample(i * 10, arrivals_per_s=r) for i, r in enumerate(rates)]
    (burst,) = [e for e in analyze(parse_lines(lines)).events if e.category == "burst"]
    assert burst.ts_s == 50 and "9.0/s" in burst.reason


def test_request_lines_stand_in_when_samples_carry_no_latency() -> None:
    lines = [
        _line(i, event="request_done", ev_ttft_s=v, ev_status="ok")
        for i, v in enumerate([0.3, 0.35, 0.3, 0.32, 0.31, 2.4, 0.3])
    ]
    report = analyze(parse_lines(lines))
    assert report.requests == 7
    assert [(s.metric, s.start_ts_s) for s in report.spikes] == [("request_ttft_s", 5)]


# -- the command --------------------------------------------------------------------------


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    logs_command.register(sub)
    args = parser.parse_args(["logs", "analyze", *argv])
    return int(args.func(args))


def test_cli_text_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(str(INCIDENT)) == 0
    out = capsys.readouterr().out
    assert "failures: 1" in out
    assert "OOM precursor: kv_cache" in out and "OOM precursor: host_memory" in out
    assert "latency spikes: 2" in out
    assert "derate     10 s before    thermal_level" in out


def test_cli_json_report(capsys: pytest.CaptureFixture[str], incident: Report) -> None:
    assert _cli(str(INCIDENT), "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["failures"][0]["ts"] == "2026-12-02T10:14:04.100Z"
    assert {p["resource"] for p in doc["precursors"]} == {"kv_cache", "host_memory"}
    assert len(doc["spikes"]) == len(incident.spikes)
    assert doc["spikes"][1]["causes"][0]["event"]["category"] in {"derate", "controller"}


def test_cli_reads_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(INCIDENT.read_text()))
    assert _cli("-") == 0
    assert "failures: 1" in capsys.readouterr().out


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(str(tmp_path / "nope.log")) == 1
    assert "nope.log" in capsys.readouterr().err
    assert _cli() == 2
    assert _cli(str(INCIDENT), "--journal") == 2
