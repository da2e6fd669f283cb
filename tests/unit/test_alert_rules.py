"""monitoring/: promtool checks and unit-tests the alerts; the dashboard and routes hold up.

promtool comes from the Debian package `prometheus`, amtool from `prometheus-alertmanager`.
CI must run these, so a missing tool fails the test instead of skipping it.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.monitoring_files import (
    ALERT_TESTS,
    ALERTMANAGER,
    ALERTS,
    FOREIGN_PREFIXES,
    PROMETHEUS,
    alert_rules,
    assert_each_alert_tested,
    dashboard,
    dashboard_queries,
    run,
    series_in,
    tool,
)

# DCGM field names dcgm-exporter exports with its shipped counter files (etc/default-counters.csv
# and etc/dcp-metrics-included.csv of NVIDIA/dcgm-exporter); a dashboard query must use these.
DCGM_FIELDS = {
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "DCGM_FI_DEV_RETIRED_SBE",
    "DCGM_FI_DEV_RETIRED_DBE",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
}


# -- alert rules ------------------------------------------------------------------------


def test_promtool_check_rules() -> None:
    proc = run(tool("promtool", "prometheus"), "check", "rules", str(ALERTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in proc.stdout


def test_promtool_test_rules() -> None:
    proc = run(tool("promtool", "prometheus"), "test", "rules", str(ALERT_TESTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_is_tested_firing_and_quiet() -> None:
    assert_each_alert_tested(ALERTS, ALERT_TESTS)


def test_the_unit_tests_catch_a_wrong_threshold(tmp_path: Path) -> None:
    # Copy both files, move one threshold, and promtool must report that alert as failing.
    (tmp_path / "tests").mkdir()
    shutil.copy(ALERT_TESTS, tmp_path / "tests" / "alerts_test.yml")
    text, rule = ALERTS.read_text(), "appliance_kv_cache_usage_ratio > 0.9\n"
    assert text.count(rule) == 1
    (tmp_path / "alerts.yml").write_text(text.replace(rule, rule.replace("0.9", "0.96")))
    test_file = tmp_path / "tests" / "alerts_test.yml"
    proc = run(tool("promtool", "prometheus"), "test", "rules", str(test_file))
    assert proc.returncode != 0
    assert "ApplianceKvCacheCritical" in proc.stdout + proc.stderr


def test_kv_cache_over_90_percent_for_5_minutes_pages() -> None:
    rules = {r["alert"]: r for r in alert_rules()}
    critical = rules["ApplianceKvCacheCritical"]
    assert critical["expr"].strip() == "appliance_kv_cache_usage_ratio > 0.9"
    assert critical["for"] == "5m" and critical["labels"]["severity"] == "critical"
    assert rules["ApplianceKvCacheHigh"]["labels"]["severity"] == "warning"


def test_every_alert_has_a_routed_severity_and_both_annotations() -> None:
    for rule in alert_rules():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]


# -- Grafana dashboard ------------------------------------------------------------------


def _dashboard() -> dict[str, Any]:
    return dashboard()


def _targets(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expr) for every query: panels, annotations and template variables."""
    return dashboard_queries(dash)


def _as_promql(expr: str) -> str:
    """Grafana's variables replaced by what they expand to, so promtool can parse the query."""
    return (
        expr.replace("$__rate_interval", "5m")
        .replace("$dcgm_instance", ".*")
        .replace("$instance", ".*")
        .replace("$gpu", ".*")
    )


