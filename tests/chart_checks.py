"""The Helm chart (charts/graphledger) rendered and checked offline, for the `test_chart_*.py` modules.

Rendering is Helm's own (helm-python-sdk, the Helm SDK as a library). Each check is a function returning
the problems it finds in the rendered manifests (`ALL_CHECKS`), so `test_chart_render.py` runs every
check on every value set and `test_chart_broken.py` shows each failing on a deliberately broken copy of
the chart. `tests/unit/conftest.py` renders every value set once for the run (the `rendered` fixture).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import yaml

from graphledger.settings import Settings
from graphledger_server.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
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
# The pods that seal or open events: the projector, the read API (clients' keys), the sweeper, and a replay's
# workers (the projector's code, on the whole log).
KEK_COMPONENTS = frozenset({"projector", "api", "sweeper", "replay"})

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
        if component(job) == "replay":
            continue  # an operator's run, not a hook: `replay_job_problems`
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


def replay_job_problems(docs: list[Manifest]) -> list[str]:
    """A replay Job is an Indexed Job of `--workers` pods that each run `replay run --indexed-job` of one run
    (the Job's name), restarted per index, with a pod template that upgrades leave as it is (a Job's template
    is immutable: no config checksum, no chart version)."""
    problems = []
    parser = build_parser()
    for job in of_kind(docs, "Job"):
        if component(job) != "replay":
            continue
        name, spec = job["metadata"]["name"], job["spec"]
        [container] = pod_spec(job)["containers"]
        try:
            args = parser.parse_args(container["args"])
        except SystemExit:
            problems.append(f"{name}: {container['args']} is not a graphledger command line")
            continue
        if (args.command, getattr(args, "replay_command", None)) != ("replay", "run") or not args.indexed_job:
            problems.append(f"{name}: must run `replay run --indexed-job`, not {container['args']}")
        if args.run_id != name:
            problems.append(f"{name}: its pods must share the Job's name as --run-id, not {args.run_id!r}")
        indexed = spec.get("completionMode") == "Indexed"
        if not indexed or not spec.get("completions") == spec.get("parallelism") == args.workers:
            problems.append(f"{name}: an Indexed Job of {args.workers} completions, all at once: {spec}")
        if "backoffLimitPerIndex" not in spec or "backoffLimit" in spec:
            problems.append(f"{name}: retries per index (backoffLimitPerIndex), so a dead pod's share resumes")
        template = spec["template"]
        if pod_spec(job).get("restartPolicy") != "Never":
            problems.append(f"{name}: restartPolicy Never (a failed pod is replaced with its index)")
        if "checksum/config" in template["metadata"].get("annotations", {}) or any(
            key.startswith("helm.sh/") or key == "app.kubernetes.io/version" for key in template["metadata"]["labels"]
        ):
            problems.append(f"{name}: its pod template must not change with the config or the chart's version")
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
    """The key-encryption keys reach the projector, the read API, the sweeper and a replay's workers, from a
    key the Secret holds, whenever events are sealed; never another pod (hooks, `helm test`)."""
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
    "replay-job": replay_job_problems,
    "config": config_problems,
    "kek": kek_problems,
    "labels": label_problems,
    "api-tls": api_tls_problems,
}


def settings_of(data: dict[str, str], kek: str | None) -> Settings:
    """A service's settings: the ConfigMap's, and the key-encryption keys when its pod gets them."""
    values = {key.removeprefix(PREFIX).lower(): value for key, value in data.items() if key.startswith(PREFIX)}
    return Settings(**values, key_encryption_keys=kek)


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
