"""Replay of `nvidia-smi --query-gpu=... --format=csv` traces as Telemetry.

The parser takes nvidia-smi's own shape: a header of field names with units in brackets
(`power.draw [W]`), `, `-separated values with units (`250.12 W`, `85 %`, `1024 MiB`),
`[N/A]` / `[Not Supported]` for missing values, and `nounits`/`noheader` variants. One poll
of nvidia-smi writes one row per GPU; a poll ends where a GPU index repeats.
"""

from __future__ import annotations

import csv
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from appliance.domain.gpu_sample import GpuSample

log = logging.getLogger(__name__)

# The query the appliance documents for recording traces; also the column order assumed
# for a `noheader` file.
DEFAULT_COLUMNS: tuple[str, ...] = (
    "timestamp",
    "index",
    "name",
    "uuid",
    "temperature.gpu",
    "temperature.memory",
    "power.draw",
    "power.limit",
    "clocks.sm",
    "clocks.mem",
    "utilization.gpu",
    "utilization.memory",
    "memory.used",
    "memory.total",
)

# nvidia-smi field name (and aliases) -> GpuSample field.
_FIELD_MAP: dict[str, str] = {
    "temperature.gpu": "core_temp_c",
    "temperature.memory": "mem_temp_c",
    "power.draw": "power_w",
    "power.draw.instant": "power_w",
    "power.limit": "power_limit_w",
    "enforced.power.limit": "power_limit_w",
    "clocks.sm": "sm_clock_mhz",
    "clocks.current.sm": "sm_clock_mhz",
    "clocks.mem": "mem_clock_mhz",
    "clocks.current.memory": "mem_clock_mhz",
    "utilization.gpu": "gpu_util_pct",
    "utilization.memory": "mem_bw_util_pct",
    "memory.used": "mem_used_bytes",
    "memory.total": "mem_total_bytes",
    "pcie.link.gen.current": "pcie_gen",
    "pcie.link.gen.gpucurrent": "pcie_gen",
    "pcie.link.gen.max": "pcie_gen_max",
    "pcie.link.width.current": "pcie_width",
    "pcie.link.width.max": "pcie_width_max",
    "ecc.errors.corrected.volatile.total": "ecc_corrected_volatile",
    "ecc.errors.uncorrected.volatile.total": "ecc_uncorrected_volatile",
    "ecc.errors.corrected.aggregate.total": "ecc_corrected_aggregate",
    "ecc.errors.uncorrected.aggregate.total": "ecc_uncorrected_aggregate",
}
_INT_FIELDS = {
    "sm_clock_mhz",
    "mem_clock_mhz",
    "mem_used_bytes",
    "mem_total_bytes",
    "pcie_gen",
    "pcie_gen_max",
    "pcie_width",
    "pcie_width_max",
    "ecc_corrected_volatile",
    "ecc_uncorrected_volatile",
    "ecc_corrected_aggregate",
    "ecc_uncorrected_aggregate",
}
_UNIT_SCALE = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "b": 1, "w": 1, "mw": 1e-3}
_MISSING = {"", "n/a", "[n/a]", "na", "-"}
_NOT_SUPPORTED = {"[not supported]", "not supported", "[unknown error]"}
_TIME_FORMATS = (
    "%Y/%m/%d %H:%M:%S.%f",
    "%Y/%m/%d %H:%M:%S",
    "%Y-%m-%d %H:%M:%S.%f",
    "%Y-%m-%d %H:%M:%S",
    "%Y-%m-%dT%H:%M:%S.%f",
    "%Y-%m-%dT%H:%M:%S",
)


class TraceError(ValueError):
    """The trace cannot be replayed; the message names the file and line."""


@dataclass(frozen=True)
class Frame:
    """One nvidia-smi poll: every GPU's sample at one recorded time."""

    offset_s: float  # since the first poll of the trace
    samples: tuple[GpuSample, ...]


def _norm_header(cell: str) -> tuple[str, str | None]:
    """`power.draw [W]` -> ("power.draw", "w")."""
    cell = cell.strip()
    unit = None
    if cell.endswith("]") and "[" in cell:
        cell, _, rest = cell.partition("[")
        unit = rest[:-1].strip().lower()
    return cell.strip().lower(), unit