def test_dashboard_structure() -> None:
    dash = _dashboard()
    assert dash["uid"] and dash["title"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for panel in dash["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    # promtool parses a recording rule's expr exactly as Prometheus would parse the query.
    rules = [
        {"record": f"dashboard:query_{i}", "expr": _as_promql(expr)}
        for i, (_, expr) in enumerate(_targets(_dashboard()))
    ]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = run(tool("promtool", "prometheus"), "check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dashboard_shows_appliance_and_dcgm_series() -> None:
    # Whether the daemon exports them is tests/integration/test_live_scrape.py's question.
    exprs = [expr for _, expr in _targets(_dashboard())]
    used = set().union(*(series_in(e) for e in exprs))
    # The contract's headline series all have a panel.
    for name in (
        "appliance_gpu_temperature_celsius",
        "appliance_gpu_memory_temperature_celsius",
        "appliance_derate_level",
        "appliance_concurrency_limit",
        "appliance_requests_in_flight",
        "appliance_queue_depth",
        "appliance_requests_total",
        "appliance_ttft_seconds_bucket",
        "appliance_tpot_seconds_bucket",
        "appliance_e2e_seconds_bucket",
        "appliance_kv_cache_usage_ratio",
        "appliance_generated_tokens_total",
        "appliance_energy_joules_total",
        "appliance_maintenance_runs_total",
    ):
        assert name in used, name
    dcgm = set().union(*(series_in(e, "DCGM_FI_") for e in exprs))
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP"} <= dcgm


def test_dashboard_dcgm_queries_use_dcgm_field_names() -> None:
    exprs = [expr for _, expr in _targets(_dashboard())]
    dcgm = set().union(*(series_in(e, "DCGM_FI_") for e in exprs))
    assert dcgm, "the DCGM row has no queries"
    assert dcgm <= DCGM_FIELDS, f"not DCGM field names: {sorted(dcgm - DCGM_FIELDS)}"


def test_every_selected_series_is_the_daemons_or_a_known_exporters() -> None:
    # A name right before `{` is a series selector; it is ours, DCGM's, node exporter's or `up`.
    for where, expr in [*_targets(_dashboard()), *((r["alert"], r["expr"]) for r in alert_rules())]:
        for name in re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\{", expr):
            assert name == "up" or name.startswith(("appliance_", *FOREIGN_PREFIXES)), (
                f"{where}: {name} comes from no shipped exporter"
            )


# -- Prometheus scrape config -----------------------------------------------------------


def test_promtool_check_config() -> None:
    # promtool resolves rule_files relative to the config and checks them too.
    proc = run(tool("promtool", "prometheus"), "check", "config", str(PROMETHEUS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "alerts.yml" in proc.stdout + proc.stderr


def test_prometheus_scrapes_the_appliance_dcgm_and_node_exporter() -> None:
    doc = yaml.safe_load(PROMETHEUS.read_text())
    targets = {
        job["job_name"]: [t for sc in job["static_configs"] for t in sc["targets"]]
        for job in doc["scrape_configs"]
    }
    # alerts.yml selects the daemon by job="appliance".
    assert targets["appliance"] == ["127.0.0.1:8000"]
    assert any(t.endswith(":9400") for t in targets["dcgm"])
    assert any(t.endswith(":9100") for t in targets["node"])
    assert "alerts.yml" in doc["rule_files"]
    managers = doc["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert managers == ["127.0.0.1:9093"]


# -- Alertmanager example ---------------------------------------------------------------


def test_alertmanager_example_is_valid() -> None:
    proc = run(tool("amtool", "prometheus-alertmanager"), "check-config", str(ALERTMANAGER))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("labels", "receivers"),
    [
        (["severity=critical", "alertname=ApplianceDown"], "pagerduty-critical,slack-warning"),
        (["severity=warning", "alertname=ApplianceKvCacheHigh"], "slack-warning"),
        (["severity=info", "alertname=ApplianceNvlinkUnderused"], "slack-info"),
    ],
)
def test_alertmanager_routes_by_severity(labels: list[str], receivers: str) -> None:
    proc = run(
        tool("amtool", "prometheus-alertmanager"),
        "config",
        "routes",
        "test",
        f"--config.file={ALERTMANAGER}",
        f"--verify.receivers={receivers}",
        *labels,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
