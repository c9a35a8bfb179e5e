"""The Helm chart (charts/graphledger), checked offline: Helm's own lint and render (helm-python-sdk, the
Helm SDK as a library), every rendered manifest against the Kubernetes schemas of several minor versions
(kubernetes-validate, strict), and the properties a platform team relies on, asserted on the output.

Each check is a function returning the problems it finds, so the same checks are shown to fail on a
deliberately broken copy of the chart at the end of this module.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from graphledger.settings import Settings
from graphledger_server.cli import build_parser
from graphledger_server.keys.ring import KEY_BYTES, KeyRing, KeyRingError, new_key_entry, parse_keys
from graphledger_server.keys.store import check_key_settings

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "graphledger"
RELEASE = "graphledger"
NAMESPACE = "graphledger"
# The oldest minor kubernetes-validate ships (near the chart's kubeVersion floor) and two newer ones.
KUBERNETES_VERSIONS = ("1.28", "1.30", "1.32")
# Custom resources: not in the core schemas, so the only kinds whose schema validation is skipped.
CRD_KINDS = frozenset({"ScaledObject", "TriggerAuthentication", "ServiceMonitor", "PrometheusRule"})
# The value sets: the smallest install and three non-default ones (ci/ is the chart-testing convention).
VALUE_SETS = {path.stem.removesuffix("-values"): path for path in sorted((CHART / "ci").glob("*-values.yaml"))}

PREFIX = str(Settings.model_config.get("env_prefix", ""))
SETTING_VARIABLES = {f"{PREFIX}{name}".upper() for name in Settings.model_fields}
# Settings a pod must only ever get from a Secret: every SecretStr, and the DSN (it holds a password).
SECRET_VARIABLES = {
    f"{PREFIX}{name}".upper() for name, field in Settings.model_fields.items() if "SecretStr" in str(field.annotation)
} | {f"{PREFIX}POSTGRES_DSN"}
KEK_VARIABLE = f"{PREFIX}KEY_ENCRYPTION_KEYS"
# The pods that seal or open events: the projector, the read API (clients' keys) and the sweeper.
KEK_COMPONENTS = frozenset({"projector", "api", "sweeper"})

Manifest = dict[str, Any]


# -- rendering ---------------------------------------------------------------------------------------


def load_values(name: str) -> dict[str, Any]:
    return yaml.safe_load(VALUE_SETS[name].read_text()) or {}


def render(values: dict[str, Any], chart: Path = CHART) -> dict[str, str]:
    with helm.Chart.load(chart) as loaded:
        return loaded.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)


def manifests(rendered: dict[str, str]) -> list[Manifest]:
    docs: list[Manifest] = []
    for path, text in sorted(rendered.items()):
        if path.endswith(".yaml"):
            docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


def notes(rendered: dict[str, str]) -> str:
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[str, str]]:
    """Each value set rendered once for the whole module."""
    return {name: render(load_values(name)) for name in VALUE_SETS}


def docs_of(rendered: dict[str, dict[str, str]], name: str) -> list[Manifest]:
    return manifests(rendered[name])


def of_kind(docs: list[Manifest], kind: str) -> list[Manifest]:
    return [doc for doc in docs if doc["kind"] == kind]


def named(docs: list[Manifest], kind: str, suffix: str) -> Manifest:
    [doc] = [doc for doc in of_kind(docs, kind) if doc["metadata"]["name"].endswith(suffix)]
    return doc


def workloads(docs: list[Manifest]) -> Iterator[Manifest]:
    """Everything that runs a pod: the Deployments, the hook Jobs and `helm test`'s Pod."""
    yield from (doc for doc in docs if doc["kind"] in {"Deployment", "Job", "Pod"})


def pod_spec(doc: Manifest) -> dict[str, Any]:
    return doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]


def component(doc: Manifest) -> str:
    return doc["metadata"]["labels"]["app.kubernetes.io/component"]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in container.get("env", [])}


# -- the checks --------------------------------------------------------------------------------------


