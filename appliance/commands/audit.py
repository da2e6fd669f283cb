"""`appliance audit export`: the audit log as JSON lines, read from its file (the daemon may
be running or stopped)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import sys
import tempfile
from collections.abc import Iterable
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any, TextIO

from appliance.commands._config import load_for
from appliance.commands._subparsers import add_command, add_group
from appliance.config import Config
from appliance.services.audit_log import read_records

AUDIT_FILE = "audit.db"
USAGE_EXIT = 2  # argparse's own status for a bad argument
TIME_FORMAT = "ISO 8601: 2026-01-31, 2026-01-31T14:00, 2026-01-31T14:00:00+01:00; UTC unless given"


def register(sub: Any) -> None:
    """Add `audit export [--config PATH] [--from T] [--to T] [--out FILE]`."""
    audit_sub = add_group(sub, "audit", "the audit log of requests")
    p = add_command(
        audit_sub,
        "export",
        run_export,
        help="write the audit records as JSON lines, oldest first",
        description="Write the audit records that arrived in [--from, --to) as JSON lines, one "
        "record a line, oldest first. A date alone means the whole day: --from 2026-01-01 "
        "--to 2026-01-31 is all of January.",
    )
    p.add_argument("--config", help="config file (default: $APPLIANCE_CONFIG, /etc, ./)")
    p.add_argument("--from", dest="from_s", type=start_s, metavar="TIME", help=TIME_FORMAT)
    p.add_argument("--to", dest="to_s", type=end_s, metavar="TIME", help=TIME_FORMAT)
    p.add_argument("--out", type=Path, help="write to this file (whole or not at all)")


def audit_path(cfg: Config) -> Path:
    """The audit log's file: config audit.path when the config has one (relative to
    state_dir), else state_dir/audit.db."""
    configured = getattr(getattr(cfg, "audit", None), "path", None)
    if configured is None:
        return Path(cfg.state_dir) / AUDIT_FILE
    return Path(cfg.state_dir) / Path(configured)  # an absolute path stays itself


def parse_time(text: str, *, end: bool) -> float:
    """An ISO 8601 date or time as unix seconds (UTC unless it says otherwise). A date alone
    starts its day, or (end) ends it, so --to 2026-01-31 takes in the 31st."""
    try:
        day = date.fromisoformat(text)
    except ValueError:
        pass
    else:
        start = datetime.combine(day, time(), UTC)
        return (start + timedelta(days=1) if end else start).timestamp()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a date or time in {TIME_FORMAT}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def start_s(text: str) -> float:
    """--from: inclusive."""
    return parse_time(text, end=False)


def end_s(text: str) -> float:
    """--to: exclusive (a date alone: the end of that day)."""
    return parse_time(text, end=True)


def run_export(args: argparse.Namespace) -> int:
    """Write the records in the range to stdout or --out; the count goes to stderr."""
    if args.from_s is not None and args.to_s is not None and args.from_s >= args.to_s:
        print("audit export: --from must be before --to", file=sys.stderr)
        return USAGE_EXIT
    path = audit_path(load_for(args))
    if not path.is_file():
        print(
            f"audit export: no audit log at {path} (the daemon writes it once it serves "
            "requests; --config names the daemon's config)",
            file=sys.stderr,
        )
        return 1
    try:
        records = read_records(path, args.from_s, args.to_s)
        count = _to_stdout(records) if args.out is None else write_atomically(args.out, records)
    except (sqlite3.Error, OSError) as exc:  # not an audit file, no room for --out, ...
        print(f"audit export: {exc} (reading {path})", file=sys.stderr)
        return 1
    if count is None:  # the reader went away: nothing more to say
        return 0
    where = "stdout" if args.out is None else str(args.out)
    print(f"audit export: {count} records from {path} to {where}", file=sys.stderr)
    return 0


def write_lines(records: Iterable[dict[str, Any]], out: TextIO) -> int:
    """One JSON object a line; how many."""
    count = 0
    for record in records:
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
        count += 1
    return count


def write_atomically(target: Path, records: Iterable[dict[str, Any]]) -> int:
    """Write to a temporary file beside target, then rename it over target: a reader (or a
    failed export) never sees half a file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            count = write_lines(records, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return count


def _to_stdout(records: Iterable[dict[str, Any]]) -> int | None:
    """Write to stdout; how many, or None when the reader stopped early (`| head`): that
    ends the export quietly."""
    try:
        count = write_lines(records, sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python would complain again at exit flushing stdout: point it at /dev/null.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return None
    return count
