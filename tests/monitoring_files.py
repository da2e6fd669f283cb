"""The shipped monitoring files read as data: alert rules, dashboard queries, the series they
name. Shared by the promtool unit tests and the live-scrape test, so both read one truth."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
MONITORING = ROOT / "monitoring"
ALERTS = MONITORING / "alerts.yml"
ALERT_TESTS = MONITORING / "tests" / "alerts_test.yml"
SLO_RULES = MONITORING / "slo.yml"
SLO_TESTS = MONITORING / "tests" / "slo_test.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
ALERTMANAGER = MONITORING / "alertmanager.example.yml"
PROMETHEUS = MONITORING / "prometheus.yml"

# Series that come from other exporters, by prefix: DCGM's own field names from dcgm-exporter
# and the host's from node exporter.
FOREIGN_PREFIXES = ("DCGM_FI_", "node_")


def rules_of(path: Path) -> list[dict[str, Any]]:
    """Every rule of a Prometheus rule file (recording and alerting), groups flattened."""
    doc = yaml.safe_load(path.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def alert_rules(path: Path = ALERTS) -> list[dict[str, Any]]:
    """The alerting rules of a rule file (alerts.yml unless told)."""
    return [rule for rule in rules_of(path) if "alert" in rule]


def tool(name: str, package: str) -> str:
    """The path of a monitoring tool; a missing one fails the test, never skips it."""
    exe = shutil.which(name)
    if exe is None:
        pytest.fail(
            f"{name} is missing: install it with `apt-get install -y {package}` "
            "(the Makefile's test target must do this)"
        )
    return exe


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    """A tool's run, its output kept for the assertion message."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def assert_each_alert_tested(rules: Path, tests: Path) -> None:
    """Every alert of rules has a promtool case where it fires and one where it is quiet,
    and no case names an alert the file does not have."""
    cases = [
        case
        for group in yaml.safe_load(tests.read_text())["tests"]
        for case in group.get("alert_rule_test", [])
    ]
    names = [rule["alert"] for rule in alert_rules(rules)]
    assert len(names) == len(set(names)), "alert names must be unique"
    for name in names:
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c.get("exp_alerts") for c in mine), f"{name}: no test where it fires"
        assert any(not c.get("exp_alerts") for c in mine), f"{name}: no test where it is quiet"
    assert {c["alertname"] for c in cases} <= set(names), "a test names an unknown alert"


def dashboard() -> dict[str, Any]:
    """The Grafana dashboard as JSON."""
    return json.loads(DASHBOARD.read_text())


def dashboard_queries(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel query, annotation and template variable."""
    out = [
        (panel["title"], target["expr"])
        for panel in dash["panels"]
        for target in panel.get("targets", [])
    ]
    out += [(a["name"], a["expr"]) for a in dash["annotations"]["list"]]
    for var in dash["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict):
            # label_values(SELECTOR, label): the selector is a query of its own.
            inner = re.fullmatch(r"label_values\((.*),\s*\w+\)", query["query"])
            out.append((f"${var['name']}", inner.group(1) if inner else query["query"]))
    return out


def series_in(expr: str, prefix: str = "appliance_") -> set[str]:
    """Metric names with `prefix` that a PromQL expression reads."""
    return set(re.findall(rf"\b({prefix}[A-Za-z0-9_]+)", expr))


def shipped_appliance_series() -> dict[str, list[str]]:
    """Every appliance_* series a shipped rule or dashboard query reads -> who reads it."""
    users: dict[str, list[str]] = {}
    queries = [(f"alert {r['alert']}", r["expr"]) for r in alert_rules()]
    queries += [(f"panel {where}", expr) for where, expr in dashboard_queries(dashboard())]
    for where, expr in queries:
        for name in series_in(expr):
            users.setdefault(name, []).append(where)
    return users
