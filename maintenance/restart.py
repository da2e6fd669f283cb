"""Weekly "defrag" restart: memory before, a graceful restart that loses no request, after."""

from __future__ import annotations

from typing import Any

from appliance.domain.gpu_sample import GpuSample
from appliance.services.process_memory import daemon_rss, engine_rss
from appliance.services.supervisor import EngineSupervisor


def memory_snapshot(supervisor: EngineSupervisor, gpus: list[GpuSample]) -> dict[str, Any]:
    """RSS of the daemon and of the engine's processes; GPU memory in use where reported.

    On the CPU engine fragmentation shows as engine-process RSS; on a GPU the engine holds a
    fixed reservation, so NVML's used memory is the figure (sampled by the telemetry loop).
    """
    used = [g.mem_used_bytes for g in gpus if g.mem_used_bytes is not None and not g.lost]
    return {
        "daemon_rss_bytes": daemon_rss(),
        "engine_rss_bytes": engine_rss(supervisor),
        "gpu_mem_used_bytes": sum(used) if used else None,
        "gpus_simulated": any(g.simulated for g in gpus),
    }


async def defrag_restart(
    supervisor: EngineSupervisor,
    gpus: Any,
    *,
    min_growth_ratio: float,
    baseline_engine_rss_bytes: int | None,
    baseline_source: str | None = None,
) -> dict[str, Any]:
    """Restart the engine gracefully unless memory has not grown past min_growth_ratio.

    Without a baseline (or without an engine RSS to compare) the growth cannot be judged:
    the engine restarts on schedule and the details say why.
    """
    before = memory_snapshot(supervisor, gpus())
    check: dict[str, Any] = {}
    if min_growth_ratio > 0:
        check = {
            "min_growth_ratio": min_growth_ratio,
            "baseline_engine_rss_bytes": baseline_engine_rss_bytes,
            "baseline_source": baseline_source,
        }
        if not baseline_engine_rss_bytes:
            check["why"] = (
                "no baseline (no engine RSS after start, no earlier restart recorded): "
                "growth unknown, restarting on schedule"
            )
        elif not before["engine_rss_bytes"]:
            check["why"] = "engine RSS not measurable now: growth unknown, restarting on schedule"
        else:
            growth = before["engine_rss_bytes"] / baseline_engine_rss_bytes - 1
            check["growth_ratio"] = round(growth, 4)
            if growth < min_growth_ratio:
                return {
                    "restarted": False,
                    "before": before,
                    **check,
                    "why": f"engine memory grew {growth:.1%} since {baseline_source}, "
                    f"below restart_min_growth_ratio {min_growth_ratio:.0%}",
                }
            check["why"] = (
                f"engine memory grew {growth:.1%} since {baseline_source}, "
                f"at least restart_min_growth_ratio {min_growth_ratio:.0%}"
            )
    seconds = await supervisor.restart("scheduled defrag restart", cause="maintenance")
    after = memory_snapshot(supervisor, gpus())
    return {
        "restarted": True,
        **check,
        "restart_s": round(seconds, 1),
        "before": before,
        "after": after,
        "engine_rss_freed_bytes": before["engine_rss_bytes"] - after["engine_rss_bytes"],
    }
