"""Engine state, running/waiting, availability and error budget, KV-cache gauge, tokens/s
and TTFT/TPOT percentiles."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, ProgressBar, Static

from tui import fmt
from tui.view_state import Model
from tui.widgets.labeled_sparkline import LabeledSparkline

_STATE_STYLE = {"ready": "bold green", "paused": "bold yellow", "engine_dead": "bold red"}


class EnginePanel(Vertical):
    """The engine box of the dashboard."""

    def __init__(self) -> None:
        super().__init__(id="engine", classes="panel")
        self.border_title = "Engine"

    def compose(self) -> ComposeResult:
        yield Static("", id="engine-state")
        with Horizontal(classes="spark-row"):
            yield Label("KV", classes="spark-label")
            yield ProgressBar(total=100, show_eta=False, id="kv")
        yield LabeledSparkline("tok/s", id="toks")
        yield LabeledSparkline("TTFT", id="ttft")
        yield LabeledSparkline("TPOT", id="tpot")

    def show(self, model: Model) -> None:
        """Render from the model's latest status and histories."""
        status = model.status or {}
        engine: dict[str, Any] = status.get("engine") or {}
        state = str(engine.get("state", fmt.NA))
        style = _STATE_STYLE.get(state, "bold yellow")
        stats = engine.get("stats") or {}
        self.query_one("#engine-state", Static).update(
            f"[{style}]{state.upper()}[/]  {engine.get('model') or ''}\n"
            f"running {fmt.num(stats.get('running'))}  waiting {fmt.num(stats.get('waiting'))}"
            f"  in flight {fmt.num(fmt.get(status, 'admission', 'in_flight'))}\n"
            f"{availability_line(status.get('availability'))}"
        )
        kv = stats.get("kv_cache_usage_ratio")
        self.query_one("#kv", ProgressBar).update(
            progress=round(kv * 100, 1) if isinstance(kv, int | float) else 0
        )
        toks = model.tokens_per_s
        self.query_one("#toks", LabeledSparkline).show(
            fmt.num(toks[-1], "", 1) if toks else fmt.NA, toks
        )
        lat = model.latest_latency
        for key in ("ttft", "tpot"):
            self.query_one(f"#{key}", LabeledSparkline).show(
                f"{fmt.seconds(lat.get(f'{key}_p50_s'))}/"
                f"{fmt.seconds(lat.get(f'{key}_p99_s'))} p99",
                model.latency[f"{key}_p99_s"],
            )


def availability_line(avail: Any) -> str:
    """`avail 1d 99.95%  7d …` and `30d …  budget 62%` (two lines: the panel is narrow): the
    SLO from the daemon's own history; the budget turns yellow under a quarter left and red
    once overspent."""
    if not isinstance(avail, dict):
        return f"avail {fmt.NA}"
    windows = avail.get("windows") or {}
    parts = [
        f"{name} {fmt.num(_pct(fmt.get(windows, name, 'ratio')), '%', 2)}"
        for name in ("1d", "7d", "30d")
    ]
    left = fmt.get(avail, "budget", "remaining_ratio")
    style = "" if not isinstance(left, int | float) else _budget_style(left)
    budget = fmt.num(_pct(left), "%", 0)
    budget = f"[{style}]{budget}[/]" if style else budget
    return f"avail {parts[0]}  {parts[1]}\n      {parts[2]}  budget {budget}"


def _pct(ratio: Any) -> float | None:
    return ratio * 100 if isinstance(ratio, int | float) else None


def _budget_style(left: float) -> str:
    if left < 0:
        return "bold red"
    return "yellow" if left < 0.25 else "green"
