"""The real APScheduler: a short trigger fires, misfires after downtime, the load guard,
and job history that survives a restart of the store."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from appliance.config.maintenance import MaintenanceConfig, cron_trigger
from appliance.services.events import EventBus
from appliance.services.store import StateStore
from maintenance.scheduler import JobSpec, MaintenanceScheduler, UnknownJob, last_due_between


def _cfg(**kw) -> MaintenanceConfig:
    return MaintenanceConfig(**kw)


async def test_real_scheduler_fires_a_short_trigger(tmp_path: Path):
    store = StateStore(tmp_path / "a.db")
    fired: list[float] = []

    async def job() -> dict:
        fired.append(time.monotonic())
        return {"n": len(fired)}

    sched = MaintenanceScheduler(
        _cfg(), [JobSpec("tick", "* * * * * *", True, job)], store, EventBus(), guard=lambda: None
    )
    sched.start()
    try:
        for _ in range(60):
            if len(fired) >= 2:
                break
            await asyncio.sleep(0.1)
    finally:
        sched.shutdown()
    assert len(fired) >= 2
    runs = store.job_runs("tick")
    assert runs and all(r.outcome == "ok" and r.trigger == "schedule" for r in runs)
    info = sched.jobs_info()[0]
    assert info["name"] == "tick" and info["history"][0]["details"]["n"] >= 1


async def test_history_survives_a_store_restart(tmp_path: Path):
    path = tmp_path / "a.db"
    store = StateStore(path)

    async def job() -> dict:
        return {"ok": True}

    sched = MaintenanceScheduler(
        _cfg(), [JobSpec("j", "0 3 * * sun", True, job)], store, EventBus(), guard=lambda: None
    )
    assert await sched.run_job("j") == "ok"
    store.close()
    again = StateStore(path)
    assert [r.outcome for r in again.job_runs("j")] == ["ok"]


async def _start_hourly_and_wait(store: StateStore) -> list[int]:
    """Start a scheduler with one hourly job (grace 1 h); the job's calls after up to 2.5 s."""
    calls: list[int] = []

    async def job() -> dict:
        calls.append(1)
        return {}

    sched = MaintenanceScheduler(
        _cfg(misfire_grace_s=3600),
        [JobSpec("hourly", "0 * * * *", True, job)],
        store,
        EventBus(),
        guard=lambda: None,
    )
    sched.start()
    try:
        for _ in range(50):
            if calls:
                break
            await asyncio.sleep(0.05)
    finally:
        sched.shutdown()
    return calls


async def test_missed_run_within_grace_runs_once_at_start(tmp_path: Path):
    store = StateStore(tmp_path / "a.db")
    # The daemon last ran the hourly job 2.5 hours ago and was down since.
    run_id = store.start_job_run("hourly", "schedule")
    store.finish_job_run(run_id, "ok", {})
    with store._tx() as cur:
        cur.execute("UPDATE job_runs SET started_s = ?", (time.time() - 2.5 * 3600,))
    calls = await _start_hourly_and_wait(store)
    assert calls == [1]  # coalesced: two missed hours run once
    assert store.job_runs("hourly")[0].trigger == "catch_up"


async def test_missed_run_past_grace_is_recorded_as_missed(tmp_path: Path):
    store = StateStore(tmp_path / "a.db")
    run_id = store.start_job_run("daily", "schedule")
    store.finish_job_run(run_id, "ok", {})
    with store._tx() as cur:
        cur.execute("UPDATE job_runs SET started_s = ?", (time.time() - 3 * 86400,))
    events = EventBus()

    async def job() -> dict:
        raise AssertionError("must not run")

    sched = MaintenanceScheduler(
        _cfg(misfire_grace_s=60),
        [JobSpec("daily", "0 3 * * *", True, job)],
        store,
        events,
        guard=lambda: None,
    )
    sched.start()
    await asyncio.sleep(0.2)
    sched.shutdown()
    assert store.job_runs("daily")[0].outcome == "missed"
    assert "job_missed" in [e.kind for e in events.recent()]


