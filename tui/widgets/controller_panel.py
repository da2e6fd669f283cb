"""The concurrency controller: limit, bounds, mode, derate level and its last decisions."""

from __future__ import annotations

from typing import Any

from textual.widgets import Static

from tui import fmt

DECISIONS_SHOWN = 4


def _decisions(status: dict[str, Any]) -> list[dict[str, Any]]:
    ctl = status.get("controller") or {}
    found = ctl.get("decisions") or ctl.get("last_decisions") or []
    if not found:
        # Without a controller section, the thermal and controller events carry the reasons.
        found = [
            e for e in status.get("events") or [] if e.get("kind") in ("thermal", "controller")
        ]
    return [d for d in found if isinstance(d, dict)][-DECISIONS_SHOWN:]


class ControllerPanel(Static):
    """Limit and its reasons; reads 'n/a' where the daemon has no controller yet."""

    def __init__(self) -> None:
        super().__init__("", id="controller", classes="panel")
        self.border_title = "Controller"

    def show(self, status: dict[str, Any]) -> None:
        """Render from a status snapshot."""
        ctl = status.get("controller") or {}
        adm = status.get("admission") or {}
        thermal = fmt.get(status, "telemetry", "thermal") or {}
        mode = ctl.get("mode", fmt.NA)
        lo = ctl.get("min", ctl.get("min_limit"))
        hi = ctl.get("max", ctl.get("max_limit"))
        level = str(thermal.get("level", fmt.NA))
        level_style = "green" if level == "normal" else "bold red"
        lines = [
            f"limit [b]{fmt.num(adm.get('limit', ctl.get('limit')))}[/] "
            f"(base {fmt.num(adm.get('base_limit'))})  bounds {fmt.num(lo)}..{fmt.num(hi)}"
            f"  mode [b]{mode}[/]",
            f"thermal [{level_style}]{level}[/] x{fmt.num(thermal.get('factor'), '', 2)}"
            + ("  [bold red]PROTECT[/]" if adm.get("protect") else ""),
        ]
        prefill = ctl.get("prefill")
        if isinstance(prefill, dict):
            budget = prefill.get("budget_tokens")
            lines.append(
                f"prefill {fmt.num(prefill.get('outstanding_tokens'))} / "
                + (f"[b]{fmt.num(budget)}[/] tok" if budget else "no budget")
                + (
                    f" at {fmt.num(prefill.get('rate_tok_s'))} tok/s"
                    if prefill.get("rate_tok_s")
                    else ""
                )
                + (
                    f"  shed {fmt.num(prefill.get('shed_total'))} (TTFT > "
                    f"{fmt.num(prefill.get('shed_above_s'))} s)"
                    if prefill.get("shed_above_s")
                    else ""
                )
            )
        for d in _decisions(status):
            reason = str(d.get("reason", ""))
            lines.append(f"{fmt.clock(d.get('ts_s'))} {reason}"[:76])
        self.update("\n".join(lines))
