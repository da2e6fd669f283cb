"""Engine state, running/waiting, KV-cache gauge, tokens/s and TTFT/TPOT percentiles."""

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
            f"  in flight {fmt.num(fmt.get(status, 'admission', 'in_flight'))}"
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
