"""What torch (imported lazily; only worth it on a GPU machine) says about CUDA and cuDNN."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TorchCuda:
    """What torch says about CUDA: its runtime version, whether a GPU is usable, cuDNN."""

    cuda_runtime: str | None
    cuda_available: bool
    cudnn_version: int | None


def torch_cuda_facts() -> TorchCuda | None:
    """Ask torch about its CUDA build and the GPU it sees; None if torch is missing."""
    try:
        import torch
    except Exception:  # a broken torch install is reported by the pre-check's version check
        return None
    available = bool(torch.cuda.is_available())
    cudnn = torch.backends.cudnn.version() if available else None
    return TorchCuda(torch.version.cuda, available, cudnn)
