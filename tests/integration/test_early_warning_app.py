"""The daemon's early-warning series over HTTP: in /metrics right after start, quiet."""

from __future__ import annotations

from tests.integration.test_app_fake_engine import Harness


async def test_early_warning_series_are_scraped_at_zero_after_start(h: Harness) -> None:
    text = await (await h.client.get("/metrics")).text()
    for line in [
        'appliance_oom_precursor{resource="rss"} 0.0',
        'appliance_oom_precursor{resource="gpu_memory"} 0.0',
        'appliance_oom_eta_seconds{resource="rss"} NaN',
        'appliance_oom_eta_seconds{resource="gpu_memory"} NaN',
        'appliance_latency_spike_active{metric="ttft"} 0.0',
        'appliance_latency_spike_active{metric="tpot"} 0.0',
        'appliance_early_warnings_total{kind="oom_precursor"} 0.0',
        'appliance_early_warnings_total{kind="latency_spike"} 0.0',
    ]:
        assert line in text, line


async def test_the_analysis_runs_in_the_daemon(h: Harness) -> None:
    # Wired in the composition root and started with the metric history: one round by hand
    # over what the daemon has recorded so far finds nothing on an idle box.
    findings = h.svc.early_warning.check_once()
    assert not any(f.precursor for f in findings.memory.values())
    assert set(findings.spikes) == {"ttft", "tpot"}
    assert h.svc.early_warning.running  # started with the metric history
