"""APScheduler wiring: jobs from config, a load guard, misfire catch-up, job history."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_MISSED, JobExecutionEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger

from appliance.config.maintenance import MaintenanceConfig, cron_trigger
from appliance.services.events import EventBus
from appliance.services.store import StateStore

log = logging.getLogger("appliance.maintenance")

JobFn = Callable[[], Awaitable[dict[str, Any]]]
# Returns why a job must wait (realtime traffic, deep queue), or None when it may run.
LoadGuard = Callable[[], str | None]
OUTCOMES = ("ok", "failed", "deferred", "skipped", "missed")


class UnknownJob(KeyError):
    """No job of that name is registered."""


@dataclass(frozen=True)
class JobSpec:
    """A registered job: its name, schedule and the coroutine that does the work."""

    name: str
    cron: str
    enabled: bool
    fn: JobFn


class MaintenanceScheduler:
    """Owns the AsyncIOScheduler; every run goes through run_job (guard, history, metrics)."""

    def __init__(
        self,
        cfg: MaintenanceConfig,
        jobs: list[JobSpec],
        store: StateStore,
        events: EventBus,
        guard: LoadGuard,
        on_outcome: Callable[[str, str], None] | None = None,
    ) -> None:
        self._cfg = cfg
        self._jobs = {j.name: j for j in jobs}
        self._store = store
        self._events = events
        self._guard = guard
        self._on_outcome = on_outcome
        self._running: set[str] = set()
        # Deferrals since the daemon started, per job: shown by jobs_info (/admin/jobs).
        self._deferrals: dict[str, dict[str, Any]] = {}
        self._scheduler = AsyncIOScheduler(
            timezone=cfg.timezone,
            job_defaults={
                "coalesce": True,  # many missed fires run once
                "max_instances": 1,
                "misfire_grace_time": cfg.misfire_grace_s,
            },
        )
        self._scheduler.add_listener(self._on_scheduler_event, EVENT_JOB_ERROR | EVENT_JOB_MISSED)

    @property
    def names(self) -> list[str]:
        return list(self._jobs)

    def is_running(self, name: str) -> bool:
        return name in self._running

    def trigger_for(self, name: str) -> CronTrigger:
        return cron_trigger(self._jobs[name].cron, self._cfg.timezone)

    def start(self) -> None:
        """Register the cron jobs and start; must run inside the daemon's event loop."""
        for job in self._jobs.values():
            if not job.enabled:
                continue
            self._scheduler.add_job(
                self.run_job,
                self.trigger_for(job.name),
                args=[job.name, "schedule"],
                id=job.name,
                name=job.name,
                replace_existing=True,
            )
        self._scheduler.start()
        self._catch_up_missed()

    def shutdown(self) -> None:
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)

    def _catch_up_missed(self) -> None:
        """A fire time that passed while the daemon was down: run once if within the grace
        time (coalesced), else record it as missed. The memory job store cannot know this;
        the job history in SQLite can.

        A job that never ran counts from its baseline: the time this install first scheduled
        it (stored at that first start). So a fresh install does not fire a catch-up for every
        past date of the schedule, yet a first run that fell into a later downtime is caught up
        or recorded as missed like any other, never silently lost.
        """
        now = datetime.now(UTC)
        for job in self._jobs.values():
            if not job.enabled:
                continue
            baseline_s = float(
                self._store.meta_setdefault(f"job_baseline_s:{job.name}", repr(now.timestamp()))
            )
            runs = self._store.job_runs(job.name, limit=1)
            since_s = runs[0].started_s if runs else baseline_s
            due = last_due_between(
                self.trigger_for(job.name), datetime.fromtimestamp(since_s, UTC), now
            )
            if due is None:
                continue
            late_s = (now - due).total_seconds()
            if late_s <= self._cfg.misfire_grace_s:
                self._events.emit(
                    "job_catch_up",
                    f"{job.name} was due {late_s:.0f} s ago "
                    "while the daemon was down; running it now",
                    job=job.name,
                )
                self._scheduler.add_job(
                    self.run_job,
                    DateTrigger(now),
                    args=[job.name, "catch_up"],
                    id=f"{job.name}-catch-up",
                    replace_existing=True,
                )
            else:
                self._record_missed(
                    job.name, due, late_s, "while the daemon was down, > misfire_grace_s"
                )

    def _record_missed(self, name: str, due: datetime, late_s: float, why: str) -> None:
        """A run that will not happen: a job-history row, the counter and an event."""
        run_id = self._store.start_job_run(name, "schedule")
        self._store.finish_job_run(
            run_id, "missed", {"due_s": due.timestamp(), "late_s": round(late_s, 1), "why": why}
        )
        self._count(name, "missed")
        self._events.emit(
            "job_missed",
            f"{name} missed its run at {due.isoformat()} ({late_s:.0f} s late, {why})",
            job=name,
            late_s=round(late_s, 1),
        )

    def _job_name(self, job_id: str) -> str | None:
        """The job behind a scheduler id (the cron job, its deferred retry or catch-up)."""
        if job_id in self._jobs:
            return job_id
        for suffix in ("-deferred", "-catch-up"):
            if job_id.endswith(suffix) and job_id.removesuffix(suffix) in self._jobs:
                return job_id.removesuffix(suffix)
        return None

    def _on_scheduler_event(self, event: JobExecutionEvent) -> None:
        if event.code == EVENT_JOB_MISSED:
            # The loop was blocked (or the host suspended) past misfire_grace_s while the
            # daemon ran: APScheduler drops the run, so record it as missed like a downtime.
            name = self._job_name(event.job_id)
            if name is None:
                log.warning("scheduler job %s missed its run time", event.job_id)
                return
            due = event.scheduled_run_time
            late_s = (datetime.now(UTC) - due).total_seconds()
            what = "a deferred retry" if event.job_id.endswith("-deferred") else "its run"
            self._record_missed(
                name, due, late_s, f"{what} was due while the daemon ran, > misfire_grace_s"
            )
        elif event.exception is not None:  # run_job catches job errors; this is a bug in it
            log.error("scheduler job %s raised: %s", event.job_id, event.exception)

    def _count(self, job: str, outcome: str) -> None:
        if self._on_outcome is not None:
            self._on_outcome(job, outcome)

    async def run_job(self, name: str, trigger: str = "manual", attempt: int = 0) -> str:
        """Run a job now, through the load guard; record it; return the outcome."""
        if name not in self._jobs:
            raise UnknownJob(name)
        if name in self._running:
            run_id = self._store.start_job_run(name, trigger)
            self._store.finish_job_run(run_id, "skipped", {"why": "already running"})
            self._count(name, "skipped")
            self._events.emit(
                "job_skipped", f"{name} not started ({trigger}): already running", job=name
            )
            return "skipped"
        busy = self._guard()
        if busy is not None and trigger != "forced":
            if attempt < self._cfg.defer_max_retries:
                when = datetime.now(UTC) + timedelta(seconds=self._cfg.defer_retry_s)
                record = self._deferrals.setdefault(name, {"count": 0})
                record.update(
                    count=record["count"] + 1,
                    last_reason=busy,
                    last_s=time.time(),
                    attempt=attempt + 1,
                    retry_at=when.isoformat(),
                )
                self._scheduler.add_job(
                    self.run_job,
                    DateTrigger(when),
                    args=[name, trigger, attempt + 1],
                    id=f"{name}-deferred",
                    replace_existing=True,
                )
                self._count(name, "deferred")
                self._events.emit(
                    "job_deferred",
                    f"{name} deferred ({busy}); retry "
                    f"{attempt + 1}/{self._cfg.defer_max_retries} in "
                    f"{self._cfg.defer_retry_s:g} s",
                    job=name,
                    attempt=attempt + 1,
                )
                return "deferred"
            run_id = self._store.start_job_run(name, trigger)
            self._store.finish_job_run(run_id, "skipped", {"why": busy, "attempts": attempt + 1})
            self._count(name, "skipped")
            self._events.emit(
                "job_skipped", f"{name} gave up after {attempt + 1} deferrals: {busy}", job=name
            )
            return "skipped"
        self._running.add(name)
        run_id = self._store.start_job_run(name, trigger)
        started = time.monotonic()
        self._events.emit("job_started", f"{name} started ({trigger})", job=name, trigger=trigger)
        try:
            details = await self._jobs[name].fn()
        except Exception as exc:
            outcome, error, details = "failed", f"{type(exc).__name__}: {exc}", {}
            log.exception("maintenance job %s failed", name)
        else:
            outcome, error = "ok", None
        finally:
            self._running.discard(name)
        self._store.finish_job_run(run_id, outcome, details, error)
        self._count(name, outcome)
        seconds = time.monotonic() - started
        self._events.emit(
            "job_finished",
            f"{name} {outcome} in {seconds:.1f} s" + (f": {error}" if error else ""),
            job=name,
            outcome=outcome,
            seconds=round(seconds, 1),
        )
        return outcome

    def jobs_info(self) -> list[dict[str, Any]]:
        """Each job with schedule, next run time and its recent history."""
        out = []
        for job in self._jobs.values():
            sched = self._scheduler.get_job(job.name) if self._scheduler.running else None
            next_run = sched.next_run_time if sched is not None else None
            deferral = self._deferrals.get(job.name)
            if deferral is not None:
                retry = self._scheduler.get_job(f"{job.name}-deferred")
                # retry_at only while a retry is still pending.
                deferral = {**deferral, "retry_at": deferral["retry_at"] if retry else None}
            out.append(
                {
                    "name": job.name,
                    "cron": job.cron,
                    "enabled": job.enabled,
                    "running": job.name in self._running,
                    "next_run": next_run.isoformat() if next_run else None,
                    # Deferrals by the load guard since the daemon started: count, last
                    # reason and time, the attempt and the pending retry (None: none).
                    "deferred": deferral,
                    "history": [
                        {
                            "id": r.id,
                            "trigger": r.trigger,
                            "started_s": r.started_s,
                            "ended_s": r.ended_s,
                            "outcome": r.outcome,
                            "details": r.details,
                            "error": r.error,
                        }
                        for r in self._store.job_runs(job.name, limit=10)
                    ],
                }
            )
        return out

    def spawn(self, name: str, trigger: str = "manual") -> asyncio.Task[str]:
        """Run a job in the background (the admin API returns at once)."""
        if name not in self._jobs:
            raise UnknownJob(name)
        return asyncio.create_task(self.run_job(name, trigger), name=f"job-{name}")


def last_due_between(trigger: CronTrigger, after: datetime, now: datetime) -> datetime | None:
    """The last fire time of trigger in (after, now], or None."""
    due = None
    t = trigger.get_next_fire_time(None, after + timedelta(seconds=1))
    # Bounded: crontab jobs here fire at most hourly-ish; cap the walk anyway.
    for _ in range(100_000):
        if t is None or t > now:
            break
        due = t
        t = trigger.get_next_fire_time(t, t + timedelta(seconds=1))
    return due
