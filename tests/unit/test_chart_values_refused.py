"""Values the Helm chart does not install: wrong types (its values.schema.json), combinations that
cannot work (the render fails naming the value to fix), no token unless anonymous access is asked for in
so many words, and its defaults alone; and every setting has a way into the chart.
"""

from __future__ import annotations

import json
import re

import helm_python as helm
import pytest

from chart_checks import (
    CHART,
    PREFIX,
    SECRET_VARIABLES,
    SETTING_VARIABLES,
    load_values,
    manifests,
    merge,
    of_kind,
    render,
)

BAD_TYPES = {
    "allowAnonymous as a word": {"auth": {"allowAnonymous": "yes"}},
    "read API TLS Secret that is no Secret name": {"api": {"tls": {"existingSecret": "TLS_Secret"}}},
    "TLS files mounted at a relative path": {"api": {"tls": {"mountPath": "tls"}}},
    "replica count as a word": {"api": {"replicaCount": "two"}},
    "unknown top-level value": {"replicaCount": 2},
    "port as a string": {"api": {"port": "8080"}},
    "unknown security protocol": {"kafka": {"securityProtocol": "TLS"}},
    "no partitions": {"topics": {"partitions": 0}},
    "no in-sync replicas": {"topics": {"minInsyncReplicas": 0}},
    "in-sync replicas as a word": {"topics": {"minInsyncReplicas": "two"}},
    "single-broker acks as a word": {"topics": {"ensure": {"allowSingleBrokerAcks": "yes"}}},
    "bootstrap server without a port": {"kafka": {"bootstrapServers": "kafka"}},
    "secret in config": {"config": {"GRAPHLEDGER_API_TOKEN": "hunter2"}},
    "DSN in config": {"config": {"GRAPHLEDGER_POSTGRES_DSN": "postgresql://u:p@db/x"}},
    "setting with its own value in config": {"config": {"GRAPHLEDGER_TOPIC_PREFIX": "x"}},
    "misspelled setting in config": {"config": {"GRAPHLEDGER_BATCH_MAX_EVENT": "10"}},
    "schema name that is not an identifier": {"postgres": {"schema": "Graph-Ledger"}},
    "key store schema that is not an identifier": {"postgres": {"keyStoreSchema": "Keys"}},
    "encryptEvents as a word": {"erasure": {"encryptEvents": "yes"}},
    "key-encryption keys' Secret that is no Secret name": {
        "erasure": {"keyEncryptionKeys": {"existingSecret": "My_Keys"}}
    },
    "key-encryption keys' Secret without a key": {"erasure": {"keyEncryptionKeys": {"key": ""}}},
    "unknown erasure value": {"erasure": {"keys": "kek-1:AAAA"}},
    "key-encryption keys in config": {"config": {"GRAPHLEDGER_KEY_ENCRYPTION_KEYS": "kek-1:AAAA"}},
    "encryption in config": {"config": {"GRAPHLEDGER_ENCRYPT_EVENTS": "false"}},
}


@pytest.mark.parametrize("case", sorted(BAD_TYPES))
def test_schema_rejects_wrong_values(case: str) -> None:
    values = merge(load_values("default"), BAD_TYPES[case])
    with pytest.raises(helm.HelmValuesError):
        render(values)
    report = helm.lint(CHART, values)
    assert any(message["severity"] == 3 for message in report["messages"]), report


