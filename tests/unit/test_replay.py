"""Replay of nvidia-smi CSV traces: parsing, pacing, looping, the policy over a shipped trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.adapters.replay import ReplayTelemetry, TraceError, parse_trace
from appliance.domain.thermal import ThermalLevel, ThermalPolicyConfig, initial_state, step

TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "h100_heat_soak.csv"

HEADER = (
    "timestamp, index, name, uuid, temperature.gpu, temperature.memory, "
    "power.draw [W], power.limit [W], clocks.sm [MHz], clocks.mem [MHz], "
    "utilization.gpu [%], utilization.memory [%], memory.used [MiB], "
    "memory.total [MiB]"
)
H100 = "NVIDIA H100 80GB HBM3"
ROWS = [
    (
        "2026/11/20 14:00:00.000",
        0,
        "GPU-a",
        "60, 66, 250.12 W, 700.00 W, 1980 MHz, 2619 MHz, 95 %, 60 %, 1024 MiB, 81559 MiB",
    ),
    (
        "2026/11/20 14:00:00.002",
        1,
        "GPU-b",
        "58, [N/A], [N/A], 700.00 W, 1980 MHz, 2619 MHz, 90 %, 55 %, 1024 MiB, 81559 MiB",
    ),
    (
        "2026/11/20 14:00:10.000",
        0,
        "GPU-a",
        "70, 77, 350.00 W, 700.00 W, 1980 MHz, 2619 MHz, 99 %, 61 %, 2048 MiB, 81559 MiB",
    ),
    (
        "2026/11/20 14:00:10.001",
        1,
        "GPU-b",
        "59, [Not Supported], 300.00 W, 700.00 W, "
        "1980 MHz, 2619 MHz, 91 %, 56 %, 2048 MiB, 81559 MiB",
    ),
    (
        "2026/11/20 14:00:20.000",
        0,
        "GPU-a",
        "80, 88, 450.00 W, 700.00 W, 1980 MHz, 2619 MHz, 100 %, 62 %, 4096 MiB, 81559 MiB",
    ),
    (
        "2026/11/20 14:00:20.001",
        1,
        "GPU-b",
        "60, 61, 300.00 W, 700.00 W, 1980 MHz, 2619 MHz, 92 %, 57 %, 4096 MiB, 81559 MiB",
    ),
]
SMALL = "\n".join([HEADER] + [f"{t}, {i}, {H100}, {u}, {rest}" for t, i, u, rest in ROWS]) + "\n"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def small(tmp_path: Path) -> Path:
    p = tmp_path / "small.csv"
    p.write_text(SMALL, encoding="utf-8")
    return p


def test_parses_units_missing_and_unsupported_values() -> None:
    frames = parse_trace(SMALL.splitlines())
    assert [f.offset_s for f in frames] == [0.0, 10.0, 20.0]
    a, b = frames[0].samples
    assert (a.index, a.uuid, a.name) == (0, "GPU-a", "NVIDIA H100 80GB HBM3")
    assert a.core_temp_c == 60 and a.mem_temp_c == 66
    assert a.power_w == pytest.approx(250.12) and a.power_limit_w == 700.0
    assert a.sm_clock_mhz == 1980 and a.mem_clock_mhz == 2619
    assert a.gpu_util_pct == 95 and a.mem_bw_util_pct == 60
    assert a.mem_used_bytes == 1024 * 2**20 and a.mem_total_bytes == 81559 * 2**20
    assert not a.simulated and not a.lost
    # [N/A] is simply absent; [Not Supported] is recorded as such.
    assert b.mem_temp_c is None and b.power_w is None and "mem_temp_c" not in b.unsupported
    b1 = frames[1].samples[1]
    assert b1.mem_temp_c is None and "mem_temp_c" in b1.unsupported
    # Fields the query did not ask for are unsupported in the trace.
    assert "pcie_gen" in a.unsupported


def test_nounits_and_noheader_variants_parse_the_same() -> None:
    lines = SMALL.splitlines()
    nounits = [lines[0]] + [
        line.replace(" W", "").replace(" MHz", "").replace(" %", "").replace(" MiB", "")
        for line in lines[1:]
    ]
    noheader = lines[1:]
    base = parse_trace(lines)
    for variant in (nounits, noheader):
        got = parse_trace(variant)
        assert [s.core_temp_c for f in got for s in f.samples] == [
            s.core_temp_c for f in base for s in f.samples
        ]
        assert [s.mem_used_bytes for f in got for s in f.samples] == [
            s.mem_used_bytes for f in base for s in f.samples
        ]
        assert [s.power_w for f in got for s in f.samples] == [
            s.power_w for f in base for s in f.samples
        ]


def test_bad_rows_name_the_line(tmp_path: Path) -> None:
    lines = SMALL.splitlines()
    lines[3] = lines[3].rsplit(",", 1)[0]  # one value short
    with pytest.raises(TraceError, match=r"bad\.csv:4: 13 values for 14 columns"):
        parse_trace(lines, source="bad.csv")
    with pytest.raises(TraceError, match="bad timestamp"):
        parse_trace([lines[0], "yesterday" + lines[1][23:]])
    with pytest.raises(TraceError, match="No such file"):
        ReplayTelemetry(tmp_path / "missing.csv")


def test_unreadable_value_is_invalid_not_fatal() -> None:
    lines = SMALL.splitlines()
    lines[1] = lines[1].replace("250.12 W", "lots W")
    s = parse_trace(lines)[0].samples[0]
    assert s.power_w is None and "power_w" in s.invalid


def test_step_mode_walks_polls_and_loops(small: Path) -> None:
    r = ReplayTelemetry(small, mode="step", loop=True)
    temps = [r.sample()[0].core_temp_c for _ in range(5)]
    assert temps == [60, 70, 80, 60, 70]
    once = ReplayTelemetry(small, mode="step", loop=False)
    assert [once.sample()[0].core_temp_c for _ in range(5)] == [60, 70, 80, 80, 80]
    assert once.finished


def test_timestamp_mode_follows_recorded_time_times_speed(small: Path) -> None:
    clock = FakeClock()
    r = ReplayTelemetry(small, mode="timestamps", speed=2.0, loop=True, clock=clock)
    seen = {}
    for t in (0.0, 4.9, 5.0, 9.99, 10.0, 14.9, 15.0):
        clock.now = t
        seen[t] = r.sample()[0].core_temp_c
    # 2x speed: recorded 10 s polls arrive every 5 s; a lap lasts 30 recorded s (20 + one gap).
    assert seen == {0.0: 60, 4.9: 60, 5.0: 70, 9.99: 70, 10.0: 80, 14.9: 80, 15.0: 60}


def test_energy_integrates_power_and_keeps_counting_across_loops(small: Path) -> None:
    r = ReplayTelemetry(small, mode="step", loop=True)
    energies = [r.sample()[0].energy_j for _ in range(6)]
    # Trapezoids over 10 s: (250.12 + 350) / 2 * 10, then (350 + 450) / 2 * 10.
    lap = 3000.6 + 4000.0
    assert energies[:3] == pytest.approx([0.0, 3000.6, lap])
    assert energies[3:] == pytest.approx([lap, lap + 3000.6, 2 * lap])
    assert energies == sorted(energies)


def test_policy_over_the_shipped_heat_soak_trace() -> None:
    """The shipped trace heats GPU 0 past 85 °C and its HBM past 95 °C, then cools."""
    r = ReplayTelemetry(TRACE, mode="step", loop=False)
    assert len(r.frames) > 100 and all(len(f.samples) == 2 for f in r.frames)
    cfg = ThermalPolicyConfig()
    state = initial_state(0.0)
    levels, reasons, factors = [], [], []
    peak_core = peak_mem = 0.0
    for frame in r.frames:
        samples = r.sample()
        assert list(samples) == list(frame.samples)
        d = step(state, samples, frame.offset_s, cfg)
        state = d.state
        levels.append(d.level)
        factors.append(d.factor)
        if d.changed:
            reasons.append(d.reason)
        peak_core = max(peak_core, samples[0].core_temp_c or 0.0)
        peak_mem = max(peak_mem, samples[0].mem_temp_c or 0.0)
    assert peak_core >= 85 and peak_mem >= 95
    first_derate = levels.index(ThermalLevel.DERATE)
    first_protect = levels.index(ThermalLevel.PROTECT)
    assert first_derate < first_protect  # the core crosses 85 before HBM reaches 95
    assert any("gpu0" in x and "HBM" in x for x in reasons)
    assert min(factors) >= cfg.floor_factor
    leave = levels.index(ThermalLevel.DERATE, first_protect)
    assert all(f1 <= f2 for f1, f2 in zip(factors[leave:], factors[leave + 1 :], strict=False))
    assert levels[-1] is ThermalLevel.DERATE  # recovery from the floor outlasts the trace
    # Past its end the replay holds the last (cool) poll; the factor climbs back to 1.
    now = r.frames[-1].offset_s
    for _ in range(120):
        now += 5.0
        samples = r.sample()
        state = step(state, samples, now, cfg).state
    assert r.finished
    assert samples == list(r.frames[-1].samples)
    assert state.level is ThermalLevel.NORMAL and state.factor == 1.0
