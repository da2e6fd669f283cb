#!/usr/bin/env python3
"""Compare the memory estimator with real CUDA allocations and time NVML sampling on a GPU box.

The measuring code is an adapter (appliance/adapters/gpu_memory_check.py: only adapters import
torch, transformers and pynvml); this is its command line. On a machine without a GPU it runs
the CPU path. `python3 scripts/gpu_check.py --out gpu_check.json` (--help for the rest).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from appliance.adapters.gpu_memory_check import main

if __name__ == "__main__":
    sys.exit(main())
