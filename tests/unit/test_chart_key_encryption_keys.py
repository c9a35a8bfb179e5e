"""The Helm chart and erasure's key-encryption keys: the Secret the release makes (or is named), the
pods that get it and no others, and upgrades that keep the keys the cluster holds (rendered as
`helm upgrade` does, against a stand-in Kubernetes API).
"""

from __future__ import annotations

import base64
import json
import re
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import helm_python as helm
import pytest
import yaml

from chart_checks import (
    CHART,
    KEK_COMPONENTS,
    KEK_VARIABLE,
    NAMESPACE,
    PREFIX,
    RELEASE,
    VALUE_SETS,
    Manifest,
    component,
    docs_of,
    env_of,
    kek_problems,
    load_values,
    manifests,
    merge,
    named,
    notes,
    of_kind,
    pod_spec,
    render,
    settings_of,
    workloads,
)
from graphledger.settings import Settings
from graphledger_server.keys.key_store import check_key_settings
from graphledger_server.keys.ring import KEY_BYTES, KeyRing, KeyRingError, new_key_entry, parse_keys

MANAGED_KEK_SECRET = f"{RELEASE}-key-encryption-keys"


def managed_secret(docs: list[Manifest]) -> Manifest:
    return named(docs, "Secret", "-key-encryption-keys")


def kek_value(secret: Manifest) -> str:
    return base64.b64decode(secret["data"]["keys"]).decode()


def components_with_kek(docs: list[Manifest]) -> set[str]:
    return {component(doc) for doc in workloads(docs) if KEK_VARIABLE in env_of(pod_spec(doc)["containers"][0])}


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
    docs = manifests(render(named_secret))
    assert components_with_kek(docs) == KEK_COMPONENTS & {component(doc) for doc in workloads(docs)}


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
        assert components_with_kek(docs) == KEK_COMPONENTS & {component(doc) for doc in workloads(docs)}
        assert kek_problems(docs) == []
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
