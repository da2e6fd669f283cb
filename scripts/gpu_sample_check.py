#!/usr/bin/env python3
"""Read one real sample per NVIDIA GPU through the appliance's NVML adapter and time sampling.

Prints one JSON object. With GPUs: every field of one sample per GPU, then the median, p99
and max milliseconds of `--count` full samples (all GPUs each; target < 5 ms per GPU). The
first sample is timed on its own: it opens the PCIe-throughput counters, which NVML reads
over 20 ms each, and which the adapter then re-reads only every pcie_throughput_interval_s.
Without a GPU or driver: {"gpu": false, "message": "no GPU: ..."} and exit status 0.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from appliance.adapters.nvml import NvmlTelemetry  # after the path fix-up

TARGET_MS_PER_GPU = 5.0


def _percentile(sorted_ms: list[float], q: float) -> float:
    return sorted_ms[max(0, math.ceil(q * len(sorted_ms)) - 1)]


def main(argv: list[str] | None = None) -> int:
    """Run the check; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=100, help="samples to time (default 100)")
    ap.add_argument(
        "--pcie-interval-s",
        type=float,
        default=10.0,
        help="the adapter's PCIe-throughput re-read interval (default 10; 0 = never)",
    )
    args = ap.parse_args(argv)

    nv = NvmlTelemetry(pcie_throughput_interval_s=args.pcie_interval_s)
    try:
        if not nv.available or nv.gpu_count == 0:
            why = nv.error or "NVML found no GPU"
            print(json.dumps({"gpu": False, "message": f"no GPU: {why}"}))
            return 0
        t0 = time.perf_counter()
        first = nv.sample()
        first_ms = (time.perf_counter() - t0) * 1000
        times_ms = []
        for _ in range(max(1, args.count)):
            t0 = time.perf_counter()
            nv.sample()
            times_ms.append((time.perf_counter() - t0) * 1000)
        times_ms.sort()
        median = statistics.median(times_ms)
        per_gpu = median / nv.gpu_count
        print(
            json.dumps(
                {
                    "gpu": True,
                    "driver_version": nv.driver_version,
                    "cuda_driver_version": nv.cuda_driver_version,
                    "gpu_count": nv.gpu_count,
                    "samples": [s.to_dict() for s in first],
                    "timing": {
                        "samples": len(times_ms),
                        "first_sample_ms": round(first_ms, 3),
                        "median_ms": round(median, 3),
                        "p99_ms": round(_percentile(times_ms, 0.99), 3),
                        "max_ms": round(times_ms[-1], 3),
                        "median_ms_per_gpu": round(per_gpu, 3),
                        "target_ms_per_gpu": TARGET_MS_PER_GPU,
                        "meets_target": per_gpu < TARGET_MS_PER_GPU,
                        "pcie_throughput_interval_s": args.pcie_interval_s,
                    },
                },
                indent=2,
            )
        )
        return 0
    finally:
        nv.close()


if __name__ == "__main__":
    sys.exit(main())
