"""One GPU: core and HBM temperature against thresholds, power, clocks, utilisation, memory."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from tui import fmt
from tui.view_state import GpuHistory
from tui.widgets.labeled_sparkline import LabeledSparkline


class GpuPanel(Vertical):
    """A bordered box per GPU; sparklines carry the last two minutes."""

    def __init__(self, index: int) -> None:
        super().__init__(id=f"gpu-{index}", classes="panel gpu-panel")
        self.index = index
        self.border_title = f"GPU {index}"
        self._ready = False
        self._pending: tuple[dict[str, Any], GpuHistory] | None = None

    def compose(self) -> ComposeResult:
        yield LabeledSparkline("core", id="core")
        yield LabeledSparkline("HBM ", id="hbm")
        yield LabeledSparkline("power", id="power")
        yield Static("", classes="gpu-facts")

    def on_mount(self) -> None:
        # Children exist from here on; draw what arrived while the panel was being mounted.
        self._ready = True
        if self._pending is not None:
            self.show(*self._pending)

    def show(self, gpu: dict[str, Any], hist: GpuHistory) -> None:
        """Render the latest sample and its history."""
        if not self._ready:
            self._pending = (gpu, hist)
            return
        name = gpu.get("name") or f"GPU {self.index}"
        self.border_title = f"GPU {self.index}: {name}"[:38]
        if gpu.get("lost"):
            self.border_subtitle = "LOST"
        core, slow = gpu.get("core_temp_c"), gpu.get("slowdown_temp_c")
        mem, mem_max = gpu.get("mem_temp_c"), gpu.get("mem_max_temp_c")
        self.query_one("#core", LabeledSparkline).show(
            f"{fmt.num(core, '°C')}/{fmt.num(slow, '°C')}", hist.core_c, fmt.temp_style(core, slow)
        )
        self.query_one("#hbm", LabeledSparkline).show(
            f"{fmt.num(mem, '°C')}/{fmt.num(mem_max, '°C')}",
            hist.mem_c,
            fmt.temp_style(mem, mem_max),
        )
        self.query_one("#power", LabeledSparkline).show(
            f"{fmt.num(gpu.get('power_w'), ' W')}/{fmt.num(gpu.get('power_limit_w'), ' W')}",
            hist.power_w,
        )
        throttle = ",".join(gpu.get("throttle_reasons") or []) or "none"
        self.query_one(".gpu-facts", Static).update(
            f"util {fmt.num(gpu.get('gpu_util_pct'), '%')}  "
            f"SM {fmt.num(gpu.get('sm_clock_mhz'), ' MHz')}  "
            f"mem {fmt.num(gpu.get('mem_clock_mhz'), ' MHz')}\n"
            f"vram {fmt.gib(gpu.get('mem_used_bytes'))}/{fmt.gib(gpu.get('mem_total_bytes'))}"
            f"  throttle {throttle}"
        )
