"""Maintenance jobs: schedule, next run, recent outcomes; run one now after a confirmation.
The threshold sets: the one in force and the earlier ones, with a rollback (asked first)."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Button, DataTable, Static

from tui import fmt
from tui.screens.base import ApplianceScreen
from tui.view_state import Model

HISTORY_SHOWN = 6


def job_list(payload: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Jobs from /admin/jobs, whether it answers {jobs: [...]}, {jobs: {name: ...}} or a list."""
    if not payload:
        return []
    jobs = payload.get("jobs", payload.get("items", []))
    if isinstance(jobs, dict):
        jobs = [{"name": k, **(v if isinstance(v, dict) else {})} for k, v in jobs.items()]
    return [j for j in jobs if isinstance(j, dict) and j.get("name")]


def runs_newest_first(job: dict[str, Any]) -> list[dict[str, Any]]:
    """A job's runs, newest first, as the daemon sends them (its store reads ORDER BY id DESC)."""
    runs = job.get("history") or job.get("runs") or []
    if not runs and isinstance(job.get("last_run"), dict):
        runs = [job["last_run"]]
    return [r for r in runs if isinstance(r, dict)]


def job_row(job: dict[str, Any]) -> tuple[str, ...]:
    """One table row: name, schedule, next run, and the newest run's start and outcome."""
    runs = runs_newest_first(job)
    last = runs[0] if runs else {}
    next_run = (
        fmt.when(job["next_run_s"])
        if job.get("next_run_s")
        else str(job.get("next_run") or fmt.NA)[:19]
    )
    return (
        str(job["name"]),
        str(job.get("schedule") or job.get("cron") or fmt.NA)[:24],
        next_run,
        fmt.when(last.get("started_s")),
        str(last.get("outcome", fmt.NA)),
    )


def history_text(job: dict[str, Any]) -> str:
    """The newest runs of a job, newest on top."""
    lines = [f"[b]{job['name']}[/] history, newest first"]
    for run in runs_newest_first(job)[:HISTORY_SHOWN]:
        err = f"  {run['error']}" if run.get("error") else ""
        lines.append(
            f"{fmt.when(run.get('started_s'))}  {run.get('trigger', ''):<9}"
            f" {run.get('outcome', fmt.NA)}{err}"[:78]
        )
    return "\n".join(lines)


THRESHOLD_KEYS = (
    ("derate_core_c", "derate at", " °C"),
    ("protect_mem_c", "protect HBM at", " °C"),
    ("slo_ttft_p99_s", "SLO p99 TTFT", " s"),
)


def _set_text(data: dict[str, Any]) -> str:
    return ", ".join(
        f"{label} {fmt.num(data.get(key), unit, 1)}"
        for key, label, unit in THRESHOLD_KEYS
        if key in data
    )


def thresholds_text(payload: dict[str, Any] | None) -> str:
    """The set in force and the earlier ones (rollback targets), newest first."""
    if not payload:
        return "thresholds: not loaded"
    active = payload.get("active") or {}
    lines = [
        f"[b]thresholds[/] in force: set {active.get('id') or '-'} from "
        f"{active.get('source', fmt.NA)}: {_set_text(active.get('data') or {})}"
    ]
    previous = payload.get("previous") or []
    for entry in previous[:3]:
        lines.append(
            f"  earlier set {entry.get('id')} ({fmt.when(entry.get('ts_s'))}, "
            f"{entry.get('source', '')}): {_set_text(entry.get('data') or {})}"[:110]
        )
    if not previous:
        lines.append("  no earlier set: nothing to roll back to")
    return "\n".join(lines)


class MaintenanceScreen(ApplianceScreen):
    """Enter on a job asks, then runs it through POST /admin/jobs/{name}/run."""

    TITLE_TEXT = "Maintenance"

    def compose_body(self) -> ComposeResult:
        yield Static("", id="jobs-note")
        yield DataTable(id="jobs", cursor_type="row")
        yield Static("", id="job-history")
        yield Static("", id="thresholds")
        with Horizontal(classes="button-row"):
            yield Button("Roll back thresholds", id="rollback", variant="warning")

    def on_mount(self) -> None:
        table = self.query_one("#jobs", DataTable)
        table.add_columns("job", "schedule", "next run", "last", "outcome")
        self._names: list[str] = []
        self._drawn: list[dict[str, Any]] | None = None
        self._note: str | None = None
        self._history: str | None = None
        self._thresholds: str | None = None
        self._job_events = self.tui.model.job_events

    def on_screen_resume(self) -> None:
        self._job_events = self.tui.model.job_events  # the load below covers them
        super().on_screen_resume()
        self.tui.load_jobs()
        self.tui.load_thresholds()

    def show(self, model: Model) -> None:
        if model.job_events != self._job_events:
            # A job started or finished: fetch the history again (it redraws when it lands).
            self._job_events = model.job_events
            self.tui.load_jobs()
            self.tui.load_thresholds()  # a recalibration may have made a new set
        thr = model.thresholds_error or thresholds_text(model.thresholds)
        if thr != self._thresholds:
            self._thresholds = thr
            self.query_one("#thresholds", Static).update(thr)
        jobs = job_list(model.jobs)
        note = model.jobs_error or ("" if jobs else "no jobs reported")
        if note != self._note:
            self._note = note
            self.query_one("#jobs-note", Static).update(note)
        if jobs == self._drawn:
            return  # nothing changed: every poll lands here, so leave the table alone
        self._drawn = jobs
        table = self.query_one("#jobs", DataTable)
        cursor = table.cursor_row
        table.clear()
        self._names = [str(job["name"]) for job in jobs]
        for job in jobs:
            table.add_row(*job_row(job))
        if self._names:
            table.move_cursor(row=min(cursor, len(self._names) - 1))
            self._show_history(jobs[table.cursor_row])
        elif self._history:
            self._history = ""
            self.query_one("#job-history", Static).update("")

    def _show_history(self, job: dict[str, Any]) -> None:
        text = history_text(job)
        if text != self._history:
            self._history = text
            self.query_one("#job-history", Static).update(text)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        jobs = job_list(self.tui.model.jobs)
        if 0 <= event.cursor_row < len(jobs):
            self._show_history(jobs[event.cursor_row])

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if 0 <= event.cursor_row < len(self._names):
            self.tui.confirm_run_job(self._names[event.cursor_row])

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "rollback":
            self.tui.confirm_rollback_thresholds()
