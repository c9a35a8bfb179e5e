"""examples/: the agent Deployment validates against the Kubernetes schemas and takes its settings from a
Secret, and the example environment file holds only settings. examples/agent.py running against the dev
stack is `acceptance/test_example_agent.py`."""

from __future__ import annotations

import os
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from graphledger.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PREFIX = str(Settings.model_config.get("env_prefix", ""))
SETTING_VARIABLES = {f"{PREFIX}{name}".upper() for name in Settings.model_fields}


def example_env() -> dict[str, str]:
    lines = (EXAMPLES / "agent.env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


@pytest.fixture(scope="module")
def deployment() -> dict:
    [doc] = [doc for doc in yaml.safe_load_all((EXAMPLES / "agent-deployment.yaml").read_text()) if doc]
    return doc


@pytest.mark.parametrize("version", ["1.28", "1.32"])
def test_the_agent_deployment_is_valid(deployment, version: str) -> None:
    kubernetes_validate.validate(deployment, version, strict=True)


def test_the_agent_pod_takes_its_settings_from_a_secret(deployment) -> None:
    spec = deployment["spec"]["template"]["spec"]
    assert spec["enableServiceLinks"] is False  # a graphledger-api Service would shadow a setting
    [container] = spec["containers"]
    assert container["envFrom"] == [{"secretRef": {"name": "my-agent-graphledger"}}]
    assert not [e for e in container.get("env", []) if e["name"].startswith(PREFIX)]  # all from the Secret
    assert container["command"][:2] == ["python", "/app/agent.py"]
    # The CA file the environment names is where the Deployment mounts the CA Secret.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    [item] = volumes["kafka-tls"]["secret"]["items"]
    assert example_env()["GRAPHLEDGER_KAFKA_SSL_CAFILE"] == f"{mounts['kafka-tls']}/{item['path']}"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert mounts["tmp"] == "/tmp" and "emptyDir" in volumes["tmp"]


def test_the_example_environment_is_settings_that_validate(monkeypatch) -> None:
    env = example_env()
    assert set(env) <= SETTING_VARIABLES, set(env) - SETTING_VARIABLES
    assert env["GRAPHLEDGER_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    for key in list(os.environ):
        if key.startswith(PREFIX):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.kafka_sasl_mechanism == "SCRAM-SHA-512"
    # The URL the chart's NOTES print for a release "graphledger" in namespace "graphledger".
    assert settings.api_url == "http://graphledger-read-api.graphledger.svc.cluster.local:8080"
