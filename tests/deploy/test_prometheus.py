"""deploy/prometheus and the dashboard's queries, checked by promtool (Debian 12's
prometheus package; scripts/fetch-promtool.sh, which ``make test`` runs, unpacks it)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.promql import ALERTS, ROOT, dashboard_exprs

PROMETHEUS = ROOT / "deploy" / "prometheus"


@pytest.fixture(scope="module")
def promtool() -> Path:
    path = ROOT / ".cache" / "promtool" / "bin" / "promtool"
    if not path.exists():
        subprocess.run([str(ROOT / "scripts" / "fetch-promtool.sh")], check=True)
    return path


def run(promtool: Path, *args: str) -> str:
    done = subprocess.run([str(promtool), *args], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_promtool_check_rules_passes(promtool: Path) -> None:
    assert "SUCCESS: 7 rules found" in run(promtool, "check", "rules", str(ALERTS))


def test_every_alert_has_a_runbook_line_and_a_severity() -> None:
    rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    assert {r["alert"] for r in rules} >= {
        "GatewayHighErrorRate", "GatewayHighShedRate", "GatewayBreakerOpen",
        "GatewayOverheadP99High", "GatewayCacheBackendFailing", "LocalEngineDown"}
    for rule in rules:
        runbook = rule["annotations"]["runbook"]
        assert "\n" not in runbook.strip() and len(runbook) > 40, rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical")


def test_each_alert_fires_on_its_symptom_and_not_on_healthy_series(promtool: Path) -> None:
    """alerts_test.yml: promtool's rule unit tests, one or more cases per alert."""
    out = run(promtool, "test", "rules", str(PROMETHEUS / "alerts_test.yml"))
    assert "SUCCESS" in out
    tested = set(re.findall(r"alertname: (\w+)", (PROMETHEUS / "alerts_test.yml").read_text()))
    rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    assert tested == {r["alert"] for r in rules}


def test_the_compose_prometheus_config_is_valid_and_loads_the_rules(promtool: Path) -> None:
    out = run(promtool, "check", "config", str(PROMETHEUS / "prometheus.yml"))
    assert "SUCCESS: 1 rule files found" in out


def test_every_dashboard_query_is_valid_promql(promtool: Path, tmp_path: Path) -> None:
    """Each panel's expression, Grafana's variables replaced by what they expand to, goes
    through promtool as a recording rule (which parses it)."""
    rules = []
    for i, (where, expr) in enumerate(dashboard_exprs()):
        expr = expr.replace("$__rate_interval", "1m").replace("$instance", ".*")
        assert "$" not in expr, f"{where}: an unknown variable in {expr}"
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert f"SUCCESS: {len(rules)} rules found" in run(promtool, "check", "rules", str(path))