BAD_COMBINATIONS = {
    "kafka.bootstrapServers is required": {"kafka": {"bootstrapServers": ""}},
    "postgres.existingSecret is required": {"postgres": {"existingSecret": ""}},
    "kafka.sasl.mechanism is required": {"kafka": {"securityProtocol": "SASL_SSL"}},
    "kafka.sasl.existingSecret is required": {
        "kafka": {"securityProtocol": "SASL_PLAINTEXT", "sasl": {"mechanism": "PLAIN", "username": "u"}}
    },
    "but kafka.securityProtocol is PLAINTEXT": {"kafka": {"tls": {"caSecret": {"name": "ca"}}}},
    "exclude each other": {"projector": {"keda": {"enabled": True}, "autoscaling": {"enabled": True}}},
    "topics.minInsyncReplicas 4 exceeds topics.replicationFactor 3": {"topics": {"minInsyncReplicas": 4}},
    "needs metrics.enabled": {"metrics": {"serviceMonitor": {"enabled": True}}},
    "metrics.prometheusRule.enabled needs metrics.enabled": {"metrics": {"prometheusRule": {"enabled": True}}},
    "postgres.keyStoreSchema graphledger is postgres.schema graphledger": {
        "postgres": {"keyStoreSchema": "graphledger"}
    },
    "postgres.keyStoreSchema graphledger_rebuild is postgres.schema": {
        "postgres": {"keyStoreSchema": "graphledger_rebuild"}
    },
    "postgres.keyStoreSchema graphledger_old_1 is postgres.schema": {
        "postgres": {"keyStoreSchema": "graphledger_old_1"}
    },
}


@pytest.mark.parametrize("message", sorted(BAD_COMBINATIONS))
def test_values_that_cannot_work_fail_the_render_with_the_value_to_fix(message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        render(merge(load_values("default"), BAD_COMBINATIONS[message]))


def test_without_a_token_the_chart_does_not_render_unless_told_in_so_many_words() -> None:
    """The smallest values less the token fail naming both ways out; allowAnonymous renders an API that
    reads without a token, but never behind an Ingress, and never while agents would need data keys."""
    smallest = load_values("default")
    tokenless = {**smallest, "auth": {}}
    with pytest.raises(helm.HelmRenderError) as refused:
        render(tokenless)
    assert "auth.existingSecret" in str(refused.value) and "auth.allowAnonymous" in str(refused.value)
    anonymous = merge(tokenless, {"auth": {"allowAnonymous": True}, "erasure": {"encryptEvents": False}})
    configmap = of_kind(manifests(render(anonymous)), "ConfigMap")[0]["data"]
    assert not {f"{PREFIX}API_TOKEN", f"{PREFIX}API_TOKEN_HASHES"} & set(configmap)
    with pytest.raises(helm.HelmRenderError, match=re.escape("auth.allowAnonymous needs erasure.encryptEvents false")):
        render(merge(anonymous, {"erasure": {"encryptEvents": True}}))
    behind_ingress = merge(anonymous, {"api": {"ingress": {"enabled": True}}})
    with pytest.raises(helm.HelmRenderError, match=re.escape("api.ingress.enabled needs auth.existingSecret")):
        render(behind_ingress)
    assert of_kind(manifests(render(merge(behind_ingress, {"auth": {"existingSecret": "t"}}))), "Ingress")


def test_chart_defaults_alone_do_not_install() -> None:
    """No Kafka or Postgres to default to: an install without them stops before touching the cluster."""
    with pytest.raises(helm.HelmRenderError, match=r"kafka\.bootstrapServers is required"):
        render({})


def test_every_setting_has_a_way_into_the_chart() -> None:
    """Each setting is a value of its own, a Secret reference, or allowed in `config` (never both), so
    a new setting fails here until values.schema.json says how a release sets it."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    allowed = set(schema["properties"]["config"]["propertyNames"]["enum"])
    data = of_kind(manifests(render(load_values("secure"))), "ConfigMap")[0]["data"]
    own_value = {key for key in data if key.startswith(PREFIX)} - allowed
    client_only = {  # agents' settings; the services never read them
        f"{PREFIX}API_URL",
        f"{PREFIX}API_CA_FILE",
        f"{PREFIX}CLIENT_LOG_READS",
        f"{PREFIX}CLIENT_THREAD_MEMORY_BYTES",
        f"{PREFIX}CLIENT_FRESH_KEYS",
        f"{PREFIX}WRITE_OWNERSHIP",
    }
    assert allowed <= SETTING_VARIABLES, f"stale names in values.schema.json config: {allowed - SETTING_VARIABLES}"
    assert not allowed & (own_value | SECRET_VARIABLES)
    missing = SETTING_VARIABLES - allowed - own_value - SECRET_VARIABLES - client_only
    assert not missing, f"add {sorted(missing)} to config.propertyNames.enum in charts/graphledger/values.schema.json"
