"""Weekly "defrag" restart: memory before, a graceful restart that loses no request, after."""

from __future__ import annotations

import os
from typing import Any

import psutil

from appliance.domain.gpu_sample import GpuSample
from appliance.services.supervisor import EngineSupervisor


def memory_snapshot(supervisor: EngineSupervisor, gpus: list[GpuSample]) -> dict[str, Any]:
    """RSS of the daemon and of the engine's processes; GPU memory in use where reported.

    On the CPU engine fragmentation shows as engine-process RSS; on a GPU the engine holds a
    fixed reservation, so NVML's used memory is the figure (sampled by the telemetry loop).
    """
    engine_rss = 0
    try:
        pids = supervisor.engine.child_pids()
    except Exception:
        pids = []
    for pid in pids:
        try:
            engine_rss += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            continue
    used = [g.mem_used_bytes for g in gpus if g.mem_used_bytes is not None and not g.lost]
    return {
        "daemon_rss_bytes": psutil.Process(os.getpid()).memory_info().rss,
        "engine_rss_bytes": engine_rss,
        "gpu_mem_used_bytes": sum(used) if used else None,
        "gpus_simulated": any(g.simulated for g in gpus),
    }


async def defrag_restart(
    supervisor: EngineSupervisor,
    gpus: Any,
    *,
    min_growth_ratio: float,
    baseline_engine_rss_bytes: int | None,
) -> dict[str, Any]:
    """Restart the engine gracefully unless memory has not grown past min_growth_ratio."""
    before = memory_snapshot(supervisor, gpus())
    if min_growth_ratio > 0 and baseline_engine_rss_bytes:
        growth = before["engine_rss_bytes"] / baseline_engine_rss_bytes - 1
        if growth < min_growth_ratio:
            return {
                "restarted": False,
                "before": before,
                "growth_ratio": round(growth, 4),
                "why": f"engine memory grew {growth:.1%} < {min_growth_ratio:.0%}",
            }
    seconds = await supervisor.restart("scheduled defrag restart", cause="maintenance")
    after = memory_snapshot(supervisor, gpus())
    return {
        "restarted": True,
        "restart_s": round(seconds, 1),
        "before": before,
        "after": after,
        "engine_rss_freed_bytes": before["engine_rss_bytes"] - after["engine_rss_bytes"],
    }
