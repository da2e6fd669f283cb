"""Usage: what each API key may do, what it runs now, and what it used over the last week."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from tui import fmt
from tui.screens.base import ApplianceScreen
from tui.view_state import Model

BAR_WIDTH = 30
# Statuses that got an answer; the rest were refused or failed.
ANSWERED = ("ok", "deadline")


def limits_text(key: dict[str, Any]) -> str:
    """A key's limits in a few characters: '60 rpm, 10k tpm, 50%'."""
    parts = []
    if key.get("requests_per_min"):
        parts.append(f"{key['requests_per_min']} rpm")
    if key.get("tokens_per_min"):
        parts.append(f"{key['tokens_per_min']} tpm")
    if key.get("concurrency_share"):
        parts.append(f"{round(key['concurrency_share'] * 100)}%")
    return ", ".join(parts) or "none"


def usage_rows(keys: dict[str, Any] | None, usage: dict[str, Any] | None) -> list[tuple[str, ...]]:
    """One row per key: the configured keys first (with their live counts), then any other
    caller the usage names (anonymous, refused callers)."""
    configured = {k["name"]: k for k in (keys or {}).get("keys", []) if isinstance(k, dict)}
    used = {u["key"]: u for u in (usage or {}).get("keys", []) if isinstance(u, dict)}
    rows = []
    for name in [*configured, *sorted(set(used) - set(configured))]:
        k, u = configured.get(name, {}), used.get(name, {})
        by_status = u.get("by_status") or {}
        refused = sum(n for s, n in by_status.items() if s not in ANSWERED)
        rows.append(
            (
                name,
                str((k.get("lanes") or [fmt.NA])[0]),
                limits_text(k) if k else fmt.NA,
                fmt.num(k.get("running")) if k else fmt.NA,
                fmt.num(k.get("queued")) if k else fmt.NA,
                fmt.num(u.get("requests", 0)),
                fmt.num(refused),
                fmt.num(u.get("prompt_tokens", 0)),
                fmt.num(u.get("completion_tokens", 0)),
            )
        )
    return rows


def token_bars(usage: dict[str, Any] | None) -> str:
    """Prompt and output tokens per key as bars against the biggest user."""
    found = [u for u in (usage or {}).get("keys", []) if isinstance(u, dict)]
    if not found:
        return "no requests in this span"
    top = max(u.get("prompt_tokens", 0) + u.get("completion_tokens", 0) for u in found) or 1
    lines = [f"tokens {usage.get('from', '')} .. {usage.get('to', '')}  (█ prompt ▒ output)"]
    for u in sorted(
        found, key=lambda u: -(u.get("prompt_tokens", 0) + u.get("completion_tokens", 0))
    ):
        prompt, out = u.get("prompt_tokens", 0), u.get("completion_tokens", 0)
        bar = "█" * round(prompt / top * BAR_WIDTH) + "▒" * round(out / top * BAR_WIDTH)
        lines.append(f"{u['key'][:16]:<16} {bar:<{BAR_WIDTH}} {prompt + out:>9}")
    return "\n".join(lines)


class UsageScreen(ApplianceScreen):
    """The keys and their use; refetched every poll while it shows."""

    TITLE_TEXT = "Usage"

    def compose_body(self) -> ComposeResult:
        yield Static("", id="usage-note")
        with VerticalScroll(id="usage"):
            yield DataTable(id="usage-table", cursor_type="row")
            yield Static("", id="usage-bars", classes="panel")

    def on_mount(self) -> None:
        self.query_one("#usage-table", DataTable).add_columns(
            "key", "lane", "limits", "run", "queue", "requests", "refused", "prompt", "output"
        )
        self.query_one("#usage-bars", Static).border_title = "tokens per key, last 7 days"
        self._drawn: list[tuple[str, ...]] | None = None
        self.set_interval(self.tui.refresh_s, self._refetch)

    def _refetch(self) -> None:
        if self.is_current:
            self.tui.load_usage()

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        self.tui.load_usage()

    def show(self, model: Model) -> None:
        note = model.usage_error or ""
        if model.keys is not None and model.keys.get("open"):
            note = note or "no API keys: /v1 is open to anyone who reaches the port"
        self.query_one("#usage-note", Static).update(note)
        rows = usage_rows(model.keys, model.usage)
        if rows != self._drawn:
            self._drawn = rows
            table = self.query_one("#usage-table", DataTable)
            table.clear()
            for row in rows:
                table.add_row(*row)
        self.query_one("#usage-bars", Static).update(token_bars(model.usage))
