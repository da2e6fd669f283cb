"""A live GET /metrics from the daemon (fake engine, simulated GPU) right after it is ready
holds every appliance_* series the shipped alert rules and the dashboard read; labelled series
exist at zero before their first event; the targets come from their owners; faults move the
simulated GPU's health counters."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_app_fake_engine import Harness, _cfg, running
from tests.monitoring_files import shipped_appliance_series

Samples = dict[str, list[tuple[dict[str, str], float]]]


async def _scrape(h: Harness) -> Samples:
    """sample name -> [(labels, value)] of one live scrape."""
    r = await h.client.get("/metrics")
    assert r.status == 200
    out: Samples = {}
    for family in text_string_to_metric_families(await r.text()):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _value(samples: Samples, name: str, **labels: str) -> float:
    found = [v for lbl, v in samples.get(name, []) if labels.items() <= lbl.items()]
    assert len(found) == 1, f"{name}{labels}: {found}"
    return found[0]


async def test_every_series_a_rule_or_panel_reads_is_in_the_first_scrape(h: Harness) -> None:
    samples = await _scrape(h)
    used = shipped_appliance_series()
    assert len(used) > 20  # the files were read
    missing = {name: users for name, users in used.items() if name not in samples}
    assert not missing, f"read by a rule or panel, absent from a live scrape: {missing}"


async def test_labelled_series_start_at_zero_for_every_known_label(h: Harness) -> None:
    samples = await _scrape(h)
    for cause in ("manual", "maintenance", "engine_dead"):
        assert _value(samples, "appliance_engine_restarts_total", cause=cause) == 0
    for lane in ("realtime", "interactive", "batch"):
        assert _value(samples, "appliance_queue_wait_seconds_count", priority=lane) == 0
        assert _value(samples, "appliance_queue_depth", priority=lane) == 0
        for stage in ("queued", "generating"):
            expired = {"priority": lane, "stage": stage}
            assert _value(samples, "appliance_deadline_expired_total", **expired) == 0
    for status in ("ok", "error", "rejected", "not_ready", "deadline", "cancelled"):
        assert _value(samples, "appliance_requests_total", status=status) == 0
    for kind in ("corrected", "uncorrected"):
        for counter in ("volatile", "aggregate"):
            labels = {"gpu": "0", "simulated": "true", "type": kind, "counter": counter}
            assert _value(samples, "appliance_gpu_ecc_errors_total", **labels) == 0
    assert _value(samples, "appliance_gpu_xid_errors_total", gpu="0") == 0


async def test_queue_capacity_and_slo_come_from_their_owners(h: Harness) -> None:
    samples = await _scrape(h)
    # The harness's config: realtime 2, interactive 16, batch 1.
    for lane, size in (("realtime", 2), ("interactive", 16), ("batch", 1)):
        assert _value(samples, "appliance_queue_capacity", priority=lane) == size
    slo = h.svc.controller.cfg
    assert _value(samples, "appliance_slo_ttft_seconds") == slo.slo_ttft_p99_s
    assert _value(samples, "appliance_slo_tpot_seconds") == slo.slo_tpot_p99_s
    # The control loop owns the SLO: a change there shows at the next scrape.
    body = {"slo_ttft_p99_s": 3.5, "slo_tpot_p99_s": 0.125}
    r = await h.client.put("/admin/controller", headers=h.admin(), json=body)
    assert r.status == 200, await r.text()
    samples = await _scrape(h)
    assert _value(samples, "appliance_slo_ttft_seconds") == 3.5
    assert _value(samples, "appliance_slo_tpot_seconds") == 0.125


@pytest.fixture
async def fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    """The harness with the simulated GPU sampled every 20 ms."""
    monkeypatch.delenv("APPLIANCE_ADMIN_TOKEN", raising=False)
    cfg = _cfg(tmp_path, telemetry={"source": "sim", "interval_s": 0.02})
    async with running(cfg, token_delay_s=0.002) as harness:
        yield harness


async def _scrape_until(h: Harness, name: str, labels: dict[str, str], least: float) -> Samples:
    for _ in range(250):
        samples = await _scrape(h)
        if _value(samples, name, **labels) >= least:
            return samples
        await asyncio.sleep(0.02)
    raise AssertionError(f"{name}{labels} never reached {least}")


async def test_simulated_faults_move_the_health_counters(fast: Harness) -> None:
    h = fast
    for fault in ({"name": "xid"}, {"name": "ecc_storm", "factor": 20}):
        r = await h.client.post("/admin/telemetry/faults", headers=h.admin(), json=fault)
        assert r.status == 200, await r.text()
    # xid raises one event at once; ecc_storm an uncorrected error (with its Xid 48) too.
    samples = await _scrape_until(h, "appliance_gpu_xid_errors_total", {"gpu": "0"}, 2)
    uncorrected = {"gpu": "0", "type": "uncorrected", "counter": "volatile"}
    assert _value(samples, "appliance_gpu_ecc_errors_total", **uncorrected) >= 1
    corrected = {"gpu": "0", "type": "corrected", "counter": "aggregate"}
    await _scrape_until(h, "appliance_gpu_ecc_errors_total", corrected, 1)
    # Cleared faults stop the counting but never take a count back.
    await h.client.delete("/admin/telemetry/faults", headers=h.admin())
    before = await _scrape(h)
    await asyncio.sleep(0.1)
    after = await _scrape(h)
    for labels in (uncorrected, corrected):
        kept = _value(before, "appliance_gpu_ecc_errors_total", **labels)
        assert _value(after, "appliance_gpu_ecc_errors_total", **labels) >= kept
    assert _value(after, "appliance_gpu_xid_errors_total", gpu="0") == _value(
        before, "appliance_gpu_xid_errors_total", gpu="0"
    )
