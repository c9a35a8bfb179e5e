"""The Helm chart's value sets (charts/graphledger/ci) lint clean (Helm's own lint, strict), render
manifests that match the Kubernetes schemas of several minor versions (kubernetes-validate, strict),
pass every check of `chart_checks.py`, and roll the pods when the config changes.
"""

from __future__ import annotations

import helm_python as helm
import pytest

from chart_checks import (
    ALL_CHECKS,
    CHART,
    KUBERNETES_VERSIONS,
    VALUE_SETS,
    checksum_problems,
    docs_of,
    load_values,
    manifests,
    of_kind,
    render,
    schema_problems,
)


def test_every_value_set_is_here() -> None:
    assert set(VALUE_SETS) >= {"default", "ingress", "keda", "secure", "anonymous"}


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_helm_lint_is_clean(value_set: str) -> None:
    for version in KUBERNETES_VERSIONS:
        report = helm.lint(CHART, load_values(value_set), strict=True, kube_version=f"v{version}.0")
        findings = [m for m in report["messages"] if m["severity"] >= 2]  # warnings and errors
        assert not findings and not report["errors"], report


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_manifests_match_the_kubernetes_schemas(rendered, value_set: str, version: str) -> None:
    docs = docs_of(rendered, value_set)
    assert len(docs) >= 8
    assert schema_problems(docs, version) == []


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
@pytest.mark.parametrize("check", sorted(ALL_CHECKS))
def test_rendered_output_holds(rendered, value_set: str, check: str) -> None:
    assert ALL_CHECKS[check](docs_of(rendered, value_set)) == []


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_config_change_rolls_the_pods(rendered, value_set: str) -> None:
    assert checksum_problems(docs_of(rendered, value_set), rendered[value_set]) == []
    values = load_values(value_set)
    changed = render({**values, "config": {**values.get("config", {}), "GRAPHLEDGER_BATCH_MAX_EVENTS": 123}})
    before = {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        for d in of_kind(docs_of(rendered, value_set), "Deployment")
    }
    after = {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        for d in of_kind(manifests(changed), "Deployment")
    }
    assert before.keys() == after.keys()
    assert all(before[name] != after[name] for name in before)