async def test_load_guard_defers_then_runs(tmp_path: Path):
    store = StateStore(tmp_path / "a.db")
    busy = ["realtime traffic present", "realtime traffic present", None]
    outcomes: list[tuple[str, str]] = []
    ran: list[int] = []

    async def job() -> dict:
        ran.append(1)
        return {}

    sched = MaintenanceScheduler(
        _cfg(defer_retry_s=0.05, defer_max_retries=5),
        [JobSpec("j", "0 3 * * sun", True, job)],
        store,
        EventBus(),
        guard=lambda: busy.pop(0) if busy else None,
        on_outcome=lambda j, o: outcomes.append((j, o)),
    )
    sched.start()
    try:
        assert await sched.run_job("j", "schedule") == "deferred"
        for _ in range(100):
            if ran:
                break
            await asyncio.sleep(0.02)
    finally:
        sched.shutdown()
    assert ran == [1]
    assert [o for _, o in outcomes] == ["deferred", "deferred", "ok"]


async def test_guard_gives_up_after_max_retries(tmp_path: Path):
    store = StateStore(tmp_path / "a.db")
    events = EventBus()

    async def job() -> dict:
        raise AssertionError("must not run")

    sched = MaintenanceScheduler(
        _cfg(defer_max_retries=0),
        [JobSpec("j", "0 3 * * sun", True, job)],
        store,
        events,
        guard=lambda: "queue depth 9 > 4",
    )
    assert await sched.run_job("j", "schedule") == "skipped"
    assert store.job_runs("j")[0].outcome == "skipped"
    assert "job_skipped" in [e.kind for e in events.recent()]

    # forced runs skip the guard
    async def ok() -> dict:
        return {}

    sched2 = MaintenanceScheduler(
        _cfg(), [JobSpec("k", "0 3 * * sun", True, ok)], store, events, guard=lambda: "busy"
    )
    assert await sched2.run_job("k", "forced") == "ok"


async def test_failed_job_is_recorded_with_its_error(tmp_path: Path):
    store = StateStore(tmp_path / "a.db")

    async def boom() -> dict:
        raise RuntimeError("disk full")

    sched = MaintenanceScheduler(
        _cfg(), [JobSpec("j", "0 3 * * sun", True, boom)], store, EventBus(), guard=lambda: None
    )
    assert await sched.run_job("j") == "failed"
    run = store.job_runs("j")[0]
    assert run.outcome == "failed" and run.error == "RuntimeError: disk full"
    with pytest.raises(UnknownJob):
        await sched.run_job("nope")


def test_cron_validation_and_last_due():
    from datetime import UTC, datetime

    from pydantic import ValidationError

    with pytest.raises(ValidationError) as err:
        MaintenanceConfig(restart={"cron": "every sunday"}, timezone="Mars/Base")
    text = str(err.value)
    assert "restart.cron" in text.replace("\n", " ").replace(" ", ".") or "cron" in text
    assert "Mars/Base" in text
    trig = cron_trigger("0 3 * * sun", "UTC")
    due = last_due_between(
        trig, datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 20, tzinfo=UTC)
    )
    assert due == datetime(2026, 11, 15, 3, 0, tzinfo=UTC)
    assert (
        last_due_between(
            trig, datetime(2026, 11, 16, tzinfo=UTC), datetime(2026, 11, 20, tzinfo=UTC)
        )
        is None
    )


def _set_baseline(store: StateStore, job: str, ts_s: float) -> None:
    with store._tx() as cur:
        cur.execute(
            "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
            (f"job_baseline_s:{job}", repr(ts_s)),
        )


async def test_fresh_install_catches_nothing_up_but_records_a_baseline(tmp_path: Path):
    store = StateStore(tmp_path / "a.db")

    async def job() -> dict:
        raise AssertionError("must not run")

    sched = MaintenanceScheduler(
        _cfg(), [JobSpec("hourly", "0 * * * *", True, job)], store, EventBus(), guard=lambda: None
    )
    before = time.time()
    sched.start()
    await asyncio.sleep(0.1)
    sched.shutdown()
    assert store.job_runs("hourly") == []
    assert before - 1 <= float(store.meta("job_baseline_s:hourly") or 0) <= time.time()


async def test_never_run_job_catches_up_from_its_baseline(tmp_path: Path):
    # Installed 2.5 hours ago, the daemon went down before the hourly job's first run: that
    # first run is caught up once, not silently lost.
    store = StateStore(tmp_path / "a.db")
    _set_baseline(store, "hourly", time.time() - 2.5 * 3600)
    calls = await _start_hourly_and_wait(store)
    assert calls == [1]
    assert store.job_runs("hourly")[0].trigger == "catch_up"


