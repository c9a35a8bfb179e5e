"""The alert rules (charts/graphledger/files/prometheus-rules.yaml): `promtool check rules`, the promtool
unit tests of every alert (prometheus-rules.test.yaml beside this module), and what ties the rules to
the rest: each alert fires in a test and stays quiet in another, each names a metric the code emits, and
each has its runbook in docs/operations.md. The promtool tests are marked `prometheus` (skipped, with
one line saying what to install, where promtool is missing); the others run everywhere."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from graphledger_server.telemetry import metrics as registry

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "charts" / "graphledger" / "files" / "prometheus-rules.yaml"
RULE_TESTS = Path(__file__).with_name("prometheus-rules.test.yaml")
OPERATIONS = ROOT / "docs" / "operations.md"
METRIC = re.compile(r"\b(graphledger_[a-z0-9_]+|http_server_[a-z0-9_]+)\b")
LABELS = re.compile(r"\{[^}]*\}|\b(?:by|without)\s*\([^)]*\)")
"""Label matchers and grouping clauses, whose label names are not metrics."""


def _alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def _promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *map(str, args)], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.prometheus
def test_promtool_checks_the_rules() -> None:
    result = _promtool("check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in result.stdout


@pytest.mark.prometheus
def test_every_alert_passes_its_promtool_unit_tests() -> None:
    result = _promtool("test", "rules", RULE_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.prometheus
def test_the_unit_tests_catch_a_changed_threshold(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    text = RULES.read_text()
    assert "(graphledger_projector_lag) > 10000" in text
    rules.write_text(text.replace("(graphledger_projector_lag) > 10000", "(graphledger_projector_lag) > 20000"))
    tests = yaml.safe_load(RULE_TESTS.read_text())
    tests["rule_files"] = [str(rules)]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    result = _promtool("test", "rules", tmp_path / "tests.yaml")
    assert result.returncode != 0 and "GraphledgerProjectorLagHigh" in result.stdout + result.stderr


def test_every_alert_is_tested_firing_and_quiet() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in _alerts()}
    assert names - firing == set(), "alerts without a test where they fire"
    assert names - quiet == set(), "alerts without a test where they stay quiet"
    assert firing | quiet <= names, "tests of alerts that do not exist"


def test_every_alert_queries_metrics_the_code_emits() -> None:
    series = registry.prometheus_series()
    for rule in _alerts():
        named = set(METRIC.findall(LABELS.sub("", rule["expr"])))
        assert named, rule["alert"]
        assert named <= series.keys(), f"{rule['alert']}: {sorted(named - series.keys())} not in the registry"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_has_a_runbook_section() -> None:
    headings = {_anchor(line.lstrip("#")) for line in OPERATIONS.read_text().splitlines() if line.startswith("#")}
    for rule in _alerts():
        annotations = rule["annotations"]
        assert annotations.get("summary") and annotations.get("description"), rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        path, _, anchor = annotations["runbook"].partition("#")
        assert path == "docs/operations.md" and anchor == _anchor(rule["alert"]), annotations["runbook"]
        assert anchor in headings, f"docs/operations.md has no section {rule['alert']}"
