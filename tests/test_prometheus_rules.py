"""The shipped alerting rules: valid for promtool, unit-tested, complete and documented."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest
import yaml

from tests.paths import REPO
from tests.tools import require_tool

RULES = REPO / "config" / "prometheus" / "alerts.yml"
RULE_TESTS = REPO / "config" / "prometheus" / "alerts.test.yml"
README = REPO / "README.md"
RUNBOOK_PREFIX = "https://github.com/cleanerd/cleanerd/blob/main/README.md#"


def _alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = require_tool("promtool", "prometheus")
    return subprocess.run(
        [promtool, *args], capture_output=True, text=True, check=False, timeout=60
    )


def _github_anchor(heading: str) -> str:
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def test_promtool_check_rules_passes() -> None:
    """`promtool check rules` accepts the shipped alerts."""
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    """`promtool test rules` runs the alert unit tests and they pass."""
    result = _promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_unit_tested() -> None:
    """Each alert fires in at least one promtool test case."""
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {
        check["alertname"]
        for case in cases
        for check in case["alert_rule_test"]
        if check.get("exp_alerts")
    }
    assert {a["alert"] for a in _alerts()} <= fired


def test_the_issue_alerts_are_shipped() -> None:
    """Deadline overdue, uncleanable partitions, dead workers, disk above threshold,
    reload failed and MQTT disconnected (a warning) are all there."""
    by_name = {a["alert"]: a for a in _alerts()}
    for name in (
        "CleanerdCompactionDeadlineOverdue",
        "CleanerdUncleanablePartitions",
        "CleanerdDeadWorkers",
        "CleanerdDiskAboveThreshold",
        "CleanerdConfigReloadFailed",
        "CleanerdMqttDisconnected",
    ):
        assert name in by_name
    assert by_name["CleanerdMqttDisconnected"]["labels"]["severity"] == "warning"


@pytest.mark.parametrize("alert", _alerts(), ids=lambda a: a["alert"])
def test_alert_has_severity_annotations_and_a_runbook_in_the_readme(alert: dict[str, Any]) -> None:
    """Every alert has a severity label, summary and description, and a runbook URL
    pointing at a README heading that exists."""
    assert re.fullmatch(r"Cleanerd[A-Z][A-Za-z]+", alert["alert"])
    assert alert["labels"]["severity"] in {"warning", "critical"}
    annotations = alert["annotations"]
    assert annotations["summary"]
    assert annotations["description"]
    url = annotations["runbook_url"]
    assert url.startswith(RUNBOOK_PREFIX)
    headings = {
        _github_anchor(line.lstrip("#"))
        for line in README.read_text().splitlines()
        if line.startswith("#")
    }
    assert url.removeprefix(RUNBOOK_PREFIX) in headings
