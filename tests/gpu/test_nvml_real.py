"""The NVML adapter on real NVIDIA GPUs; skipped, with the reason, where NVML does not work."""

from __future__ import annotations

import statistics
import time

import pytest

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")


def _nvml_reason() -> str | None:
    """None when NVML initialises and sees a GPU, else why not."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return f"NVML does not initialise here: {e}"
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            return "NVML works but sees no GPU"
    finally:
        pynvml.nvmlShutdown()
    return None


_REASON = _nvml_reason()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_REASON is not None, reason=_REASON or ""),
]


@pytest.fixture
def nv():  # type: ignore[no-untyped-def]
    from appliance.adapters.nvml import NvmlTelemetry

    t = NvmlTelemetry(pcie_throughput_interval_s=10.0)
    yield t
    t.close()


def test_real_samples_are_sane(nv) -> None:  # type: ignore[no-untyped-def]
    assert nv.available and nv.error is None and nv.gpu_count >= 1
    samples = nv.sample()
    assert [s.index for s in samples] == list(range(nv.gpu_count))
    for s in samples:
        assert not s.lost and not s.simulated
        assert s.uuid.startswith(("GPU-", "MIG-")) and s.name
        assert s.core_temp_c is not None and 5 <= s.core_temp_c <= 110
        if s.mem_temp_c is not None:
            assert 5 <= s.mem_temp_c <= 120
        if s.slowdown_temp_c is not None:
            assert 60 <= s.slowdown_temp_c <= 120
            assert s.shutdown_temp_c is None or s.shutdown_temp_c >= s.slowdown_temp_c
        if s.power_w is not None and s.power_limit_w is not None:
            assert 0 < s.power_w <= s.power_limit_w * 1.5
        assert s.mem_total_bytes is not None and s.mem_total_bytes > 2**30
        assert s.mem_used_bytes is not None and 0 <= s.mem_used_bytes <= s.mem_total_bytes
        assert s.sm_clock_mhz is not None and 0 <= s.sm_clock_mhz < 5000
        assert s.gpu_util_pct is not None and 0 <= s.gpu_util_pct <= 100
        if s.pcie_gen is not None and s.pcie_gen_max is not None:
            assert 1 <= s.pcie_gen <= s.pcie_gen_max
        assert s.invalid == (), f"gpu{s.index}: unreadable {s.invalid}"
        assert set(s.unsupported) <= set(s.to_dict())


def test_energy_counter_advances(nv) -> None:  # type: ignore[no-untyped-def]
    before = nv.sample()
    time.sleep(1.0)
    after = nv.sample()
    for a, b in zip(before, after, strict=True):
        if "energy_j" in a.unsupported:
            continue
        assert a.energy_j is not None and b.energy_j is not None
        # Even idle a datacenter GPU draws tens of watts.
        assert b.energy_j - a.energy_j > 1.0


def test_sampling_is_fast(nv) -> None:  # type: ignore[no-untyped-def]
    nv.sample()  # the first one opens the slow PCIe-throughput counters
    times_ms = []
    for _ in range(100):
        t0 = time.perf_counter()
        nv.sample()
        times_ms.append((time.perf_counter() - t0) * 1000)
    per_gpu = statistics.median(times_ms) / nv.gpu_count
    print(f"median {statistics.median(times_ms):.3f} ms for {nv.gpu_count} GPU(s)")
    assert per_gpu < 5.0
