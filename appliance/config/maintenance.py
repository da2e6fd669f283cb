"""The `maintenance:` config section: schedules, guard, history retention, recalibration bounds.

It lives in the config layer (the daemon reads it to build the scheduler, the metric history
and the recalibration job); maintenance/ imports it from here, never the other way round.
"""

from __future__ import annotations

from typing import Literal

from apscheduler.triggers.cron import CronTrigger
from pydantic import Field, field_validator

from appliance.config.section import Section
from appliance.domain.threshold_fit import Bounds

# The hardware maxima recalibration keeps to by default are the domain's (Bounds).
_HARDWARE = Bounds()


def cron_trigger(expr: str, timezone: str = "UTC") -> CronTrigger:
    """A crontab line ("min hour day month weekday"), or six fields with seconds first."""
    fields = expr.split()
    if len(fields) == 6:
        second, minute, hour, day, month, dow = fields
        return CronTrigger(
            second=second,
            minute=minute,
            hour=hour,
            day=day,
            month=month,
            day_of_week=dow,
            timezone=timezone,
        )
    return CronTrigger.from_crontab(expr, timezone=timezone)


class JobSchedule(Section):
    """One job's crontab line ("min hour day month weekday") and whether it runs."""

    enabled: bool = True
    cron: str

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str) -> str:
        try:
            cron_trigger(value)
        except ValueError as exc:
            raise ValueError(f"not a crontab expression ({exc})") from None
        return value


class MaintenanceConfig(Section):
    """When maintenance runs and how careful it is."""

    timezone: str = "UTC"
    restart: JobSchedule = JobSchedule(cron="0 3 * * sun")
    benchmark: JobSchedule = JobSchedule(cron="0 2 1 * *")
    recalibrate: JobSchedule = JobSchedule(cron="0 4 1 1,4,7,10 *")
    # Retrain the load predictor on the stored history (a second or two of CPU).
    predictor: JobSchedule = JobSchedule(cron="30 4 * * *")
    # Delete audit records older than audit.retention_days.
    audit_prune: JobSchedule = JobSchedule(cron="45 4 * * *")
    # A run due while the daemon was down still runs at start if it is at most this late.
    misfire_grace_s: int = Field(6 * 3600, ge=1, le=30 * 86400)
    # Load guard: defer while realtime requests run or wait, or the queue is deeper than this.
    guard_max_queue: int = Field(4, ge=0, le=100_000)
    defer_retry_s: float = Field(300.0, gt=0, le=86400)
    defer_max_retries: int = Field(12, ge=0, le=1000)
    # Restart only when the engine's memory grew by at least this share since its start
    # (0: always restart on schedule).
    restart_min_growth_ratio: float = Field(0.0, ge=0, le=10)
    # A re-benchmark whose best throughput is this share below the previous run raises an event.
    regression_ratio: float = Field(0.1, gt=0, lt=1)
    # Benchmark job: "tuning" is the three-phase tuning (baseline 8, doubling up to the knee,
    # at most engine.max_num_seqs); "sweep" measures benchmark_concurrency and, while
    # throughput still rises at its largest level, doubles upward to engine.max_num_seqs.
    # Either way a run still rising at the top sets no ceiling.
    benchmark_mode: Literal["tuning", "sweep"] = "tuning"
    benchmark_concurrency: tuple[int, ...] = (1, 2, 4, 8, 16)
    benchmark_requests_per_level: int = Field(8, ge=1, le=10_000)
    benchmark_max_tokens: int = Field(32, ge=1, le=4096)
    # Metric history: sample period and how long each resolution is kept.
    history_interval_s: float = Field(5.0, gt=0, le=3600)
    history_raw_keep_s: float = Field(86400.0, gt=0)
    history_minute_keep_s: float = Field(30 * 86400.0, gt=0)
    history_hour_keep_s: float = Field(400 * 86400.0, gt=0)
    # Early warning: this often, the OOM-precursor and latency-spike analysis runs over this
    # much recent history; memory that reaches its limit within the horizon at the window's
    # slope is a precursor (services/early_warning.py).
    early_warning_interval_s: float = Field(60.0, gt=0, le=3600)
    early_warning_window_s: float = Field(3600.0, ge=600, le=86400)
    early_warning_horizon_s: float = Field(3600.0, gt=0, le=7 * 86400)
    # Recalibration may never raise a thermal threshold above these (the hardware's limits)
    # unless allow_above_hardware is set by the operator.
    hardware_max_core_c: float = Field(_HARDWARE.max_core_c, gt=0, le=150)
    hardware_max_mem_c: float = Field(_HARDWARE.max_mem_c, gt=0, le=150)
    allow_above_hardware: bool = False

    @field_validator("timezone")
    @classmethod
    def _valid_tz(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r}") from None
        return value

    @field_validator("benchmark_concurrency")
    @classmethod
    def _levels(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or any(v < 1 for v in value):
            raise ValueError("each level must be >= 1, at least one level")
        return tuple(sorted(set(value)))
