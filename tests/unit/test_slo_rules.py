"""monitoring/slo.yml: promtool checks and unit-tests the SLO recording rules and burn-rate
alerts; every alert is tested firing and quiet; the rules read only series the daemon has.

promtool comes from the Debian package `prometheus`; a missing tool fails, never skips.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from prometheus_client import CollectorRegistry

from appliance.services.slo import SloMeter
from tests.monitoring_files import (
    SLO_RULES,
    SLO_TESTS,
    alert_rules,
    assert_each_alert_tested,
    rules_of,
    run,
    tool,
)

# The SRE workbook's pairs for a 99.9 % objective: (long window, short window, burn rate).
WORKBOOK = {
    "ApplianceErrorBudgetBurn1h": ("1h", "5m", "14.4", "critical"),
    "ApplianceErrorBudgetBurn6h": ("6h", "30m", "6", "critical"),
    "ApplianceErrorBudgetBurn1d": ("1d", "2h", "3", "warning"),
    "ApplianceErrorBudgetBurn3d": ("3d", "6h", "1", "warning"),
}


def _promtool() -> str:
    return tool("promtool", "prometheus")


def test_promtool_check_rules() -> None:
    proc = run(_promtool(), "check", "rules", str(SLO_RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules_of(SLO_RULES))} rules found" in proc.stdout


def test_promtool_test_rules() -> None:
    proc = run(_promtool(), "test", "rules", str(SLO_TESTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_is_tested_firing_and_quiet() -> None:
    assert_each_alert_tested(SLO_RULES, SLO_TESTS)


def test_the_alerts_are_the_workbooks_windows_and_rates() -> None:
    alerts = {rule["alert"]: rule for rule in alert_rules(SLO_RULES)}
    assert set(alerts) == set(WORKBOOK)
    for name, (long, short, factor, severity) in WORKBOOK.items():
        expr = " ".join(alerts[name]["expr"].split())
        assert f"appliance:slo_errors:ratio_rate{long} > ({factor} * 0.001)" in expr, name
        assert f"appliance:slo_errors:ratio_rate{short} > ({factor} * 0.001)" in expr, name
        assert alerts[name]["labels"]["severity"] == severity, name
        assert {"summary", "description"} <= set(alerts[name]["annotations"]), name


def test_the_unit_tests_catch_a_wrong_burn_rate(tmp_path: Path) -> None:
    # Copy both files, move the page's burn rate, and promtool must report that alert.
    (tmp_path / "tests").mkdir()
    shutil.copy(SLO_TESTS, tmp_path / "tests" / "slo_test.yml")
    text = SLO_RULES.read_text()
    assert text.count("(14.4 * 0.001)") == 2
    (tmp_path / "slo.yml").write_text(text.replace("(14.4 * 0.001)", "(25 * 0.001)"))
    proc = run(_promtool(), "test", "rules", str(tmp_path / "tests" / "slo_test.yml"))
    assert proc.returncode != 0
    assert "ApplianceErrorBudgetBurn1h" in proc.stdout + proc.stderr


def test_rules_read_only_series_the_daemon_exports() -> None:
    registry = CollectorRegistry()
    SloMeter(registry, lambda: "ready", after_crash=False)
    exported = {
        (s.name, tuple(sorted(s.labels.items())))
        for family in registry.collect()
        for s in family.samples
    }
    names = {name for name, _ in exported}
    for rule in rules_of(SLO_RULES):
        used = set(re.findall(r"\b(appliance_[A-Za-z0-9_]+)", rule["expr"]))
        assert used <= names, f"{rule.get('record') or rule.get('alert')}: {used - names}"
    # The label values the rules select are the ones the daemon creates at zero.
    assert ("appliance_slo_requests_total", (("outcome", "bad"),)) in exported
    assert ("appliance_slo_ready_seconds_total", (("state", "down"),)) in exported
