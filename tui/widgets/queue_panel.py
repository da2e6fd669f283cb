"""Queue depth per lane against its capacity, and what runs per lane."""

from __future__ import annotations

from typing import Any

from textual.widgets import Static

from tui import fmt

LANES = ("realtime", "interactive", "batch")


class QueuePanel(Static):
    """One line per priority lane."""

    def __init__(self) -> None:
        super().__init__("", id="queues", classes="panel")
        self.border_title = "Queues"

    def show(self, status: dict[str, Any]) -> None:
        """Render from a status snapshot."""
        adm = status.get("admission") or {}
        caps = fmt.get(status, "config", "queue_capacity") or {}
        lines = []
        for lane in LANES:
            queued = fmt.get(adm, "queued", lane)
            lines.append(
                f"{lane:<11} queued {fmt.num(queued):>3}/{fmt.num(caps.get(lane)):<4}"
                f" run {fmt.num(fmt.get(adm, 'running', lane))}"
            )
        self.update("\n".join(lines))