def schema_problems(docs: list[Manifest], version: str) -> list[str]:
    """Every manifest against the strict Kubernetes schemas of `version`; CRD kinds explicitly skipped."""
    problems = []
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            continue
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(part) for part in exc.path)
            problems.append(f"{where} against {version}: {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(f"{where}: no schema ({exc.message}); only {sorted(CRD_KINDS)} may lack one")
    return problems


def security_problems(docs: list[Manifest]) -> list[str]:
    """Non-root, read-only root filesystem, no privilege escalation, no capabilities, RuntimeDefault."""
    problems = []
    for doc in workloads(docs):
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        spec = pod_spec(doc)
        pod = spec.get("securityContext", {})
        if pod.get("runAsNonRoot") is not True or not pod.get("runAsUser"):
            problems.append(f"{where}: pod securityContext must set runAsNonRoot and a non-zero runAsUser")
        if pod.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            problems.append(f"{where}: pod seccompProfile must be RuntimeDefault")
        if spec.get("automountServiceAccountToken") is not False:
            problems.append(f"{where}: the pods never call the Kubernetes API: automountServiceAccountToken false")
        if spec.get("enableServiceLinks") is not False:
            problems.append(f"{where}: enableServiceLinks must be false (service links look like settings)")
        tmp_volumes = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
        for container in spec["containers"]:
            ctx = container.get("securityContext", {})
            name = f"{where}/{container['name']}"
            if ctx.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{name}: readOnlyRootFilesystem must be true")
            if ctx.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{name}: allowPrivilegeEscalation must be false")
            if ctx.get("capabilities", {}).get("drop") != ["ALL"]:
                problems.append(f"{name}: capabilities must drop ALL")
            if ctx.get("privileged"):
                problems.append(f"{name}: must not be privileged")
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            if mounts.get("/tmp") not in tmp_volumes:
                problems.append(f"{name}: /tmp must be an emptyDir (HOME and TMPDIR point there)")
            resources = container.get("resources", {})
            if not resources.get("requests") or "memory" not in resources.get("limits", {}):
                problems.append(f"{name}: needs resource requests and a memory limit")
    return problems


def probe_problems(docs: list[Manifest]) -> list[str]:
    """The read API: liveness /healthz, readiness /readyz, startup, on its named HTTP port. The projector
    and the sweeper: liveness and startup /livez, readiness /readyz, on their `health` port, which is
    where GRAPHLEDGER_HEALTH_PORT makes them listen, on every address."""
    problems = worker_probe_problems(docs)
    api = named(docs, "Deployment", "-api")
    [container] = pod_spec(api)["containers"]
    ports = {port["name"]: port["containerPort"] for port in container.get("ports", [])}
    expected = {"livenessProbe": "/healthz", "readinessProbe": "/readyz", "startupProbe": "/healthz"}
    for probe, path in expected.items():
        get = container.get(probe, {}).get("httpGet", {})
        if get.get("path") != path or get.get("port") not in ports:
            problems.append(f"api {probe} must httpGet {path} on a declared port, not {get}")
    env = env_of(container)
    configmap = of_kind(docs, "ConfigMap")[0]["data"]
    listen_port = int(env.get("GRAPHLEDGER_API_PORT", {}).get("value", configmap["GRAPHLEDGER_API_PORT"]))
    if ports.get("http") != listen_port:
        problems.append(f"api containerPort {ports.get('http')} is not GRAPHLEDGER_API_PORT {listen_port}")
    if configmap.get("GRAPHLEDGER_API_HOST") not in {"0.0.0.0", "::"}:
        problems.append("GRAPHLEDGER_API_HOST must listen on every address in a pod")
    return problems


def worker_probe_problems(docs: list[Manifest]) -> list[str]:
    problems = []
    configmap = of_kind(docs, "ConfigMap")[0]["data"]
    if configmap.get("GRAPHLEDGER_HEALTH_HOST") not in {"0.0.0.0", "::"}:
        problems.append("GRAPHLEDGER_HEALTH_HOST must listen on every address in a pod")
    expected = {"startupProbe": "/livez", "livenessProbe": "/livez", "readinessProbe": "/readyz"}
    for doc in of_kind(docs, "Deployment"):
        if component(doc) not in {"projector", "sweeper"}:
            continue
        [container] = pod_spec(doc)["containers"]
        ports = {port["name"]: port["containerPort"] for port in container.get("ports") or []}
        if str(ports.get("health")) != configmap.get("GRAPHLEDGER_HEALTH_PORT"):
            problems.append(
                f"{component(doc)}: containerPort health {ports.get('health')} is not GRAPHLEDGER_HEALTH_PORT"
            )
        for probe, path in expected.items():
            get = container.get(probe, {}).get("httpGet", {})
            if get.get("path") != path or get.get("port") != "health":
                problems.append(f"{component(doc)} {probe} must httpGet {path} on port health, not {get}")
    return problems


def hook_problems(docs: list[Manifest]) -> list[str]:
    """`topics ensure`, then `migrate`, as pre-install/pre-upgrade Jobs that run before any workload."""
    problems = []
    parser = build_parser()
    weights = {}
    for job in of_kind(docs, "Job"):
        annotations = job["metadata"].get("annotations", {})
        name = job["metadata"]["name"]
        if set(annotations.get("helm.sh/hook", "").split(",")) != {"pre-install", "pre-upgrade"}:
            problems.append(f"{name}: must be a pre-install,pre-upgrade hook")
        if "before-hook-creation" not in annotations.get("helm.sh/hook-delete-policy", ""):
            problems.append(f"{name}: needs hook-delete-policy before-hook-creation (reruns replace it)")
        [container] = pod_spec(job)["containers"]
        try:
            args = parser.parse_args(container["args"])  # a real `graphledger` command line
        except SystemExit:
            problems.append(f"{name}: {container['args']} is not a graphledger command line")
            continue
        weights[args.command] = int(annotations.get("helm.sh/hook-weight", "0"))
        spec = pod_spec(job)
        if spec.get("restartPolicy") != "Never":
            problems.append(f"{name}: restartPolicy Never (the Job's backoffLimit retries)")
        # Hooks run before the release's own ConfigMap and ServiceAccount exist.
        if any("configMapRef" in source for source in container.get("envFrom", [])):
            problems.append(f"{name}: a pre-install hook cannot use the release's ConfigMap")
        if spec.get("serviceAccountName") == f"{RELEASE}" and any(doc["kind"] == "ServiceAccount" for doc in docs):
            problems.append(f"{name}: a pre-install hook cannot use the ServiceAccount the release creates")
    if "topics" in weights and "migrate" in weights and not weights["topics"] < weights["migrate"]:
        problems.append(f"hook weights must order topics ensure before migrate: {weights}")
    if any(weight >= 0 for weight in weights.values()):
        problems.append(f"hook weights should be negative, ahead of any other hook: {weights}")
    for doc in docs:
        hook = doc["metadata"].get("annotations", {}).get("helm.sh/hook")
        if hook and doc["kind"] != "Job" and not (doc["kind"] == "Pod" and hook == "test"):
            problems.append(f"{doc['kind']}/{doc['metadata']['name']}: only the two Jobs and the test Pod are hooks")
    return problems


def config_problems(docs: list[Manifest]) -> list[str]:
    """Every GRAPHLEDGER_* variable is a setting, secrets come only from Secrets, and the values parse."""
    problems = []
    [configmap] = of_kind(docs, "ConfigMap")
    data = configmap["data"]
    for key in data:
        if key.startswith(PREFIX) and key not in SETTING_VARIABLES:
            problems.append(f"ConfigMap key {key} is not a setting")
        if key in SECRET_VARIABLES:
            problems.append(f"ConfigMap holds the secret {key}")
    for doc in workloads(docs):
        for container in pod_spec(doc)["containers"]:
            for name, entry in env_of(container).items():
                where = f"{doc['metadata']['name']}: {name}"
                if name.startswith(PREFIX) and name not in SETTING_VARIABLES:
                    problems.append(f"{where} is not a setting")
                if name in SECRET_VARIABLES and "secretKeyRef" not in entry.get("valueFrom", {}):
                    problems.append(f"{where} must come from a secretKeyRef")
    try:
        Settings(**{key.removeprefix(PREFIX).lower(): value for key, value in data.items() if key.startswith(PREFIX)})
    except Exception as exc:
        problems.append(f"the ConfigMap's settings do not validate: {exc}")
    return problems


def checksum_problems(docs: list[Manifest], rendered: dict[str, str]) -> list[str]:
    """Each Deployment's pods carry the ConfigMap's checksum, so a config change rolls them."""
    configmap = next(text for path, text in rendered.items() if path.endswith("/configmap.yaml"))
    expected = hashlib.sha256(configmap.encode()).hexdigest()
    problems = []
    for doc in of_kind(docs, "Deployment"):
        actual = doc["spec"]["template"]["metadata"].get("annotations", {}).get("checksum/config")
        if actual != expected:
            problems.append(f"{doc['metadata']['name']}: checksum/config {actual} is not the ConfigMap's {expected}")
    return problems


def kek_problems(docs: list[Manifest]) -> list[str]:
    """The key-encryption keys reach the projector, the read API and the sweeper, from a key the Secret
    holds, whenever events are sealed; never another pod (hooks, `helm test`)."""
    problems = []
    [configmap] = of_kind(docs, "ConfigMap")
    sealed = configmap["data"][f"{PREFIX}ENCRYPT_EVENTS"] == "true"
    secrets = {doc["metadata"]["name"]: doc for doc in of_kind(docs, "Secret")}
    for doc in workloads(docs):
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        for container in pod_spec(doc)["containers"]:
            entry = env_of(container).get(KEK_VARIABLE)
            if component(doc) not in KEK_COMPONENTS:
                if entry is not None:
                    problems.append(f"{where} must not get {KEK_VARIABLE}")
            elif entry is None:
                if sealed:
                    problems.append(f"{where} seals or opens events but gets no {KEK_VARIABLE}")
            else:
                ref = entry.get("valueFrom", {}).get("secretKeyRef", {})
                secret = secrets.get(ref.get("name"))
                if secret is not None and ref.get("key") not in secret.get("data", {}):
                    problems.append(f"{where}: {KEK_VARIABLE} names key {ref.get('key')} that {ref['name']} lacks")
    return problems


def mounted_files(doc: Manifest) -> dict[str, tuple[str, str]]:
    """Every file a workload's first container mounts from a Secret: path -> (Secret, key)."""
    spec = pod_spec(doc)
    sources: dict[str, list[dict[str, Any]]] = {}
    for volume in spec.get("volumes", []):
        if "secret" in volume:
            sources[volume["name"]] = [volume["secret"]]
        elif "projected" in volume:
            sources[volume["name"]] = [s["secret"] for s in volume["projected"]["sources"] if "secret" in s]
    files = {}
    for mount in spec["containers"][0].get("volumeMounts", []):
        for secret in sources.get(mount["name"], []):
            name = secret.get("secretName", secret.get("name"))
            for item in secret.get("items", []):
                files[f"{mount['mountPath']}/{item['path']}"] = (name, item["key"])
    return files


def api_tls_problems(docs: list[Manifest]) -> list[str]:
    """With GRAPHLEDGER_API_TLS_* in the ConfigMap, the read API's pods hold those files (mounted from a
    Secret) and no other pod holds its key; its probes ask over HTTPS exactly then."""
    problems = []
    data = of_kind(docs, "ConfigMap")[0]["data"]
    certfile, keyfile = data.get(f"{PREFIX}API_TLS_CERTFILE"), data.get(f"{PREFIX}API_TLS_KEYFILE")
    api = named(docs, "Deployment", "-api")
    scheme = "HTTPS" if certfile else "HTTP"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = pod_spec(api)["containers"][0].get(probe, {}).get("httpGet")
        if get is not None and get.get("scheme", "HTTP") != scheme:
            problems.append(f"api {probe} must ask over {scheme}, not {get.get('scheme', 'HTTP')}")
    files = mounted_files(api)
    for variable, path in (("API_TLS_CERTFILE", certfile), ("API_TLS_KEYFILE", keyfile)):
        if path is not None and path not in files:
            problems.append(f"api: {PREFIX}{variable} {path} is no file mounted from a Secret")
    for doc in workloads(docs):
        if component(doc) != "api" and keyfile is not None and files.get(keyfile) in mounted_files(doc).values():
            problems.append(f"{doc['metadata']['name']} must not mount the read API's private key")
    return problems


def label_problems(docs: list[Manifest]) -> list[str]:
    """Recommended labels everywhere; selectors select their own pods."""
    required = {
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/version",
        "app.kubernetes.io/managed-by",
        "helm.sh/chart",
    }
    problems = []
    for doc in docs:
        missing = required - set(doc["metadata"].get("labels", {}))
        if missing:
            problems.append(f"{doc['kind']}/{doc['metadata']['name']}: missing labels {sorted(missing)}")
        if doc["kind"] == "Deployment":
            selector = doc["spec"]["selector"]["matchLabels"]
            pod_labels = doc["spec"]["template"]["metadata"]["labels"]
            if not selector.items() <= pod_labels.items():
                problems.append(f"Deployment/{doc['metadata']['name']}: selector does not match its pods")
    return problems


ALL_CHECKS: dict[str, Callable[[list[Manifest]], list[str]]] = {
    "security": security_problems,
    "probes": probe_problems,
    "hooks": hook_problems,
    "config": config_problems,
    "kek": kek_problems,
    "labels": label_problems,
    "api-tls": api_tls_problems,
}


# -- lint, render, validate ----------------------------------------------------------------------------


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


# -- what the value sets turn on -------------------------------------------------------------------------


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


# -- erasure's key-encryption keys ---------------------------------------------------------------------

MANAGED_KEK_SECRET = f"{RELEASE}-key-encryption-keys"


def managed_secret(docs: list[Manifest]) -> Manifest:
    return named(docs, "Secret", "-key-encryption-keys")


def kek_value(secret: Manifest) -> str:
    return base64.b64decode(secret["data"]["keys"]).decode()


def components_with_kek(docs: list[Manifest]) -> set[str]:
    return {component(doc) for doc in workloads(docs) if KEK_VARIABLE in env_of(pod_spec(doc)["containers"][0])}


def settings_of(data: dict[str, str], kek: str | None) -> Settings:
    """A service's settings: the ConfigMap's, and the key-encryption keys when its pod gets them."""
    values = {key.removeprefix(PREFIX).lower(): value for key, value in data.items() if key.startswith(PREFIX)}
    return Settings(**values, key_encryption_keys=kek)


def secret_manifest(name: str, data: dict[str, str]) -> Manifest:
    encoded = {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NAMESPACE}, "data": encoded}


