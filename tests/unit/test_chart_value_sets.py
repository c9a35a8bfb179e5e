"""What each value set of the Helm chart turns on, asserted on the rendered manifests: the default
install, the ingress, KEDA, the Prometheus rule, the Secrets and who mounts them, the topics job, the read
API's TLS, `helm test`, service links and the release notes.
"""

from __future__ import annotations

from typing import Any

import yaml

from chart_checks import (
    CHART,
    KEK_VARIABLE,
    NAMESPACE,
    PREFIX,
    RELEASE,
    SETTING_VARIABLES,
    VALUE_SETS,
    component,
    docs_of,
    env_of,
    load_values,
    manifests,
    merge,
    mounted_files,
    named,
    notes,
    of_kind,
    pod_spec,
    render,
    settings_of,
    workloads,
)
from graphledger.settings import Settings


def test_default_install(rendered) -> None:
    docs = docs_of(rendered, "default")
    kinds = sorted(doc["kind"] for doc in docs)
    expected = ["ConfigMap", "ServiceAccount", "Service", "HorizontalPodAutoscaler", "Secret"]  # the KEK's
    expected += ["Deployment"] * 3 + ["Job"] * 2 + ["PodDisruptionBudget"] * 2 + ["Pod"]  # `helm test`
    assert kinds == sorted(expected)
    # The projector and the sweeper are probed on their health port (probe_problems checks how).
    for suffix in ("-projector", "-sweeper"):
        [container] = pod_spec(named(docs, "Deployment", suffix))["containers"]
        assert {"startupProbe", "livenessProbe", "readinessProbe"} <= container.keys()
    assert not of_kind(docs, "PrometheusRule")  # metrics off by default
    # The HPA owns the API's replica count; the projector's is fixed.
    assert "replicas" not in named(docs, "Deployment", "-api")["spec"]
    assert named(docs, "Deployment", "-projector")["spec"]["replicas"] == 2
    image = pod_spec(named(docs, "Deployment", "-api"))["containers"][0]["image"]
    assert image == f"graphledger:{yaml.safe_load((CHART / 'Chart.yaml').read_text())['appVersion']}"


def test_ingress_routes_to_the_read_api_service(rendered) -> None:
    docs = docs_of(rendered, "ingress")
    [ingress] = of_kind(docs, "Ingress")
    [service] = of_kind(docs, "Service")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": service["metadata"]["name"], "port": {"name": "http"}}
    assert ingress["spec"]["tls"][0]["secretName"] == "graphledger-tls"
    assert all(doc["metadata"]["name"].startswith("ledger") for doc in docs)  # fullnameOverride
    assert not [doc for doc in of_kind(docs, "Deployment") if doc["metadata"]["name"].endswith("-sweeper")]
    assert named(docs, "Deployment", "-api")["spec"]["replicas"] == 3  # autoscaling off


