"""Screen behaviour against fixed data (the snapshot stub): ordering, live updates, redraws."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from textual.widgets import DataTable, Static

from tests.tui.test_tui_snapshots import JOBS, T0, StubClient, make_app
from tui import fmt
from tui.app import ApplianceTui
from tui.screens import events as events_screen


async def _until(pilot: Any, cond: Any, tries: int = 100) -> None:
    for _ in range(tries):
        if cond():
            return
        await pilot.pause(0.02)
    raise AssertionError("condition not met")


def _count_clears(table: DataTable[Any]) -> list[int]:
    calls: list[int] = []
    real = table.clear

    def clear(*a: Any, **kw: Any) -> Any:
        calls.append(1)
        return real(*a, **kw)

    table.clear = clear  # type: ignore[method-assign]
    return calls


class ManyRuns(StubClient):
    """A job with eight runs, newest first as the daemon sends them."""

    async def jobs(self) -> dict[str, Any]:
        history = [
            {
                "started_s": T0 - 3600 * i,
                "trigger": "manual",
                "outcome": "ok" if i == 0 else f"old{i}",
            }
            for i in range(8)
        ]
        return {"jobs": [{"name": "restart", "schedule": "cron", "history": history}]}


async def test_maintenance_shows_the_newest_run_and_history() -> None:
    app = ApplianceTui(ManyRuns(), refresh_s=3600)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("j")
        table = app.screen.query_one("#jobs", DataTable)
        await _until(pilot, lambda: table.row_count == 1)
        row = table.get_row_at(0)
        assert row[3] == fmt.when(T0) and row[4] == "ok"
        shown = str(app.screen.query_one("#job-history", Static).render())
        lines = shown.splitlines()[1:]
        assert len(lines) == 6
        assert lines[0].startswith(fmt.when(T0)) and lines[0].endswith("ok")
        assert "old5" in lines[-1] and "old6" not in shown and "old7" not in shown


async def test_maintenance_table_reads_the_fixture_newest_first() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("j")
        table = app.screen.query_one("#jobs", DataTable)
        await _until(pilot, lambda: table.row_count == 2)
        assert table.get_row_at(0)[3:] == [fmt.when(T0 - 600), "ok"]
        assert table.get_row_at(1)[3:] == [fmt.when(T0 - 7200), "skipped"]


async def test_events_keep_coming_past_rows_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events_screen, "ROWS_SHOWN", 3)
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await _until(pilot, lambda: app.model.status is not None)
        await pilot.press("e")
        table = app.screen.query_one("#events", DataTable)
        await _until(pilot, lambda: table.row_count == 3)
        for seq in range(4, 9):
            app.model.add_event(
                {"seq": seq, "ts_s": T0 + seq, "kind": "controller", "reason": f"move {seq}"}
            )
            app.refresh_view()
            await pilot.pause()
            assert table.row_count == 3
            assert table.get_row_at(2)[3] == f"move {seq}"


async def test_maintenance_and_benchmarks_redraw_only_on_change() -> None:
    app = make_app()
    async with app.run_test(size=(100, 24)) as pilot:
        await _until(pilot, lambda: app.model.status is not None)
        await pilot.press("j")
        await _until(pilot, lambda: app.model.jobs is not None)
        await pilot.pause(0.1)
        jobs = app.screen.query_one("#jobs", DataTable)
        clears = _count_clears(jobs)
        for _ in range(5):
            app.refresh_view()  # what every poll does
        assert clears == []
        changed = copy.deepcopy(JOBS)
        changed["jobs"][0]["history"].insert(
            0, {"started_s": T0, "trigger": "manual", "outcome": "failed"}
        )
        app.model.jobs = changed
        app.refresh_view()
        assert clears == [1]
        assert jobs.get_row_at(0)[4] == "failed"

        await pilot.press("b")
        await _until(pilot, lambda: app.model.benchmarks is not None)
        await pilot.pause(0.1)
        runs = app.screen.query_one("#runs", DataTable)
        clears = _count_clears(runs)
        for _ in range(5):
            app.refresh_view()
        assert clears == []
        assert app.model.benchmarks is not None
        app.model.benchmarks = {"benchmarks": app.model.benchmarks["benchmarks"][:1]}
        app.refresh_view()
        assert clears == [1] and runs.row_count == 1


async def test_a_job_event_refetches_the_jobs() -> None:
    app = make_app()
    client: StubClient = app.client  # type: ignore[assignment]
    async with app.run_test(size=(80, 24)) as pilot:
        await _until(pilot, lambda: app.model.status is not None)
        await pilot.press("j")
        await _until(pilot, lambda: app.model.jobs is not None)
        fetched: list[int] = []
        real = client.jobs

        async def jobs() -> dict[str, Any]:
            fetched.append(1)
            return await real()

        client.jobs = jobs  # type: ignore[method-assign]
        app.refresh_view()
        await pilot.pause(0.1)
        assert fetched == []
        app.model.add_event({"seq": 99, "ts_s": T0, "kind": "job_finished", "reason": "done"})
        app.refresh_view()
        await _until(pilot, lambda: fetched == [1])


class Shedding(StubClient):
    """Auto mode with a prefill budget, shedding what would start past 5 s."""

    async def status(self) -> dict[str, Any]:
        status = await super().status()
        status["controller"]["prefill"] = {
            "budget_tokens": 1800,
            "outstanding_tokens": 1500,
            "rate_tok_s": 720.4,
            "shed_above_s": 5.0,
            "shed_total": 42,
        }
        return status


async def test_dashboard_shows_the_prefill_budget_and_what_was_shed() -> None:
    from tui.widgets.controller_panel import ControllerPanel

    app = ApplianceTui(Shedding(), refresh_s=3600)
    async with app.run_test(size=(120, 40)) as pilot:
        panel = app.screen.query_one(ControllerPanel)
        await _until(pilot, lambda: "shed" in str(panel.render()))
        shown = str(panel.render())
        assert "prefill 1500 / 1800 tok" in shown and "shed 42 (TTFT > 5" in shown, shown
