"""`appliance status`: a one-shot snapshot from the running daemon's admin API."""

from __future__ import annotations

import argparse
import json
from typing import Any

from appliance.client import SyncAdminClient, add_daemon_arguments
from appliance.commands._admin import run_against_daemon
from appliance.commands._subparsers import add_command


def register(sub: Any) -> None:
    """Add `status [--json] [--config PATH] [--url URL] [--token-file PATH]`."""
    p = add_command(
        sub, "status", run, add_daemon_arguments, help="one-shot snapshot from the running daemon"
    )
    p.add_argument("--json", action="store_true", help="print the snapshot as JSON")


def run(args: argparse.Namespace) -> int:
    """Print the snapshot; 1 when the daemon cannot be asked."""

    def show(client: SyncAdminClient) -> int:
        snap = client.run(lambda c: c.status())
        print(json.dumps(snap, indent=2) if args.json else render(snap))
        return 0

    return run_against_daemon(args, show)


def _gpu_line(g: dict[str, Any]) -> str:
    if g.get("lost"):
        return f"gpu{g['index']}       LOST ({g.get('uuid')})"
    return (
        f"gpu{g['index']}       {g.get('name')}  core {g.get('core_temp_c')} C  "
        f"HBM {g.get('mem_temp_c')} C  power {g.get('power_w')} W  "
        f"util {g.get('gpu_util_pct')} %"
    )


def _pct(ratio: Any, digits: int) -> str:
    return "n/a" if not isinstance(ratio, int | float) else f"{ratio * 100:.{digits}f} %"


def availability_line(avail: dict[str, Any] | None) -> str:
    """Availability over 1, 7 and 30 days and the 30-day error budget left, from the
    daemon's own history (n/a: no requests and no readiness time recorded yet)."""
    if not avail:
        return "available  n/a (the daemon reports no availability)"
    windows = avail.get("windows") or {}
    parts = "  ".join(f"{w} {_pct((windows.get(w) or {}).get('ratio'), 3)}" for w in windows)
    budget = avail.get("budget") or {}
    return (
        f"available  {parts}  budget left {_pct(budget.get('remaining_ratio'), 1)} "
        f"of 30 d (objective {_pct(avail.get('objective'), 1)})"
    )


def render(snap: dict[str, Any]) -> str:
    """The snapshot as a few lines: engine, admission, controller, thermal, availability,
    GPUs, energy."""
    eng, adm = snap["engine"], snap["admission"]
    stats = eng.get("stats") or {}
    ctl = snap.get("controller") or {}
    tel = snap.get("telemetry") or {}
    thermal = tel.get("thermal") or {}
    badge = "  SIMULATED" if tel.get("simulated") else ""
    lines = [
        f"engine     {eng['state']}  model {eng['model']}  device {eng.get('device', '?')}",
        f"kv cache   {eng.get('kv_cache_tokens')} tokens, "
        f"usage {stats.get('kv_cache_usage_ratio', 0):.1%}",
        f"admission  limit {adm['limit']}  in flight {adm['in_flight']}  queued {adm['queued']}",
        f"restarts   {eng.get('restarts_total')}  uptime {snap['uptime_s']:.0f} s",
        f"controller {ctl.get('mode')}  limit {adm['base_limit']} in [{ctl.get('min')}, "
        f"{ctl.get('max')}]  SLO p99 TTFT {ctl.get('slo_ttft_p99_s')} s, "
        f"TPOT {ctl.get('slo_tpot_p99_s')} s",
        f"thermal    {thermal.get('level')}  derate x{thermal.get('factor', 1):.2f}  "
        f"source {tel.get('source')}{badge}",
    ]
    lines.append(availability_line(snap.get("availability")))
    lines += [_gpu_line(g) for g in tel.get("gpus") or []]
    per_token = (tel.get("energy_per_token_j") or {}).get("recent")
    if per_token is not None:
        lines.append(f"energy     {per_token:.3g} J per generated token (last minute)")
    return "\n".join(lines)
