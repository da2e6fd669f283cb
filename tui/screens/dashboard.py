"""Dashboard: GPUs on the left, engine, controller and queues on the right."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll

from tui.screens.base import ApplianceScreen
from tui.view_state import GpuHistory, Model
from tui.widgets.controller_panel import ControllerPanel
from tui.widgets.engine_panel import EnginePanel
from tui.widgets.gpu_panel import GpuPanel
from tui.widgets.queue_panel import QueuePanel


class DashboardScreen(ApplianceScreen):
    """The live overview."""

    TITLE_TEXT = "Dashboard"

    def compose_body(self) -> ComposeResult:
        with Horizontal(id="dash"):
            yield VerticalScroll(id="gpus")
            with VerticalScroll(id="right"):
                yield EnginePanel()
                yield ControllerPanel()
                yield QueuePanel()

    def show(self, model: Model) -> None:
        status = model.status or {}
        gpus = (status.get("telemetry") or {}).get("gpus") or []
        box = self.query_one("#gpus", VerticalScroll)
        have = {p.index: p for p in box.query(GpuPanel)}
        for gpu in gpus:
            index = int(gpu.get("index", 0))
            panel = have.get(index)
            if panel is None:
                panel = GpuPanel(index)
                box.mount(panel)
            panel.show(gpu, model.gpus.get(index, GpuHistory()))
        self.query_one(EnginePanel).show(model)
        self.query_one(ControllerPanel).show(status)
        self.query_one(QueuePanel).show(status)
