"""Benchmarks: throughput and P99 TTFT against concurrency, the knee marked; past runs; the
selected run's knee, best score or a Pareto level made the controller's ceiling (asked first)."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Button, DataTable, Input, Static

from tui import fmt
from tui.screens.base import ApplianceScreen
from tui.view_state import Model

BAR_WIDTH = 24


def runs(payload: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Runs from /admin/benchmarks, newest first: {benchmarks: [...]} or a bare list."""
    if not payload:
        return []
    found = payload.get("benchmarks", payload.get("runs", payload.get("items", [])))
    return [r for r in found if isinstance(r, dict)]


def _result(run: dict[str, Any]) -> dict[str, Any]:
    result = run.get("result")
    return result if isinstance(result, dict) else run


def _scores(result: dict[str, Any]) -> dict[int, float]:
    scores = result.get("scores")
    if isinstance(scores, dict):
        scores = scores.get("scores")
    out: dict[int, float] = {}
    for s in scores or []:
        if isinstance(s, dict) and isinstance(s.get("score"), int | float):
            out[int(s.get("concurrency", 0))] = float(s["score"])
    return out


def curve(result: dict[str, Any]) -> str:
    """Text bars of throughput and P99 TTFT per concurrency level, the knee marked."""
    # The daemon stores `levels[].point` (appliance bench's JSON); `points` is accepted too.
    raw = result.get("points") or [
        lv.get("point") for lv in result.get("levels") or [] if isinstance(lv, dict)
    ]
    points = sorted(
        (p for p in raw if isinstance(p, dict)),
        key=lambda p: p.get("concurrency", 0),
    )
    if not points:
        return "no sweep points in this run"
    knee = fmt.get(result, "knee", "concurrency")
    pareto = set(result.get("pareto") or result.get("pareto_front") or [])
    scores = _scores(result)
    top_tok = max(float(p.get("output_tok_s") or 0) for p in points) or 1.0
    top_p99 = max(float(p.get("ttft_p99_s") or 0) for p in points) or 1.0
    lines = [" conc   tok/s  throughput" + " " * (BAR_WIDTH - 10) + "  p99 TTFT  score"]
    for p in points:
        conc = p.get("concurrency")
        tok = float(p.get("output_tok_s") or 0)
        p99 = float(p.get("ttft_p99_s") or 0)
        bar = "█" * max(1, round(tok / top_tok * BAR_WIDTH))
        lat = "▮" * max(1, round(p99 / top_p99 * 8))
        mark = "◆" if conc == knee else ("·" if conc in pareto else " ")
        score = scores.get(int(conc or 0))
        lines.append(
            f"{mark}{conc:>4} {tok:>7.1f}  {bar:<{BAR_WIDTH}}  {fmt.seconds(p99):>8} "
            f"{lat:<8} {fmt.num(score, '', 2)}"
        )
    reason = fmt.get(result, "knee", "reason") or result.get("reason") or ""
    lines.append(f"◆ knee at {fmt.num(knee)}   · Pareto front   {reason}"[:120])
    limit = result.get("recommended_limit", result.get("knee_limit"))
    if limit is not None:
        lines.append(f"recommended limit {limit}")
    return "\n".join(lines)


class BenchmarksScreen(ApplianceScreen):
    """Pick a run on the left; its curve shows on the right."""

    TITLE_TEXT = "Benchmarks"

    def compose_body(self) -> ComposeResult:
        yield Static("", id="bench-note")
        with Horizontal(classes="button-row", id="bench-actions"):
            yield Button("Knee as ceiling", id="apply-knee")
            yield Button("Best score", id="apply-score")
            yield Input(placeholder="level", id="pareto-level", type="integer")
            yield Button("Pareto level", id="apply-level")
        with VerticalScroll(id="bench"):
            yield DataTable(id="runs", cursor_type="row")
            yield Static("", id="curve", classes="panel")

    def on_mount(self) -> None:
        self.query_one("#runs", DataTable).add_columns("when", "source", "knee", "limit")
        self.query_one("#curve", Static).border_title = "throughput / P99 vs concurrency"
        self._drawn: list[dict[str, Any]] | None = None
        self._note: str | None = None
        self._job_events = self.tui.model.job_events

    def on_screen_resume(self) -> None:
        self._job_events = self.tui.model.job_events  # the load below covers them
        super().on_screen_resume()
        self.tui.load_benchmarks()

    def show(self, model: Model) -> None:
        if model.job_events != self._job_events:
            # A job finished (perhaps the re-benchmark): fetch the stored runs again.
            self._job_events = model.job_events
            self.tui.load_benchmarks()
        found = runs(model.benchmarks)
        note = model.benchmarks_error or ("" if found else "no benchmark runs stored")
        if note != self._note:
            self._note = note
            self.query_one("#bench-note", Static).update(note)
        if found == self._drawn:
            return  # nothing changed: every poll lands here, so leave the table alone
        self._drawn = found
        table = self.query_one("#runs", DataTable)
        cursor = table.cursor_row
        table.clear()
        for run in found:
            result = _result(run)
            table.add_row(
                fmt.when(run.get("ts_s")),
                str(run.get("source", ""))[:12],
                fmt.num(fmt.get(result, "knee", "concurrency")),
                fmt.num(result.get("recommended_limit", result.get("knee_limit"))),
            )
        if found:
            row = min(cursor, len(found) - 1)
            table.move_cursor(row=row)
            self.query_one("#curve", Static).update(curve(_result(found[row])))
        else:
            self.query_one("#curve", Static).update("")

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        found = runs(self.tui.model.benchmarks)
        if 0 <= event.cursor_row < len(found):
            self.query_one("#curve", Static).update(curve(_result(found[event.cursor_row])))

    def _selected_id(self) -> int | None:
        found = runs(self.tui.model.benchmarks)
        row = self.query_one("#runs", DataTable).cursor_row
        run_id = found[row].get("id") if 0 <= row < len(found) else None
        return run_id if isinstance(run_id, int) else None

    def on_button_pressed(self, event: Button.Pressed) -> None:
        button = event.button.id or ""
        if not button.startswith("apply-"):
            return
        run_id = self._selected_id()
        if run_id is None:
            self.notify("no benchmark run selected", severity="warning")
            return
        if button == "apply-knee":
            self.tui.confirm_apply_benchmark(run_id, {"objective": "knee"})
        elif button == "apply-score":
            self.tui.confirm_apply_benchmark(run_id, {"objective": "score"})
        else:
            self._apply_level(run_id)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        run_id = self._selected_id()
        if event.input.id == "pareto-level" and run_id is not None:
            self._apply_level(run_id)

    def _apply_level(self, run_id: int) -> None:
        text = self.query_one("#pareto-level", Input).value.strip()
        if not text.isdigit() or int(text) < 1:
            self.notify(f"level: a level of the Pareto front (·), got {text!r}", severity="error")
            return
        self.tui.confirm_apply_benchmark(run_id, {"objective": "level", "level": int(text)})
