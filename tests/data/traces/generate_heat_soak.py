"""Writes h100_heat_soak.csv: a synthetic nvidia-smi trace of two H100s through a cooling fault.

Not a recording: a first-order thermal model (per-GPU thermal resistance and time constant,
clocks and power cut past the slowdown point) printed in exactly the shape of
`nvidia-smi --query-gpu=timestamp,index,name,uuid,temperature.gpu,temperature.memory,
power.draw,power.limit,clocks.sm,clocks.mem,utilization.gpu,utilization.memory,memory.used,
memory.total --format=csv -l 5`. Run it again to regenerate the file (seeded, so identical).
"""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta
from pathlib import Path

HEADER = (
    "timestamp, index, name, uuid, temperature.gpu, temperature.memory, power.draw [W], "
    "power.limit [W], clocks.sm [MHz], clocks.mem [MHz], utilization.gpu [%], "
    "utilization.memory [%], memory.used [MiB], memory.total [MiB]"
)
UUIDS = ("GPU-5f3c2a91-7d4e-4b1a-9c3f-2e8d6a1b0c47", "GPU-a81e0d36-2b9f-4c75-8e14-7f6c3d2b9a58")
POLL_S = 5.0
DURATION_S = 25 * 60


def load_at(t: float) -> float:
    """Light serving, then a batch job from 3 to 18 minutes."""
    return 1.0 if 180 <= t < 1080 else 0.3


def ambient_at(t: float, gpu: int) -> float:
    """A cooling unit fails at 6 min (inlet +13 °C for GPU 0, +6 °C for GPU 1), fixed at 14."""
    rise = (13.0, 6.0)[gpu]
    if t < 360:
        frac = 0.0
    elif t < 480:
        frac = (t - 360) / 120
    elif t < 840:
        frac = 1.0
    elif t < 960:
        frac = 1.0 - (t - 840) / 120
    else:
        frac = 0.0
    return 25.0 + rise * frac


def main() -> None:
    rng = random.Random(20261120)
    start = datetime(2026, 11, 20, 14, 3, 5, 117000)
    temp = [40.0, 39.0]
    r_c_per_w, tau_s, idle_w, max_w, slowdown_c = (0.085, 0.082), 90.0, 75.0, 690.0, 89.0
    lines = [HEADER]
    t = 0.0
    while t <= DURATION_S:
        for gpu in (0, 1):
            load = load_at(t)
            throttled = temp[gpu] >= slowdown_c
            power = (idle_w + (max_w - idle_w) * load) * (0.82 if throttled else 1.0)
            eq = ambient_at(t, gpu) + r_c_per_w[gpu] * power
            temp[gpu] += (eq - temp[gpu]) * (1 - math.exp(-POLL_S / tau_s))
            core = temp[gpu] + rng.gauss(0, 0.4)
            hbm = temp[gpu] + 2.0 + 6.5 * load + rng.gauss(0, 0.4)
            sm = int(1980 * (0.78 if throttled else 1.0)) if load > 0.5 else 1755
            stamp = start + timedelta(seconds=t, milliseconds=2 * gpu + rng.randint(0, 3))
            mem_temp = f"{round(hbm)}"
            # One sensor read in the whole trace comes back empty, as they occasionally do.
            if gpu == 1 and abs(t - 600) < 1e-9:
                mem_temp = "[N/A]"
            lines.append(
                ", ".join(
                    [
                        stamp.strftime("%Y/%m/%d %H:%M:%S.") + f"{stamp.microsecond // 1000:03d}",
                        str(gpu),
                        "NVIDIA H100 80GB HBM3",
                        UUIDS[gpu],
                        f"{round(core)}",
                        mem_temp,
                        f"{power + rng.gauss(0, 6):.2f} W",
                        "700.00 W",
                        f"{sm} MHz",
                        "2619 MHz",
                        f"{min(100, round(100 * load + rng.gauss(0, 2)))} %",
                        f"{min(100, round(62 * load + rng.gauss(0, 2)))} %",
                        "74215 MiB",
                        "81559 MiB",
                    ]
                )
            )
        t += POLL_S
    out = Path(__file__).with_name("h100_heat_soak.csv")
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