def _parse_time(text: str) -> float | None:
    text = text.strip()
    for fmt in _TIME_FORMATS:
        try:
            # nvidia-smi writes local time without a zone; only differences matter here.
            return datetime.strptime(text, fmt).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    return None


def _parse_number(text: str, header_unit: str | None) -> float:
    """`250.12 W` -> 250.12, `1024 MiB` -> bytes; raises ValueError when not a number."""
    parts = text.strip().split()
    if not parts:
        raise ValueError("empty")
    value = float(parts[0])
    unit = (parts[1] if len(parts) > 1 else header_unit or "").lower()
    if not math.isfinite(value):
        raise ValueError(f"not finite: {text!r}")
    return value * _UNIT_SCALE.get(unit, 1)


def parse_trace(lines: Iterable[str], *, source: str = "<trace>") -> list[Frame]:
    """Parse nvidia-smi CSV lines into polls; raises TraceError with the line number."""
    rows = [
        (n, row) for n, row in enumerate(csv.reader(lines), start=1) if any(c.strip() for c in row)
    ]
    if not rows:
        raise TraceError(f"{source}: no rows")
    first_line, first = rows[0]
    if _parse_time(first[0]) is not None:
        header = [(c, None) for c in DEFAULT_COLUMNS]  # a `noheader` trace
        body = rows
    else:
        header = [_norm_header(c) for c in first]
        body = rows[1:]
    names = [h for h, _ in header]
    if "index" not in names and "uuid" not in names:
        raise TraceError(f"{source}:{first_line}: the trace needs an `index` or `uuid` column")
    mapped = {_FIELD_MAP[h] for h in names if h in _FIELD_MAP}
    absent = tuple(sorted({f for f in _FIELD_MAP.values() if f not in mapped}))

    frames: list[Frame] = []
    current: list[GpuSample] = []
    t0: float | None = None
    frame_t: float | None = None
    poll = 0
    seen_uuids: dict[str, int] = {}
    for line_no, row in body:
        if len(row) != len(header):
            raise TraceError(f"{source}:{line_no}: {len(row)} values for {len(header)} columns")
        cells = {h: (v.strip(), unit) for (h, unit), v in zip(header, row, strict=True)}
        ts = _parse_time(cells["timestamp"][0]) if "timestamp" in cells else None
        if "timestamp" in cells and ts is None:
            raise TraceError(f"{source}:{line_no}: bad timestamp {cells['timestamp'][0]!r}")
        uuid = cells.get("uuid", ("", None))[0]
        if "index" in cells:
            try:
                index = int(cells["index"][0])
            except ValueError:
                raise TraceError(f"{source}:{line_no}: bad index {cells['index'][0]!r}") from None
        else:
            index = seen_uuids.setdefault(uuid, len(seen_uuids))
        if any(s.index == index for s in current):
            frames.append(_frame(current, frame_t, t0, poll))
            current, poll = [], poll + 1
        if not current:
            frame_t = ts
        if t0 is None:
            t0 = ts
        current.append(_row_sample(cells, index, uuid, ts, poll, absent, f"{source}:{line_no}"))
    if current:
        frames.append(_frame(current, frame_t, t0, poll))
    return frames


def _frame(samples: list[GpuSample], frame_t: float | None, t0: float | None, poll: int) -> Frame:
    offset = (frame_t - t0) if frame_t is not None and t0 is not None else float(poll)
    return Frame(offset_s=offset, samples=tuple(sorted(samples, key=lambda s: s.index)))


