"""Incident analysis over the daemon's JSON log lines (pure: lines in, a report out).

It answers the two questions on-call asks after an incident:
- Did memory climb toward its limit before the engine died (an OOM precursor)?
- What happened just before each latency spike (derate, restart, job, burst)?

The lines are those of `appliance.json_log.JsonFormatter` (ts, level, logger, msg, request_id,
event, reason, ev_* fields). Lines that are not JSON (vLLM's own logger, tracebacks) are kept
as raw text with the time of the line before them, so an "out of memory" there still counts.

Two line kinds carry the numbers; the daemon emits them (ev_ prefix as for events, the bare
name is accepted too):

`event: "metrics_sample"`, one every few seconds:
  kv_cache_usage_ratio (0..1), rss_bytes (daemon + engine children), memory_limit_bytes
  (cgroup memory.max, or MemTotal), gpu_memory_used_bytes, gpu_memory_total_bytes (summed
  over GPUs; absent on CPU), p99_ttft_s, p99_tpot_s, p99_e2e_s (over the sample window; null
  with no requests), arrivals_per_s, requests_in_flight, queue_depth, concurrency_limit,
  rejected (429s in the window).
`event: "request_done"`, one per request: status, priority, ttft_s, tpot_s, e2e_s,
  prompt_tokens, completion_tokens (request_id as usual). Latency spikes come from the
  samples' P99 when there are any, else from these.

Context events are recognised by kind: engine_state (restarting, engine_dead),
engine_restarted, engine_start_failed, drain_timeout -> restart; a kind with "thermal" or
"derate" -> derate; "job*" / "maintenance*" -> job; "controller*" / "*limit*" -> controller.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

SAMPLE_EVENT = "metrics_sample"
REQUEST_EVENT = "request_done"

# (resource, value field, limit field or None for a 0..1 ratio)
RESOURCES: tuple[tuple[str, str, str | None], ...] = (
    ("kv_cache", "kv_cache_usage_ratio", None),
    ("host_memory", "rss_bytes", "memory_limit_bytes"),
    ("gpu_memory", "gpu_memory_used_bytes", "gpu_memory_total_bytes"),
)
SAMPLE_LATENCIES = ("p99_ttft_s", "p99_tpot_s", "p99_e2e_s")
# The names above -> what the daemon's metric-history rows call them (the same row feeds the
# SQLite history, the TUI and recalibration, so the log reads them as they are).
FIELD_ALIASES = {
    "p99_ttft_s": "ttft_p99_s",
    "p99_tpot_s": "tpot_p99_s",
    "p99_e2e_s": "e2e_p99_s",
    "queue_depth": "queued",
    "requests_in_flight": "in_flight",
    "concurrency_limit": "limit",
}
REQUEST_LATENCIES = ("ttft_s", "e2e_s")

_OOM_TEXT = re.compile(
    r"out of memory|OutOfMemoryError|oom[-_ ]?kill|killed by the OOM killer|"
    r"Cannot allocate memory|MemoryError",
    re.IGNORECASE,
)
_JOURNAL_LEVELS = {0: "critical", 1: "critical", 2: "critical", 3: "error", 4: "warning"}
_RESTART_STATES = {"restarting", "engine_dead"}
_RESTART_KINDS = {"engine_restarted", "engine_start_failed", "drain_timeout"}


@dataclass(frozen=True)
class LogRecord:
    """One log line: the JSON fields, or raw text with the time of the line before it."""

    ts_s: float | None
    level: str
    logger: str
    msg: str
    event: str | None = None
    reason: str | None = None
    request_id: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)
    raw: bool = False

    def value(self, name: str) -> Any:
        """An event field by bare name (ev_ prefixed or not, or the daemon's own alias)."""
        for key in (name, FIELD_ALIASES.get(name)):
            if key is None:
                continue
            if f"ev_{key}" in self.fields:
                return self.fields[f"ev_{key}"]
            if key in self.fields:
                return self.fields[key]
        return None

    def number(self, name: str) -> float | None:
        """A finite numeric field, else None."""
        v = self.value(name)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            return None
        return float(v)


@dataclass(frozen=True)
class AnalysisConfig:
    """Thresholds of the analysis; the defaults suit samples every 5-30 s."""

    lookback_s: float = 900.0  # how far before a failure a memory climb may begin
    near_limit: float = 0.9  # a climb must end at or above this share of the limit
    min_rise: float = 0.15  # and rise by at least this share of the limit
    climb_tolerance: float = 0.02  # dips smaller than this do not end a climb
    at_risk_level: float = 0.8  # an unfinished climb above this is reported at the end
    failure_merge_s: float = 30.0  # failure lines this close together are one failure
    spike_factor: float = 3.0  # a spike is this many times the baseline ...
    spike_min_s: float = 0.5  # ... and at least this many seconds above it
    baseline_points: int = 12  # the baseline is the median of this many earlier points
    min_baseline_points: int = 3
    spike_gap_s: float = 60.0  # spike points closer than this form one spike
    cause_before_s: float = 120.0  # events this long before a spike may explain it
    burst_factor: float = 2.0  # arrivals this many times the baseline are a burst ...
    burst_min_per_s: float = 1.0  # ... and at least this many per second above it


@dataclass(frozen=True)
class Failure:
    """The engine died, failed to start, or something ran out of memory."""

    ts_s: float
    kinds: tuple[str, ...]
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Climb:
    """A resource rising toward its limit; `failure_ts_s` is None while nothing failed yet."""

    resource: str
    start_ts_s: float
    start_ratio: float
    peak_ts_s: float
    peak_ratio: float
    rate_per_min: float
    failure_ts_s: float | None

    @property
    def lead_s(self) -> float | None:
        """Seconds from the start of the climb to the failure."""
        return None if self.failure_ts_s is None else self.failure_ts_s - self.start_ts_s

    @property
    def minutes_to_limit(self) -> float | None:
        """At the current rate, minutes from the peak until the limit (unfinished climbs)."""
        if self.failure_ts_s is not None or self.rate_per_min <= 0:
            return None
        return max(0.0, (1.0 - self.peak_ratio) / self.rate_per_min)


@dataclass(frozen=True)
class ContextEvent:
    """Something that can explain a latency spike; a job's start carries when it ended."""

    ts_s: float
    category: str  # restart, derate, job, controller, burst
    kind: str
    reason: str
    until_ts_s: float | None = None  # a job_started: its job_finished (or the log's end)


@dataclass(frozen=True)
class Cause:
    """A context event near a spike; offset_s < 0 means it came first."""

    event: ContextEvent
    offset_s: float


@dataclass(frozen=True)
class LatencySpike:
    """Consecutive latency points far above their baseline, with the events around them."""

    metric: str
    start_ts_s: float
    end_ts_s: float
    peak_ts_s: float
    peak_s: float
    baseline_s: float
    causes: tuple[Cause, ...]

    @property
    def factor(self) -> float:
        """Peak over baseline."""
        return self.peak_s / self.baseline_s if self.baseline_s > 0 else math.inf


@dataclass(frozen=True)
class Report:
    """What `appliance logs analyze` prints."""

    lines: int
    raw_lines: int
    first_ts_s: float | None
    last_ts_s: float | None
    levels: Mapping[str, int]
    samples: int
    requests: int
    failures: tuple[Failure, ...]
    precursors: tuple[Climb, ...]
    at_risk: tuple[Climb, ...]
    spikes: tuple[LatencySpike, ...]
    events: tuple[ContextEvent, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, times as ISO strings next to the epoch seconds."""
        out = asdict(self)
        out["precursors"] = [_climb_dict(c) for c in self.precursors]
        out["at_risk"] = [_climb_dict(c) for c in self.at_risk]
        for spike, d in zip(self.spikes, out["spikes"], strict=True):
            d["factor"] = round(spike.factor, 2)
        return _with_iso(out)


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _climb_dict(c: Climb) -> dict[str, Any]:
    d = asdict(c)
    for key in ("start_ratio", "peak_ratio", "rate_per_min"):
        d[key] = round(d[key], 4)
    d["lead_s"] = _rounded(c.lead_s, 1)
    d["minutes_to_limit"] = _rounded(c.minutes_to_limit, 1)
    return d


def _with_iso(obj: Any) -> Any:
    if isinstance(obj, dict):
        out = {k: _with_iso(v) for k, v in obj.items()}
        for k, v in obj.items():
            if k.endswith("ts_s") and isinstance(v, int | float):
                out[k[: -len("_s")]] = iso(v)
        return out
    if isinstance(obj, list | tuple):
        return [_with_iso(v) for v in obj]
    return obj


def iso(ts_s: float) -> str:
    """UTC time as 2026-12-02T10:14:03.200Z."""
    return datetime.fromtimestamp(ts_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# -- parsing ------------------------------------------------------------------------------


def _parse_ts(value: Any) -> float | None:
    if isinstance(value, int | float):
        return float(value)
    if not isinstance(value, str):
        return None
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        return None
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


_CORE = {"ts", "level", "logger", "msg", "event", "reason", "request_id"}


def _from_json(obj: Mapping[str, Any], fallback_ts: float | None) -> LogRecord:
    ts = _parse_ts(obj.get("ts"))
    return LogRecord(
        ts_s=ts if ts is not None else fallback_ts,
        level=str(obj.get("level", "info")).lower(),
        logger=str(obj.get("logger", "")),
        msg=str(obj.get("msg", "")),
        event=obj.get("event") if isinstance(obj.get("event"), str) else None,
        reason=obj.get("reason") if isinstance(obj.get("reason"), str) else None,
        request_id=obj.get("request_id") if isinstance(obj.get("request_id"), str) else None,
        fields={k: v for k, v in obj.items() if k not in _CORE},
    )


def _raw(text: str, ts: float | None, level: str | None = None) -> LogRecord:
    guess = level or next(
        (lv for lv in ("critical", "error", "warning") if re.match(lv, text, re.IGNORECASE)),
        "info",
    )
    return LogRecord(ts_s=ts, level=guess, logger="", msg=text, raw=True)


def _json_object(text: str) -> dict[str, Any] | None:
    if not text.startswith("{"):
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def parse_lines(lines: Iterable[str]) -> list[LogRecord]:
    """Records from a log file's lines (JSON lines, with raw text lines kept)."""
    out: list[LogRecord] = []
    last_ts: float | None = None
    for line in lines:
        text = line.strip()
        if not text:
            continue
        obj = _json_object(text)
        rec = _from_json(obj, last_ts) if obj is not None else _raw(text, last_ts)
        last_ts = rec.ts_s if rec.ts_s is not None else last_ts
        out.append(rec)
    return out


def _journal_message(entry: Mapping[str, Any]) -> str:
    msg = entry.get("MESSAGE", "")
    if isinstance(msg, list):  # journald sends non-UTF-8 messages as a byte array
        return bytes(b for b in msg if isinstance(b, int)).decode("utf-8", "replace")
    return str(msg)


def parse_journal_json(lines: Iterable[str]) -> list[LogRecord]:
    """Records from `journalctl -o json` output: our JSON inside MESSAGE, or raw text."""
    out: list[LogRecord] = []
    for line in lines:
        entry = _json_object(line.strip())
        if entry is None:
            continue
        try:
            ts: float | None = int(entry["__REALTIME_TIMESTAMP"]) / 1_000_000
        except (KeyError, ValueError, TypeError):
            ts = out[-1].ts_s if out else None
        text = _journal_message(entry).strip()
        obj = _json_object(text)
        if obj is not None:
            out.append(_from_json(obj, ts))
            continue
        try:
            level = _JOURNAL_LEVELS.get(int(entry.get("PRIORITY", 6)), "info")
        except ValueError:
            level = "info"
        out.append(_raw(text, ts, level))
    return out


# -- analysis -----------------------------------------------------------------------------


def _timed(records: Sequence[LogRecord]) -> list[LogRecord]:
    return sorted((r for r in records if r.ts_s is not None), key=lambda r: r.ts_s or 0.0)


def _failure_kind(r: LogRecord) -> str | None:
    if r.event == "engine_state" and r.value("state") == "engine_dead":
        return "engine_dead"
    if r.event == "engine_start_failed":
        return "engine_start_failed"
    text = f"{r.msg} {r.fields.get('exc', '')}"
    if r.level in {"error", "critical", "warning"} and _OOM_TEXT.search(text):
        return "oom"
    return None


def find_failures(records: Sequence[LogRecord], cfg: AnalysisConfig) -> list[Failure]:
    """Engine deaths, failed starts and out-of-memory lines, close ones merged."""
    out: list[Failure] = []
    for r in _timed(records):
        kind = _failure_kind(r)
        if kind is None:
            continue
        assert r.ts_s is not None
        reason = r.reason or r.msg
        if out and r.ts_s - out[-1].ts_s <= cfg.failure_merge_s:
            last = out[-1]
            out[-1] = Failure(
                last.ts_s,
                last.kinds + ((kind,) if kind not in last.kinds else ()),
                last.reasons + ((reason,) if reason not in last.reasons else ()),
            )
        else:
            out.append(Failure(r.ts_s, (kind,), (reason,)))
    return out


def resource_series(
    samples: Sequence[LogRecord],
) -> dict[str, list[tuple[float, float]]]:
    """resource -> [(ts, share of its limit)] from metrics_sample lines."""
    out: dict[str, list[tuple[float, float]]] = {}
    for r in samples:
        for name, value_field, limit_field in RESOURCES:
            value = r.number(value_field)
            limit = 1.0 if limit_field is None else r.number(limit_field)
            if value is None or not limit or r.ts_s is None:
                continue
            out.setdefault(name, []).append((r.ts_s, value / limit))
    return out


def climb_ending_at(
    series: Sequence[tuple[float, float]], cfg: AnalysisConfig
) -> tuple[int, int] | None:
    """(start, peak) indices of the rise that ends with the series' last point, if any."""
    if len(series) < 2:
        return None
    end = len(series) - 1
    start = end
    while start > 0 and series[start - 1][1] <= series[start][1] + cfg.climb_tolerance:
        start -= 1
    peak = max(range(start, end + 1), key=lambda i: (series[i][1], -i))
    # The climb begins where the run last leaves its floor (a flat stretch is no climb). The
    # floor is the lowest point before the peak: a tail that eases down after it, in dips each
    # within the tolerance, may end lower than anything before the peak, and is no part of it.
    floor = min(v for _, v in series[start : peak + 1])
    start = max(i for i in range(start, peak + 1) if series[i][1] <= floor + cfg.climb_tolerance)
    if peak <= start:
        return None
    return start, peak


def _climb(
    resource: str,
    series: Sequence[tuple[float, float]],
    cfg: AnalysisConfig,
    failure_ts: float | None,
    min_peak: float,
) -> Climb | None:
    found = climb_ending_at(series, cfg)
    if found is None:
        return None
    (t0, v0), (t1, v1) = series[found[0]], series[found[1]]
    if v1 < min_peak or v1 - v0 < cfg.min_rise:
        return None
    rate = (v1 - v0) / ((t1 - t0) / 60) if t1 > t0 else 0.0
    return Climb(resource, t0, v0, t1, v1, rate, failure_ts)


def find_precursors(
    series: Mapping[str, Sequence[tuple[float, float]]],
    failures: Sequence[Failure],
    cfg: AnalysisConfig,
) -> list[Climb]:
    """For each failure, the resources that climbed to near their limit just before it."""
    out: list[Climb] = []
    for failure in failures:
        for resource, points in series.items():
            window = [p for p in points if failure.ts_s - cfg.lookback_s <= p[0] <= failure.ts_s]
            climb = _climb(resource, window, cfg, failure.ts_s, cfg.near_limit)
            if climb is not None:
                out.append(climb)
    return out


def find_at_risk(
    series: Mapping[str, Sequence[tuple[float, float]]],
    failures: Sequence[Failure],
    cfg: AnalysisConfig,
) -> list[Climb]:
    """Climbs still under way at the end of the log, with no failure after them yet."""
    out: list[Climb] = []
    last_failure = failures[-1].ts_s if failures else -math.inf
    for resource, points in series.items():
        if not points:
            continue
        window = [
            p for p in points if p[0] > last_failure and p[0] >= points[-1][0] - cfg.lookback_s
        ]
        climb = _climb(resource, window, cfg, None, cfg.at_risk_level)
        if climb is not None:
            out.append(climb)
    return out


def _category(r: LogRecord) -> str | None:
    kind = r.event or ""
    if kind == "engine_state":
        return "restart" if r.value("state") in _RESTART_STATES else None
    if kind in _RESTART_KINDS:
        return "restart"
    if "thermal" in kind or "derate" in kind:
        return "derate"
    if kind.startswith(("job", "maintenance")):
        return "job"
    if kind.startswith("controller") or "limit" in kind:
        return "controller"
    return None


def _job_end(r: LogRecord, later: Sequence[LogRecord]) -> float | None:
    """When the job a job_started line began finished (the log's end while it still runs)."""
    name = r.value("job")
    for other in later:
        if other.event == "job_finished" and other.value("job") == name:
            return other.ts_s
    return later[-1].ts_s if later else r.ts_s


def context_events(records: Sequence[LogRecord]) -> list[ContextEvent]:
    """The events that can explain latency: restarts, derates, jobs, controller moves."""
    timed = _timed(records)
    out = []
    for i, r in enumerate(timed):
        category = _category(r)
        if category is None or r.ts_s is None:
            continue
        # A running job (a benchmark, say) explains latency for as long as it runs.
        until = _job_end(r, timed[i + 1 :]) if r.event == "job_started" else None
        out.append(ContextEvent(r.ts_s, category, r.event or "", r.reason or r.msg, until))
    return out


@dataclass(frozen=True)
class _Run:
    start: float
    end: float
    peak_ts: float
    peak: float
    baseline: float


def spikes_in(
    series: Sequence[tuple[float, float]], factor: float, min_excess: float, cfg: AnalysisConfig
) -> list[_Run]:
    """Runs of points at least `factor` x and `min_excess` above the median of earlier ones."""
    runs: list[_Run] = []
    normal: list[float] = []  # earlier points that were not spikes: the baseline's source
    current: _Run | None = None
    for ts, v in series:
        baseline = (
            statistics.median(normal[-cfg.baseline_points :])
            if len(normal) >= cfg.min_baseline_points
            else None
        )
        is_spike = baseline is not None and v >= baseline * factor and v - baseline >= min_excess
        if not is_spike:
            normal.append(v)
            if current is not None and ts - current.end > cfg.spike_gap_s:
                runs.append(current)
                current = None
            continue
        assert baseline is not None
        if current is not None and ts - current.end <= cfg.spike_gap_s:
            peak = (ts, v) if v > current.peak else (current.peak_ts, current.peak)
            current = _Run(current.start, ts, peak[0], peak[1], current.baseline)
        else:
            if current is not None:
                runs.append(current)
            current = _Run(ts, ts, ts, v, baseline)
    if current is not None:
        runs.append(current)
    return runs


def find_bursts(samples: Sequence[LogRecord], cfg: AnalysisConfig) -> list[ContextEvent]:
    """Arrival-rate bursts in the samples, as context events."""
    series = _points(samples, "arrivals_per_s")
    return [
        ContextEvent(
            run.start,
            "burst",
            "burst",
            f"arrivals {run.peak:.1f}/s against {run.baseline:.1f}/s before",
        )
        for run in spikes_in(series, cfg.burst_factor, cfg.burst_min_per_s, cfg)
    ]


def _points(records: Sequence[LogRecord], name: str) -> list[tuple[float, float]]:
    return [
        (r.ts_s, v) for r in records if r.ts_s is not None and (v := r.number(name)) is not None
    ]


def latency_series(
    samples: Sequence[LogRecord], requests: Sequence[LogRecord]
) -> dict[str, list[tuple[float, float]]]:
    """metric -> [(ts, seconds)]: the samples' P99s, or per-request latency without them."""
    out = {name: pts for name in SAMPLE_LATENCIES if (pts := _points(samples, name))}
    if out:
        return out
    return {
        f"request_{name}": pts for name in REQUEST_LATENCIES if (pts := _points(requests, name))
    }


def _causes(
    start: float, end: float, events: Sequence[ContextEvent], cfg: AnalysisConfig
) -> tuple[Cause, ...]:
    near = [
        Cause(e, e.ts_s - start)
        for e in events
        if e.ts_s <= end and max(e.ts_s, e.until_ts_s or e.ts_s) >= start - cfg.cause_before_s
    ]
    # Events before the spike first, nearest first; then those during it, in order.
    return tuple(sorted(near, key=lambda c: (c.offset_s > 0, abs(c.offset_s))))


def find_spikes(
    series: Mapping[str, Sequence[tuple[float, float]]],
    events: Sequence[ContextEvent],
    cfg: AnalysisConfig,
) -> list[LatencySpike]:
    """Latency spikes per metric, each with the events just before or during it."""
    out = []
    for metric, points in series.items():
        for run in spikes_in(points, cfg.spike_factor, cfg.spike_min_s, cfg):
            out.append(
                LatencySpike(
                    metric,
                    run.start,
                    run.end,
                    run.peak_ts,
                    run.peak,
                    run.baseline,
                    _causes(run.start, run.end, events, cfg),
                )
            )
    return sorted(out, key=lambda s: s.start_ts_s)


def analyze(records: Sequence[LogRecord], cfg: AnalysisConfig | None = None) -> Report:
    """The whole report for a log."""
    cfg = cfg or AnalysisConfig()
    timed = _timed(records)
    samples = [r for r in timed if r.event == SAMPLE_EVENT]
    requests = [r for r in timed if r.event == REQUEST_EVENT]
    failures = find_failures(timed, cfg)
    resources = resource_series(samples)
    events = sorted(context_events(timed) + find_bursts(samples, cfg), key=lambda e: e.ts_s)
    return Report(
        lines=len(records),
        raw_lines=sum(r.raw for r in records),
        first_ts_s=timed[0].ts_s if timed else None,
        last_ts_s=timed[-1].ts_s if timed else None,
        levels=dict(Counter(r.level for r in records)),
        samples=len(samples),
        requests=len(requests),
        failures=tuple(failures),
        precursors=tuple(find_precursors(resources, failures, cfg)),
        at_risk=tuple(find_at_risk(resources, failures, cfg)),
        spikes=tuple(find_spikes(latency_series(samples, requests), events, cfg)),
        events=tuple(events),
    )