@pytest.fixture
def cluster() -> Iterator[Callable[[dict[str, Any], list[Manifest]], dict[str, str]]]:
    """Renders as `helm upgrade` does, against a stand-in Kubernetes API that holds the given Secrets:
    Helm's `lookup` of a Secret asks the core group's discovery, then GETs the Secret (404: none)."""
    held: dict[str, Manifest] = {}
    discovery = {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "v1",
        "resources": [
            {"name": "secrets", "singularName": "secret", "namespaced": True, "kind": "Secret", "verbs": ["get"]}
        ],
    }
    not_found = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}
    secrets_path = f"/api/v1/namespaces/{NAMESPACE}/secrets/"

    class Api(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.partition("?")[0]
            if path == "/api/v1":
                self.answer(200, discovery)
            elif path.startswith(secrets_path) and path.removeprefix(secrets_path) in held:
                self.answer(200, held[path.removeprefix(secrets_path)])
            else:
                self.answer(404, not_found)

        def answer(self, status: int, body: dict[str, Any]) -> None:
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: pytest shows what a failing test needs."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    api = f"http://127.0.0.1:{server.server_address[1]}"

    def render_in_cluster(values: dict[str, Any], secrets: list[Manifest]) -> dict[str, str]:
        held.clear()
        held.update({secret["metadata"]["name"]: secret for secret in secrets})
        with (
            helm.Config(kube_apiserver=api, kube_token="test", namespace=NAMESPACE) as config,
            helm.Chart.load(CHART) as chart,
        ):
            return config.render(chart, values, name=RELEASE, namespace=NAMESPACE, is_upgrade=True)

    try:
        yield render_in_cluster
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_the_chart_makes_a_key_encryption_key_the_services_accept(rendered) -> None:
    """Without a Secret named, the release has one: `id:base64(32 random bytes)`, the format the
    services parse, kept on uninstall (losing it makes every sealed event unreadable)."""
    docs = docs_of(rendered, "default")
    secret = managed_secret(docs)
    assert secret["metadata"]["name"] == MANAGED_KEK_SECRET
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    value = kek_value(secret)
    [(kek_id, key)] = parse_keys(value)
    assert re.fullmatch(r"kek-[0-9]+", kek_id) and len(key) == KEY_BYTES
    ring = KeyRing.from_settings(Settings(key_encryption_keys=value))
    assert ring.unwrap(ring.wrap(b"d" * KEY_BYTES, "owner"), "owner") == b"d" * KEY_BYTES
    # A service of this release passes its start-up check; without the key it would not.
    data = of_kind(docs, "ConfigMap")[0]["data"]
    check_key_settings(settings_of(data, value))
    with pytest.raises(KeyRingError, match=KEK_VARIABLE):
        check_key_settings(settings_of(data, None))
    # Generated per render where no cluster can be asked for the kept one: never a key in the chart.
    assert parse_keys(kek_value(managed_secret(manifests(render(load_values("default"))))))[0][1] != key
    # The chart's default agrees with the agents' own.
    chart_values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chart_values["erasure"]["encryptEvents"] is Settings.model_fields["encrypt_events"].default


def test_the_key_encryption_keys_reach_exactly_the_services(rendered) -> None:
    for value_set in VALUE_SETS:
        docs = docs_of(rendered, value_set)
        if not load_values(value_set).get("erasure", {}).get("encryptEvents", True):
            assert not components_with_kek(docs), value_set  # nothing sealed, no Secret of keys yet
            continue
        assert components_with_kek(docs) == KEK_COMPONENTS & {component(doc) for doc in workloads(docs)}, value_set
        text = notes(rendered[value_set])
        agent_variables = re.findall(rf"^  ({PREFIX}[A-Z_]+)=", text, re.MULTILINE)
        assert f"{PREFIX}ENCRYPT_EVENTS" in agent_variables and KEK_VARIABLE not in agent_variables
        # NOTES.txt's backup command reads the key the pods read.
        [(secret, key)] = re.findall(r"get secret (\S+) -o jsonpath='\{\.data\.(.+?)\}'", text)
        ref = env_of(pod_spec(named(docs, "Deployment", "-projector"))["containers"][0])[KEK_VARIABLE]
        assert ref["valueFrom"]["secretKeyRef"] == {"name": secret, "key": key.replace("\\.", ".")}, value_set
    docs = docs_of(rendered, "default")
    for doc in workloads(docs):
        env = env_of(pod_spec(doc)["containers"][0])
        if component(doc) in KEK_COMPONENTS:
            assert env[KEK_VARIABLE]["valueFrom"]["secretKeyRef"] == {"name": MANAGED_KEK_SECRET, "key": "keys"}
    assert kek_value(managed_secret(docs)) not in notes(rendered["default"])


def test_encryption_off_needs_no_key_encryption_key() -> None:
    values = merge(load_values("default"), {"erasure": {"encryptEvents": False}})
    off = render(values)
    docs = manifests(off)
    assert not of_kind(docs, "Secret") and not components_with_kek(docs)
    assert kek_problems(docs) == []
    data = of_kind(docs, "ConfigMap")[0]["data"]
    assert data[f"{PREFIX}ENCRYPT_EVENTS"] == "false"
    check_key_settings(settings_of(data, None))  # the services start without one
    assert f"{PREFIX}ENCRYPT_EVENTS=false" in notes(off) and "Encryption is off" in notes(off)
    # A Secret named still reaches the services: events sealed before encryption was turned off open.
    named_secret = merge(values, {"erasure": {"keyEncryptionKeys": {"existingSecret": "graphledger-kek"}}})
    assert components_with_kek(manifests(render(named_secret))) == KEK_COMPONENTS


def test_upgrades_keep_the_key_encryption_keys_the_cluster_holds(cluster) -> None:
    """An upgrade renders the release's Secret as the cluster holds it (the first install's key, or a
    rotation made with kubectl), whether encryption is on or off; a first install generates one."""
    values = load_values("default")
    off = merge(values, {"erasure": {"encryptEvents": False}})
    keys = f"{new_key_entry('kek-new')},{new_key_entry('kek-old')}"  # mid-rotation
    held = [secret_manifest(MANAGED_KEK_SECRET, {"keys": keys})]
    for value_set in (values, off):
        docs = manifests(cluster(value_set, held))
        assert kek_value(managed_secret(docs)) == keys
        assert components_with_kek(docs) == KEK_COMPONENTS and kek_problems(docs) == []
    first = kek_value(managed_secret(manifests(cluster(values, []))))
    assert first != keys and len(parse_keys(first)) == 1
    assert not of_kind(manifests(cluster(off, [])), "Secret")  # nothing was ever sealed with one


def test_a_kept_secret_without_its_key_stops_the_upgrade(cluster) -> None:
    """A fresh key would open none of the key store's keys: the release refuses to make one."""
    held = [secret_manifest(MANAGED_KEK_SECRET, {"other": "x"})]
    with pytest.raises(
        helm.HelmRenderError, match=re.escape(f'Secret {MANAGED_KEK_SECRET} exists without its key "keys"')
    ):
        cluster(load_values("default"), held)


def test_the_kek_check_catches_a_key_the_secret_lacks(rendered) -> None:
    docs = docs_of(rendered, "default")
    managed_secret(docs)["data"] = {"renamed": "eA=="}
    assert any("names key keys" in problem for problem in kek_problems(docs))


# -- values that must not install ------------------------------------------------------------------------


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


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


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
    }
    assert allowed <= SETTING_VARIABLES, f"stale names in values.schema.json config: {allowed - SETTING_VARIABLES}"
    assert not allowed & (own_value | SECRET_VARIABLES)
    missing = SETTING_VARIABLES - allowed - own_value - SECRET_VARIABLES - client_only
    assert not missing, f"add {sorted(missing)} to config.propertyNames.enum in charts/graphledger/values.schema.json"


# -- the checks catch a broken chart ---------------------------------------------------------------------


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


# -- docs/deploy.md's instructions match the chart ------------------------------------------------------------


def test_the_deploy_guides_values_file_installs() -> None:
    """The values file of docs/deploy.md renders and validates, and every object the guide tells to
    inspect (`job/...`, `svc/...`, `deploy/...`) is one the release creates."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    match = re.search(r"```yaml\n# my-values\.yaml\n(.*?)```", text, re.DOTALL)
    assert match, "docs/deploy.md: the my-values.yaml example is missing"
    docs = manifests(render(yaml.safe_load(match.group(1))))
    for version in KUBERNETES_VERSIONS:
        assert schema_problems(docs, version) == []
    kinds = {"job": "Job", "svc": "Service", "deploy": "Deployment"}
    created = {(doc["kind"], doc["metadata"]["name"]) for doc in docs}
    mentioned = set(re.findall(r"\b(job|svc|deploy)/(graphledger-[a-z-]+)", text))
    assert {("job", "graphledger-topics"), ("svc", "graphledger-read-api")} <= mentioned
    for short, name in mentioned:
        assert (kinds[short], name) in created, f"docs/deploy.md mentions {short}/{name}, not in the release"
