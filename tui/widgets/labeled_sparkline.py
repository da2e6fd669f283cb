"""A one-line label with the latest value next to a sparkline of its history."""

from __future__ import annotations

from collections.abc import Iterable

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, Sparkline


class LabeledSparkline(Horizontal):
    """`label value ▁▂▃▅` in one row."""

    def __init__(self, label: str, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="spark-row")
        self._label = label

    def compose(self) -> ComposeResult:
        yield Label(self._label, classes="spark-label")
        yield Label("n/a", classes="spark-value")
        yield Sparkline([], summary_function=max)

    def show(self, value: str, history: Iterable[float], style: str = "") -> None:
        """Update the value text and the history."""
        value_label = self.query_one(".spark-value", Label)
        value_label.update(f"[{style}]{value}[/]" if style else value)
        self.query_one(Sparkline).data = list(history)
