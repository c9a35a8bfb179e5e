"""The chart's checks catch a broken chart: Helm's lint and render, the schema validation and each
check of `chart_checks.py` fail on a copy of the chart with one template changed the way they guard
against.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import helm_python as helm
import pytest

from chart_checks import (
    ALL_CHECKS,
    CHART,
    KUBERNETES_VERSIONS,
    checksum_problems,
    docs_of,
    load_values,
    manifests,
    merge,
    render,
    schema_problems,
)


@pytest.fixture
def broken_chart(tmp_path: Path) -> Callable[[str, str, str], Path]:
    """A copy of the chart with one replacement made in one template (which must apply)."""

    def make(template: str, old: str, new: str) -> Path:
        copy = tmp_path / "graphledger"
        shutil.copytree(CHART, copy)
        path = copy / "templates" / template
        text = path.read_text()
        assert old in text, f"{old!r} not in {template}"
        path.write_text(text.replace(old, new, 1))
        return copy

    return make


def test_a_template_syntax_error_fails_lint_and_render(broken_chart) -> None:
    chart = broken_chart("api-service.yaml", "{{- end }}", "{{- end")
    values = load_values("ingress")
    report = helm.lint(chart, values, strict=True)
    assert any(message["severity"] == 3 for message in report["messages"]), report
    with pytest.raises(helm.HelmError):
        render(values, chart)


def test_an_invalid_manifest_fails_schema_validation(broken_chart) -> None:
    chart = broken_chart("api-deployment.yaml", "containerPort: {{ $values.port }}", "containerPort: http")
    docs = manifests(render(load_values("default"), chart))
    for version in KUBERNETES_VERSIONS:
        assert any("containerPort" in problem for problem in schema_problems(docs, version))


def test_a_misspelled_field_fails_strict_validation(broken_chart) -> None:
    chart = broken_chart("projector-deployment.yaml", "imagePullPolicy:", "imagePullPolice:")
    problems = schema_problems(manifests(render(load_values("default"), chart)), KUBERNETES_VERSIONS[-1])
    assert any("imagePullPolice" in problem for problem in problems), problems


def test_an_unknown_kind_is_not_skipped() -> None:
    docs = [{"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}]
    assert schema_problems(docs, KUBERNETES_VERSIONS[0])


@pytest.mark.parametrize(
    ("template", "old", "new", "check", "expected"),
    [
        (
            "api-deployment.yaml",
            "with $values.readinessProbe",
            "with $values.livenessProbe",
            "probes",
            "readinessProbe must httpGet /readyz",
        ),
        ("api-deployment.yaml", "{{- with $values.readinessProbe }}", "{{- with false }}", "probes", "readinessProbe"),
        (
            "projector-deployment.yaml",
            "with $values.readinessProbe",
            "with $values.livenessProbe",
            "probes",
            "projector readinessProbe must httpGet /readyz",
        ),
        (
            "sweeper-deployment.yaml",
            'include "graphledger.healthPort" .',
            'include "graphledger.metricsPort" .',
            "probes",
            "sweeper: containerPort health",
        ),
        (
            "sweeper-deployment.yaml",
            "toYaml .Values.securityContext",
            'toYaml (omit .Values.securityContext "readOnlyRootFilesystem")',
            "security",
            "readOnlyRootFilesystem must be true",
        ),
        ("_helpers.tpl", "enableServiceLinks: false", "enableServiceLinks: true", "security", "enableServiceLinks"),
        ("hook-jobs.yaml", '"weight" "-20"', '"weight" "-5"', "hooks", "order topics ensure before migrate"),
        ("replay-job.yaml", "completionMode: Indexed", "completionMode: NonIndexed", "replay-job", "an Indexed Job"),
        ("replay-job.yaml", '"--indexed-job" ', "", "replay-job", "must run `replay run --indexed-job`"),
        ("replay-job.yaml", '"--run-id" $name', '"--run-id" "fixed"', "replay-job", "share the Job's name"),
        (
            "replay-job.yaml",
            'include "graphledger.selectorLabels" . | trim | nindent 8',
            'include "graphledger.labels" . | trim | nindent 8',
            "replay-job",
            "must not change with the config or the chart's version",
        ),
        ("hook-jobs.yaml", "pre-install,pre-upgrade", "post-install", "hooks", "pre-install,pre-upgrade"),
        ("hook-jobs.yaml", 'list "topics" "ensure"', 'list "topics" "create"', "hooks", "not a graphledger"),
        (
            "_helpers.tpl",
            "- name: GRAPHLEDGER_API_TOKEN\n  valueFrom:\n    secretKeyRef:\n"
            "      name: {{ $v.auth.existingSecret | quote }}\n      key: {{ $v.auth.tokenKey | quote }}",
            "- name: GRAPHLEDGER_API_TOKEN\n  value: {{ $v.auth.existingSecret | quote }}",
            "config",
            "GRAPHLEDGER_API_TOKEN must come from a secretKeyRef",
        ),
        ("_helpers.tpl", "GRAPHLEDGER_PROJECTOR_GROUP_ID:", "GRAPHLEDGER_PROJECTOR_GROUP:", "config", "not a setting"),
        (
            "_helpers.tpl",
            "- name: GRAPHLEDGER_KEY_ENCRYPTION_KEYS\n  valueFrom:\n    secretKeyRef:\n      name: {{ . | quote }}\n"
            '      key: {{ include "graphledger.kekSecretKey" $.root | quote }}',
            "- name: GRAPHLEDGER_KEY_ENCRYPTION_KEYS\n  value: {{ . | quote }}",
            "config",
            "GRAPHLEDGER_KEY_ENCRYPTION_KEYS must come from a secretKeyRef",
        ),
        ("hook-jobs.yaml", '"kek" false', '"kek" true', "kek", "must not get GRAPHLEDGER_KEY_ENCRYPTION_KEYS"),
        ("sweeper-deployment.yaml", '"kek" true', '"kek" false', "kek", "gets no GRAPHLEDGER_KEY_ENCRYPTION_KEYS"),
        ("_helpers.tpl", "helm.sh/chart:", "chart:", "labels", "helm.sh/chart"),
        ("_helpers.tpl", '"scheme" "HTTPS"', '"scheme" "HTTP"', "api-tls", "must ask over HTTPS"),
        ("_helpers.tpl", "path: tls.key", "path: server.key", "api-tls", "is no file mounted from a Secret"),
        ("tests/readyz-test.yaml", '"apiTls" "ca"', '"apiTls" "server"', "api-tls", "must not mount the read API's"),
    ],
)
def test_each_check_flags_a_template_broken_where_it_checks(broken_chart, template, old, new, check, expected) -> None:
    chart = broken_chart(template, old, new)
    values = merge(load_values("secure"), {"topics": {"ensure": {"enabled": True}}})
    problems = ALL_CHECKS[check](manifests(render(values, chart)))
    assert any(expected in problem for problem in problems), problems


def test_a_stale_checksum_is_caught(rendered) -> None:
    docs = docs_of(rendered, "default")
    text = dict(rendered["default"])
    path = next(path for path in text if path.endswith("/configmap.yaml"))
    text[path] = text[path].replace("graphledger-projector", "another-group")
    assert checksum_problems(docs, text)