async def test_never_run_job_past_grace_is_recorded_as_missed(tmp_path: Path):
    store = StateStore(tmp_path / "a.db")
    _set_baseline(store, "daily", time.time() - 3 * 86400)
    outcomes: list[tuple[str, str]] = []

    async def job() -> dict:
        raise AssertionError("must not run")

    sched = MaintenanceScheduler(
        _cfg(misfire_grace_s=60),
        [JobSpec("daily", "0 3 * * *", True, job)],
        store,
        EventBus(),
        guard=lambda: None,
        on_outcome=lambda j, o: outcomes.append((j, o)),
    )
    sched.start()
    await asyncio.sleep(0.1)
    sched.shutdown()
    run = store.job_runs("daily")[0]
    assert run.outcome == "missed" and run.details["late_s"] > 60
    assert outcomes == [("daily", "missed")]
    # A second start does not record the same miss again.
    sched2 = MaintenanceScheduler(
        _cfg(misfire_grace_s=60),
        [JobSpec("daily", "0 3 * * *", True, job)],
        store,
        EventBus(),
        guard=lambda: None,
    )
    sched2.start()
    await asyncio.sleep(0.1)
    sched2.shutdown()
    assert len(store.job_runs("daily")) == 1


async def test_run_missed_while_the_daemon_runs_is_recorded_and_counted(tmp_path: Path):
    # The guard defers the job; the loop then stalls past misfire_grace_s (a blocking call,
    # a suspended host), so APScheduler drops the retry: it must show in history and metrics.
    store = StateStore(tmp_path / "a.db")
    events = EventBus()
    outcomes: list[tuple[str, str]] = []
    busy = ["realtime traffic present"]

    async def job() -> dict:
        raise AssertionError("must not run")

    sched = MaintenanceScheduler(
        _cfg(misfire_grace_s=1, defer_retry_s=0.05, defer_max_retries=3),
        [JobSpec("j", "0 3 * * sun", True, job)],
        store,
        events,
        guard=lambda: busy.pop(0) if busy else None,
        on_outcome=lambda j, o: outcomes.append((j, o)),
    )
    sched.start()
    try:
        assert await sched.run_job("j", "schedule") == "deferred"
        time.sleep(1.6)  # block the loop past the grace time
        for _ in range(100):
            if ("j", "missed") in outcomes:
                break
            await asyncio.sleep(0.02)
    finally:
        sched.shutdown()
    assert outcomes == [("j", "deferred"), ("j", "missed")]
    run = store.job_runs("j")[0]
    assert run.outcome == "missed" and run.details["late_s"] > 1
    assert "deferred retry" in run.details["why"]
    assert "job_missed" in [e.kind for e in events.recent()]


async def test_run_while_already_running_is_recorded_and_counted(tmp_path: Path):
    store = StateStore(tmp_path / "a.db")
    outcomes: list[tuple[str, str]] = []
    release = asyncio.Event()

    async def slow() -> dict:
        await release.wait()
        return {}

    sched = MaintenanceScheduler(
        _cfg(),
        [JobSpec("j", "0 3 * * sun", True, slow)],
        store,
        EventBus(),
        guard=lambda: None,
        on_outcome=lambda j, o: outcomes.append((j, o)),
    )
    first = sched.spawn("j", "manual")
    await asyncio.sleep(0.05)
    assert sched.is_running("j")
    assert await sched.run_job("j", "schedule") == "skipped"
    release.set()
    assert await first == "ok"
    runs = store.job_runs("j")
    assert [r.outcome for r in runs] == ["skipped", "ok"]  # newest first
    assert runs[0].details == {"why": "already running"} and runs[0].trigger == "schedule"
    assert outcomes == [("j", "skipped"), ("j", "ok")]


async def test_deferrals_show_in_jobs_info(tmp_path: Path):
    store = StateStore(tmp_path / "a.db")

    async def job() -> dict:
        return {}

    sched = MaintenanceScheduler(
        _cfg(defer_retry_s=300, defer_max_retries=3),
        [JobSpec("j", "0 3 * * sun", True, job)],
        store,
        EventBus(),
        guard=lambda: "queue depth 9 > 4",
    )
    sched.start()
    try:
        assert sched.jobs_info()[0]["deferred"] is None
        assert await sched.run_job("j", "schedule") == "deferred"
        assert await sched.run_job("j", "schedule", attempt=1) == "deferred"
        info = sched.jobs_info()[0]
    finally:
        sched.shutdown()
    deferred = info["deferred"]
    assert deferred["count"] == 2 and deferred["attempt"] == 2
    assert deferred["last_reason"] == "queue depth 9 > 4" and deferred["retry_at"]
