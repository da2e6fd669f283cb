"""Maintenance jobs: schedule, next run, recent outcomes; run one now after a confirmation."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.widgets import DataTable, Static

from tui import fmt
from tui.model import Model
from tui.screens.base import ApplianceScreen


def job_list(payload: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Jobs from /admin/jobs, whether it answers {jobs: [...]}, {jobs: {name: ...}} or a list."""
    if not payload:
        return []
    jobs = payload.get("jobs", payload.get("items", []))
    if isinstance(jobs, dict):
        jobs = [{"name": k, **(v if isinstance(v, dict) else {})} for k, v in jobs.items()]
    return [j for j in jobs if isinstance(j, dict) and j.get("name")]


def _runs(job: dict[str, Any]) -> list[dict[str, Any]]:
    runs = job.get("history") or job.get("runs") or []
    if not runs and isinstance(job.get("last_run"), dict):
        runs = [job["last_run"]]
    return [r for r in runs if isinstance(r, dict)]


class MaintenanceScreen(ApplianceScreen):
    """Enter on a job asks, then runs it through POST /admin/jobs/{name}/run."""

    TITLE_TEXT = "Maintenance"

    def compose_body(self) -> ComposeResult:
        yield Static("", id="jobs-note")
        yield DataTable(id="jobs", cursor_type="row")
        yield Static("", id="job-history")

    def on_mount(self) -> None:
        table = self.query_one("#jobs", DataTable)
        table.add_columns("job", "schedule", "next run", "last", "outcome")
        self._names: list[str] = []

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        self.tui.load_jobs()

    def show(self, model: Model) -> None:
        note = self.query_one("#jobs-note", Static)
        jobs = job_list(model.jobs)
        note.update(model.jobs_error or ("" if jobs else "no jobs reported"))
        table = self.query_one("#jobs", DataTable)
        cursor = table.cursor_row
        table.clear()
        self._names = []
        for job in jobs:
            runs = _runs(job)
            last = runs[-1] if runs else {}
            table.add_row(
                str(job["name"]),
                str(job.get("schedule") or job.get("cron") or fmt.NA)[:24],
                fmt.when(job.get("next_run_s")) if job.get("next_run_s") else
                str(job.get("next_run") or fmt.NA)[:19],
                fmt.when(last.get("started_s")),
                str(last.get("outcome", fmt.NA)),
            )
            self._names.append(str(job["name"]))
        if self._names:
            table.move_cursor(row=min(cursor, len(self._names) - 1))
            self._show_history(jobs[table.cursor_row])

    def _show_history(self, job: dict[str, Any]) -> None:
        lines = [f"[b]{job['name']}[/] history"]
        for run in _runs(job)[-6:]:
            err = f"  {run['error']}" if run.get("error") else ""
            lines.append(
                f"{fmt.when(run.get('started_s'))}  {run.get('trigger', ''):<9}"
                f" {run.get('outcome', fmt.NA)}{err}"[:78]
            )
        self.query_one("#job-history", Static).update("\n".join(lines))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        jobs = job_list(self.tui.model.jobs)
        if 0 <= event.cursor_row < len(jobs):
            self._show_history(jobs[event.cursor_row])

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if 0 <= event.cursor_row < len(self._names):
            self.tui.confirm_run_job(self._names[event.cursor_row])
