"""`appliance logs analyze`: OOM precursors and latency spikes, from a log file or the journal."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from appliance.commands._subparsers import add_command, add_group
from appliance.domain.incidents import (
    AnalysisConfig,
    Climb,
    LogRecord,
    Report,
    analyze,
    iso,
    parse_journal_json,
    parse_lines,
)

READ_ERROR_EXIT = 1


def register(sub: Any) -> None:
    """Add `logs analyze [FILE | --journal [--unit U] [--since T] [--journal-dir D]] [--json]`."""
    p = add_command(
        add_group(sub, "logs", "log tools"),
        "analyze",
        run,
        help="find OOM precursors and tie latency spikes to events",
        description="Analyse the daemon's JSON log lines: memory climbing toward its limit "
        "before a failure, and what happened just before each latency spike.",
    )
    p.add_argument("file", nargs="?", help="log file of JSON lines ('-' for stdin)")
    p.add_argument("--journal", action="store_true", help="read the systemd journal instead")
    p.add_argument("--unit", default="appliance", help="journal unit (default appliance)")
    p.add_argument("--since", help="journal start, as journalctl takes it (e.g. '-2h')")
    p.add_argument(
        "--journal-dir", help="a journal directory copied from another machine (journalctl -D)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def journal_command(unit: str, since: str | None, directory: str | None = None) -> list[str]:
    """The journalctl call whose output parse_journal_json reads."""
    argv = ["journalctl", "--unit", unit, "--output", "json", "--no-pager"]
    if directory:
        argv += ["--directory", directory]
    if since:
        argv += ["--since", since]
    return argv


def _read(args: argparse.Namespace) -> list[LogRecord]:
    if args.journal:
        if shutil.which("journalctl") is None:
            raise OSError("journalctl is not installed")
        proc = subprocess.run(
            journal_command(args.unit, args.since, args.journal_dir),
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise OSError(f"journalctl failed: {proc.stderr.strip()}")
        return parse_journal_json(proc.stdout.splitlines())
    if args.file == "-":
        return parse_lines(sys.stdin)
    with Path(args.file).open(encoding="utf-8", errors="replace") as fh:
        return parse_lines(fh)


def run(args: argparse.Namespace) -> int:
    """Read the log, analyse it and print the report; 1 when the log cannot be read."""
    if args.journal == bool(args.file):
        print("logs analyze: give a FILE or --journal (not both)", file=sys.stderr)
        return 2
    try:
        records = _read(args)
    except OSError as exc:
        print(f"logs analyze: {exc}", file=sys.stderr)
        return READ_ERROR_EXIT
    report = analyze(records, AnalysisConfig())
    print(json.dumps(report.to_dict(), indent=2) if args.json else render_text(report), end="")
    if args.json:
        print()
    return 0


# -- text report --------------------------------------------------------------------------


def _t(ts: float) -> str:
    return iso(ts)[:-5].replace("T", " ")  # to the second: 2026-12-02 10:14:03


def _ago(offset_s: float) -> str:
    return f"{-offset_s:.0f} s before" if offset_s <= 0 else f"{offset_s:.0f} s into it"


def _climb_line(c: Climb) -> str:
    return (
        f"{c.resource} {c.start_ratio:.0%} -> {c.peak_ratio:.0%} of its limit over "
        f"{(c.peak_ts_s - c.start_ts_s) / 60:.1f} min (+{c.rate_per_min:.1%}/min) "
        f"from {_t(c.start_ts_s)}"
    )


def render_text(report: Report) -> str:
    """The report as the terminal shows it."""
    lines = []
    if report.first_ts_s is not None and report.last_ts_s is not None:
        span = f"{_t(report.first_ts_s)} .. {_t(report.last_ts_s)} UTC"
    else:
        span = "no timestamps"
    levels = ", ".join(f"{n} {lv}" for lv, n in sorted(report.levels.items()))
    lines.append(f"log: {report.lines} lines ({report.raw_lines} not JSON), {span}")
    lines.append(f"     {levels}; {report.samples} metric samples, {report.requests} requests")
    if report.samples == 0:
        lines.append("     no metrics_sample lines: memory precursors and P99 spikes need them")

    lines += ["", f"failures: {len(report.failures)}"]
    for f in report.failures:
        lines.append(f"  {_t(f.ts_s)}  {'+'.join(f.kinds)}: {f.reasons[0]}")
        climbs = [c for c in report.precursors if c.failure_ts_s == f.ts_s]
        for c in climbs:
            lines.append(
                f"    OOM precursor: {_climb_line(c)}, "
                f"{f.ts_s - c.peak_ts_s:.0f} s before the failure"
            )
        if not climbs:
            lines.append("    no memory climb before it: look for a crash, an Xid or a kill")

    if report.at_risk:
        lines += ["", "still climbing at the end of the log:"]
        for c in report.at_risk:
            eta = c.minutes_to_limit
            when = f"; the limit in ~{eta:.0f} min at this rate" if eta is not None else ""
            lines.append(f"  {_climb_line(c)}{when}")

    lines += ["", f"latency spikes: {len(report.spikes)}"]
    for s in report.spikes:
        lines.append(
            f"  {_t(s.start_ts_s)} .. {_t(s.end_ts_s)}  {s.metric} peak {s.peak_s:.2f} s "
            f"({s.factor:.1f}x the {s.baseline_s:.2f} s baseline)"
        )
        for c in s.causes[:4]:
            lines.append(
                f"    {c.event.category:<10} {_ago(c.offset_s):<14} {c.event.kind}: "
                f"{c.event.reason}"
            )
        if not s.causes:
            lines.append("    no derate, restart, job or burst nearby")

    lines += ["", f"events: {len(report.events)}"]
    for e in report.events:
        lines.append(f"  {_t(e.ts_s)}  {e.category:<10} {e.kind}: {e.reason}")
    return "\n".join(lines) + "\n"