def test_keda_scales_the_projector_on_lag_capped_at_the_partitions(rendered) -> None:
    docs = docs_of(rendered, "keda")
    values = load_values("keda")
    [scaled] = of_kind(docs, "ScaledObject")
    [configmap] = of_kind(docs, "ConfigMap")
    projector = named(docs, "Deployment", "-projector")
    assert scaled["spec"]["scaleTargetRef"]["name"] == projector["metadata"]["name"]
    assert values["projector"]["keda"]["maxReplicaCount"] > values["topics"]["partitions"]
    assert scaled["spec"]["maxReplicaCount"] == values["topics"]["partitions"]
    assert "replicas" not in projector["spec"]  # KEDA owns it
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "kafka"
    assert trigger["metadata"]["consumerGroup"] == configmap["data"]["GRAPHLEDGER_PROJECTOR_GROUP_ID"]
    assert trigger["metadata"]["bootstrapServers"] == configmap["data"]["GRAPHLEDGER_KAFKA_BOOTSTRAP_SERVERS"]
    # The lag: no topic, so KEDA sums every topic the group commits offsets for (the projector commits
    # both, tests/integration/test_kafka_group_offsets.py); a partition without a commit counts whole;
    # a stopped partition's persistent lag is left out. KEDA reads metadata values as strings.
    lag = {key: value for key, value in trigger["metadata"].items() if key not in {"bootstrapServers", "sasl", "tls"}}
    keda = {**yaml.safe_load((CHART / "values.yaml").read_text())["projector"]["keda"], **values["projector"]["keda"]}
    assert lag == {
        "consumerGroup": "graphledger-projector",
        "lagThreshold": str(keda["lagThreshold"]),
        "activationLagThreshold": str(keda["activationLagThreshold"]),
        "offsetResetPolicy": "earliest",
        "scaleToZeroOnInvalidOffset": "false",
        "excludePersistentLag": "true",
        "allowIdleConsumers": "false",
    }
    assert trigger["metadata"]["sasl"] == "scram_sha512" and trigger["metadata"]["tls"] == "enable"
    # KEDA authenticates with the Secret the projector uses.
    [auth] = of_kind(docs, "TriggerAuthentication")
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    env = env_of(pod_spec(projector)["containers"][0])
    password = env["GRAPHLEDGER_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]
    refs = {ref["parameter"]: {"name": ref["name"], "key": ref["key"]} for ref in auth["spec"]["secretTargetRef"]}
    assert refs["password"] == password
    assert refs["username"] == env["GRAPHLEDGER_KAFKA_SASL_USERNAME"]["valueFrom"]["secretKeyRef"]
    # The observability values pass through as the standard OTEL_* variables.
    assert configmap["data"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == values["otel"]["endpoint"]
    assert "deployment.environment=staging" in configmap["data"]["OTEL_RESOURCE_ATTRIBUTES"]
    assert configmap["data"]["OTEL_EXPORTER_PROMETHEUS_PORT"] == str(values["metrics"]["port"])
    [monitor] = of_kind(docs, "ServiceMonitor")
    metrics_service = named(docs, "Service", "-metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= metrics_service["metadata"]["labels"].items()
    assert all(
        {"name": "metrics", "containerPort": values["metrics"]["port"], "protocol": "TCP"}
        in pod_spec(deployment)["containers"][0]["ports"]
        for deployment in of_kind(docs, "Deployment")
    )


def test_the_prometheus_rule_holds_the_plain_rule_file(rendered) -> None:
    """The PrometheusRule's groups are files/prometheus-rules.yaml's, as they are (one source, tested by
    promtool in tests/unit/test_alert_rules.py), with the labels a ruleSelector matches."""
    [rule] = of_kind(docs_of(rendered, "keda"), "PrometheusRule")
    plain = yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
    assert rule["spec"] == plain and len(plain["groups"]) >= 3
    selector = load_values("keda")["metrics"]["prometheusRule"]["labels"]
    assert selector.items() <= rule["metadata"]["labels"].items()


def test_secrets_are_mounted_and_referenced_only_where_needed(rendered) -> None:
    docs = docs_of(rendered, "secure")
    values = load_values("secure")
    [configmap] = of_kind(docs, "ConfigMap")
    data = configmap["data"]
    mount_path = "/etc/graphledger/kafka-tls"
    assert data["GRAPHLEDGER_KAFKA_SSL_CAFILE"] == f"{mount_path}/ca.crt"
    assert data["GRAPHLEDGER_KAFKA_SSL_CERTFILE"] == f"{mount_path}/client.crt"
    assert data["GRAPHLEDGER_KAFKA_SSL_KEYFILE"] == f"{mount_path}/client.key"
    assert data["GRAPHLEDGER_BATCH_MAX_EVENTS"] == "2000"  # from `config`
    needs = {  # component: (Kafka, Postgres, API token, key-encryption keys)
        "projector": (True, True, False, True),
        "sweeper": (True, True, False, True),
        "api": (True, True, True, True),  # consistent reads ask Kafka where the log ends; erasures publish
        "migrate": (False, True, False, False),
        "replay": (True, True, False, True),  # the projector's code on the whole log
        "test": (False, False, False, False),
    }
    seen = set()
    for doc in workloads(docs):
        kafka, postgres, token, kek = needs[component(doc)]
        seen.add(component(doc))
        spec = pod_spec(doc)
        [container] = spec["containers"]
        env = env_of(container)
        assert ("GRAPHLEDGER_KAFKA_SASL_PASSWORD" in env) == kafka, doc["metadata"]["name"]
        assert ("GRAPHLEDGER_POSTGRES_DSN" in env) == postgres, doc["metadata"]["name"]
        assert ("GRAPHLEDGER_API_TOKEN" in env) == token, doc["metadata"]["name"]
        assert (KEK_VARIABLE in env) == kek, doc["metadata"]["name"]
        if kek:  # the Secret named in the values, none of the chart's
            assert env[KEK_VARIABLE]["valueFrom"]["secretKeyRef"] == {
                "name": "graphledger-kek",
                "key": "key-encryption-keys",
            }
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert ("kafka-tls" in mounts) == kafka
        if kafka:
            assert mounts["kafka-tls"]["mountPath"] == mount_path and mounts["kafka-tls"]["readOnly"]
            [volume] = [v for v in spec["volumes"] if v["name"] == "kafka-tls"]
            files = {
                item["path"]: (source["secret"]["name"], item["key"])
                for source in volume["projected"]["sources"]
                for item in source["secret"]["items"]
            }
            assert files == {
                "ca.crt": ("my-cluster-cluster-ca-cert", "ca.crt"),
                "client.crt": ("graphledger-kafka-client", "user.crt"),
                "client.key": ("graphledger-kafka-client", "user.key"),
            }
        assert spec["serviceAccountName"] == values["serviceAccount"]["name"]
        assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}]
        assert container["image"] == f"{values['image']['repository']}@{values['image']['digest']}"
    assert seen == set(needs)  # topics ensure is off in this set
    assert not of_kind(docs, "ServiceAccount")  # serviceAccount.create false
    assert not of_kind(docs, "Secret")  # erasure.keyEncryptionKeys.existingSecret is named
    policies = {doc["metadata"]["name"].removeprefix(f"{RELEASE}-"): doc for doc in of_kind(docs, "NetworkPolicy")}
    assert set(policies) == {"api", "workers", "egress"}
    assert policies["workers"]["spec"]["ingress"] == []
    peers = policies["api"]["spec"]["ingress"][0]["from"]
    assert peers[:-1] == values["networkPolicy"]["apiFrom"]
    test_pod = named(docs, "Pod", "-test-readyz")
    assert peers[-1]["podSelector"]["matchLabels"].items() <= test_pod["metadata"]["labels"].items()
    projector_hpa = named(docs, "HorizontalPodAutoscaler", "-projector")
    assert projector_hpa["spec"]["maxReplicas"] == 12  # 40 asked, capped at topics.partitions


def test_topics_job_gets_kafka_and_nothing_of_postgres(rendered) -> None:
    docs = docs_of(rendered, "keda")  # SASL with the user name in a Secret
    topics = named(docs, "Job", "-topics")
    [container] = pod_spec(topics)["containers"]
    env = env_of(container)
    assert container["args"] == ["topics", "ensure"]
    assert "GRAPHLEDGER_POSTGRES_DSN" not in env
    assert env["GRAPHLEDGER_KAFKA_SASL_USERNAME"]["valueFrom"]["secretKeyRef"]["key"] == "username"
    # The hook's inline settings are exactly the ConfigMap's (one helper renders both).
    [configmap] = of_kind(docs, "ConfigMap")
    inline = {name: entry["value"] for name, entry in env.items() if "value" in entry and name != "OTEL_SERVICE_NAME"}
    assert inline == configmap["data"]


def test_min_insync_replicas_reaches_topics_ensure_as_a_setting() -> None:
    """Unset, the setting's default applies (min(2, replicationFactor)); set, every pod gets it, and a
    one-broker cluster says in so many words that it accepts single-broker acknowledgements."""

    def settings_of(values: dict[str, Any]) -> Settings:
        data = of_kind(manifests(render(merge(load_values("default"), values))), "ConfigMap")[0]["data"]
        env = {key[len(PREFIX) :].lower(): value for key, value in data.items() if key.startswith(PREFIX)}
        return Settings(**env)

    default = settings_of({})
    assert default.topic_min_insync_replicas is None and default.min_insync_replicas == 2
    assert default.topic_allow_single_broker_acks is False
    three = settings_of({"topics": {"replicationFactor": 5, "minInsyncReplicas": 3}})
    assert three.min_insync_replicas == 3
    one_broker = settings_of({"topics": {"replicationFactor": 1, "ensure": {"allowSingleBrokerAcks": True}}})
    assert one_broker.min_insync_replicas == 1 and one_broker.topic_allow_single_broker_acks is True


def test_helm_test_asks_the_read_api_service_for_readyz(rendered) -> None:
    docs = docs_of(rendered, "default")
    pod = named(docs, "Pod", "-test-readyz")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    [service] = of_kind(docs, "Service")
    url, ca_file = pod["spec"]["containers"][0]["command"][-2:]
    port = service["spec"]["ports"][0]["port"]
    assert url == f"http://{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local:{port}/readyz"
    assert ca_file == ""  # plain HTTP: nothing to verify


def test_the_read_api_serves_tls_from_its_secret_and_everyone_verifies_it(rendered) -> None:
    """api.tls.existingSecret: the certificate and key reach the read API (and nothing else), its probes
    ask over HTTPS, and agents and `helm test` get an https:// URL and the CA that signed it."""
    docs = docs_of(rendered, "secure")
    secret = load_values("secure")["api"]["tls"]["existingSecret"]
    data = of_kind(docs, "ConfigMap")[0]["data"]
    api = named(docs, "Deployment", "-api")
    assert (
        mounted_files(api).items()
        >= {
            data[f"{PREFIX}API_TLS_CERTFILE"]: (secret, "tls.crt"),
            data[f"{PREFIX}API_TLS_KEYFILE"]: (secret, "tls.key"),
        }.items()
    )
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert pod_spec(api)["containers"][0][probe]["httpGet"]["scheme"] == "HTTPS"
    [service] = of_kind(docs, "Service")
    assert service["spec"]["ports"][0]["appProtocol"] == "https"
    url = f"https://{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local:{service['spec']['ports'][0]['port']}"
    pod = named(docs, "Pod", "-test-readyz")
    test_url, ca_file = pod["spec"]["containers"][0]["command"][-2:]
    assert test_url == f"{url}/readyz" and mounted_files(pod) == {ca_file: (secret, "ca.crt")}
    text = notes(rendered["secure"])
    assert f"GRAPHLEDGER_API_URL={url}\n" in text
    assert f"GRAPHLEDGER_API_CA_FILE=<path of the CA mounted from key ca.crt of Secret {secret}>" in text
    assert "plain HTTP" not in text and "plain HTTP" in notes(rendered["default"])
    # The services accept the paths the ConfigMap gives them; the probes are plain where TLS is off.
    settings_of(data, None)
    assert all("scheme" not in (probe.get("httpGet") or {}) for probe in (
        pod_spec(named(docs_of(rendered, "default"), "Deployment", "-api"))["containers"][0][name]
        for name in ("startupProbe", "livenessProbe", "readinessProbe")
    ))  # fmt: skip


def test_service_links_cannot_shadow_a_setting(rendered) -> None:
    """Kubernetes gives every pod <SERVICE>_PORT and friends for each Service of its namespace
    (unless enableServiceLinks is false, which agent pods may not set): none may be a setting."""
    for value_set in VALUE_SETS:
        for service in of_kind(docs_of(rendered, value_set), "Service"):
            base = service["metadata"]["name"].upper().replace("-", "_")
            links = {f"{base}_SERVICE_HOST", f"{base}_SERVICE_PORT", f"{base}_PORT"}
            for port in service["spec"]["ports"]:
                links |= {f"{base}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}"}
                links |= {f"{base}_PORT_{port['port']}_TCP{suffix}" for suffix in ("", "_PROTO", "_PORT", "_ADDR")}
            assert not links & SETTING_VARIABLES, (value_set, service["metadata"]["name"])


def test_notes_tell_an_agent_what_to_set(rendered) -> None:
    text = notes(rendered["secure"])
    service = of_kind(docs_of(rendered, "secure"), "Service")[0]["metadata"]["name"]
    assert f"GRAPHLEDGER_API_URL=https://{service}.{NAMESPACE}.svc.cluster.local:8080" in text
    assert "GRAPHLEDGER_KAFKA_BOOTSTRAP_SERVERS=my-cluster-kafka-bootstrap.kafka:9093" in text
    assert "GRAPHLEDGER_TOPIC_PREFIX=prod-graphledger" in text
    assert "GRAPHLEDGER_API_TOKEN=<key token of Secret graphledger-api-token>" in text
    assert "GRAPHLEDGER_KAFKA_SASL_MECHANISM=SCRAM-SHA-512" in text
    assert "enableServiceLinks: false" in text
    for value_set in VALUE_SETS:
        mentioned = {word.split("=")[0] for word in notes(rendered[value_set]).split() if word.startswith(PREFIX)}
        assert mentioned <= SETTING_VARIABLES, mentioned - SETTING_VARIABLES
    assert "allowAnonymous is on" in notes(rendered["anonymous"]) and "allowAnonymous" not in notes(rendered["default"])
    assert "Metrics are off" in notes(rendered["default"]) and "Metrics are off" not in notes(rendered["keda"])