def _row_sample(
    cells: dict[str, tuple[str, str | None]],
    index: int,
    uuid: str,
    ts: float | None,
    poll: int,
    absent: tuple[str, ...],
    where: str,
) -> GpuSample:
    values: dict[str, float | int | None] = {}
    unsupported = set(absent)
    invalid: set[str] = set()
    for header, (text, unit) in cells.items():
        field = _FIELD_MAP.get(header)
        if field is None or (field in values and values[field] is not None):
            continue
        low = text.lower()
        if low in _NOT_SUPPORTED:
            unsupported.add(field)
            values[field] = None
            continue
        if low in _MISSING:
            values[field] = None
            continue
        try:
            number = _parse_number(text, unit)
        except ValueError:
            log.warning("%s: unreadable %s value %r; treated as missing", where, header, text)
            invalid.add(field)
            values[field] = None
            continue
        values[field] = round(number) if field in _INT_FIELDS else number
        unsupported.discard(field)
    name = cells.get("name", ("", None))[0] or "GPU"
    return GpuSample(
        index=index,
        uuid=uuid or f"replay-gpu{index}",
        name=name,
        simulated=False,
        timestamp_s=ts if ts is not None else float(poll),
        unsupported=tuple(sorted(unsupported)),
        invalid=tuple(sorted(invalid)),
        **values,  # type: ignore[arg-type]
    )


def _with_energy(frames: list[Frame]) -> tuple[list[Frame], dict[str, float]]:
    """Give every sample a cumulative energy integrated from power over recorded time."""
    energy: dict[str, float] = {}
    last: dict[str, tuple[float, float]] = {}
    out = []
    for fr in frames:
        samples = []
        for s in fr.samples:
            prev = last.get(s.uuid)
            if s.power_w is not None:
                if prev is not None:
                    dt = max(0.0, fr.offset_s - prev[0])
                    energy[s.uuid] = energy.get(s.uuid, 0.0) + 0.5 * (prev[1] + s.power_w) * dt
                last[s.uuid] = (fr.offset_s, s.power_w)
            samples.append(replace(s, energy_j=energy.get(s.uuid, 0.0)))
        out.append(Frame(fr.offset_s, tuple(samples)))
    return out, energy


class ReplayTelemetry:
    """Telemetry adapter that plays back a recorded trace, by poll or by recorded time."""

    name = "replay"
    simulated = False

    def __init__(
        self,
        path: str | Path,
        *,
        mode: Literal["timestamps", "step"] = "timestamps",
        speed: float = 1.0,
        loop: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if speed <= 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        self.path = Path(path)
        try:
            with self.path.open(newline="", encoding="utf-8") as fh:
                frames = parse_trace(fh, source=str(self.path))
        except OSError as e:
            raise TraceError(f"{self.path}: {e.strerror or e}") from e
        self.frames, self._lap_energy_j = _with_energy(frames)
        self.mode = mode
        self.speed = speed
        self.loop = loop
        self._clock = clock
        self._started_s = clock()
        self._step = 0
        self.finished = False
        # A loop lasts the recorded span plus one typical poll gap, so the last poll is
        # shown for as long as the others before the first comes round again.
        offsets = [f.offset_s for f in self.frames]
        gaps = sorted(b - a for a, b in itertools.pairwise(offsets) if b > a)
        self.period_s = (offsets[-1] - offsets[0]) + (gaps[len(gaps) // 2] if gaps else 1.0)

    def sample(self) -> list[GpuSample]:
        """The poll due now (mode `timestamps`) or the next poll (mode `step`)."""
        n = len(self.frames)
        if self.mode == "step":
            i, lap = self._step % n, self._step // n
            if not self.loop and self._step >= n:
                i, lap = n - 1, 0
                self.finished = True
            self._step += 1
        else:
            elapsed = (self._clock() - self._started_s) * self.speed
            lap = int(elapsed // self.period_s)
            if not self.loop and lap > 0:
                i, lap = n - 1, 0
                self.finished = True
            else:
                pos = elapsed - lap * self.period_s
                i = _last_at_or_before([f.offset_s for f in self.frames], pos)
        frame = self.frames[i]
        return [self._lapped(s, lap) for s in frame.samples]

    def _lapped(self, s: GpuSample, lap: int) -> GpuSample:
        if lap == 0 or s.energy_j is None:
            return s
        # Energy keeps counting across loops, as a real counter would.
        return replace(s, energy_j=s.energy_j + lap * self._lap_energy_j.get(s.uuid, 0.0))

    def close(self) -> None:
        """Nothing to release."""


def _last_at_or_before(offsets: list[float], pos: float) -> int:
    lo, hi = 0, len(offsets) - 1
    if pos <= offsets[0]:
        return 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if offsets[mid] <= pos:
            lo = mid
        else:
            hi = mid - 1
    return lo
