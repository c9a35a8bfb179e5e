"""docker/compose.yaml, checked without Docker: its structure as `docker compose config` would read it
(variables interpolated as Compose does), and every command, variable, port and dependency
cross-checked against the CLI and the settings."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from graphledger.settings import Settings
from graphledger_server.cli import build_parser
from graphledger_server.keys.key_store import check_key_settings
from graphledger_server.keys.ring import KEY_BYTES, parse_keys

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
PREFIX = str(Settings.model_config.get("env_prefix", ""))
SETTING_VARIABLES = {f"{PREFIX}{name}".upper() for name in Settings.model_fields}
OUR_SERVICES = {"topics", "migrate", "projector", "api", "sweeper"}
ONE_SHOT = {"topics", "migrate"}
LONG_RUNNING = OUR_SERVICES - ONE_SHOT
KEK_VARIABLE = f"{PREFIX}KEY_ENCRYPTION_KEYS"
# `${NAME}`, `${NAME:-default}` (unset or empty), `${NAME-default}` (unset), and `$$` for a dollar sign.
INTERPOLATION = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>[^}]*))?\}")
OBSERVABILITY = {"otel-collector", "jaeger", "prometheus", "grafana"}

# The Compose Specification's top-level and service keys this file may use (a subset of the spec).
TOP_LEVEL_KEYS = {"name", "services", "volumes", "networks", "configs", "secrets"}
SERVICE_KEYS = {
    "image", "build", "command", "entrypoint", "environment", "env_file", "ports", "volumes", "depends_on",
    "healthcheck", "restart", "user", "read_only", "tmpfs", "cap_drop", "cap_add", "security_opt", "init",
    "profiles", "hostname", "networks", "labels", "working_dir", "stop_grace_period",
}  # fmt: skip
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
RESTART_POLICIES = {"no", "always", "on-failure", "unless-stopped"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def interpolate(value: str, environ: Mapping[str, str]) -> str:
    """`value` as Compose passes it to the container, with `environ` the shell's (and --env-file's)."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op = match.group("name"), match.group("op")
        if name in environ and (environ[name] or op != ":-"):
            return environ[name]
        return (match.group("default") or "") if op else ""

    assert "$" not in INTERPOLATION.sub("", value), f"a form of interpolation not handled: {value}"
    return INTERPOLATION.sub(substitute, value)


def env_of(service: dict[str, Any], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The service's variables, interpolated from `environ` (default: none of them set)."""
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: interpolate(str(value), environ or {}) for key, value in env.items()}


def published(service: dict[str, Any]) -> dict[int, int]:
    """container port -> host port."""
    ports = {}
    for entry in service.get("ports", []):
        _, host, container = str(entry).split(":")
        ports[int(container)] = int(host)
    return ports


def test_every_port_is_published_on_loopback_only(services) -> None:
    """Postgres with its well-known password, Kafka without auth, the read API with a public token: none
    may be reachable from another machine. A port without an address would bind every interface."""
    entries = [(name, str(entry)) for name, service in services.items() for entry in service.get("ports", [])]
    assert {name for name, _ in entries} >= {"kafka", "postgres", "api"}
    for name, entry in entries:
        assert entry.startswith("127.0.0.1:") and entry.count(":") == 2, (name, entry)


def test_the_read_api_hands_out_keys_only_to_a_token_agents_are_told(services) -> None:
    """It listens on every address of its container, so without a token it would refuse the host's
    agents their data keys (`api/auth.py`): it gets a public dev-only token, or the environment's."""
    from graphledger_server.api.auth import listens_on_loopback

    api = env_of(services["api"])
    assert not listens_on_loopback(api["GRAPHLEDGER_API_HOST"])
    default = api["GRAPHLEDGER_API_TOKEN"]
    assert "dev-only" in default
    header = COMPOSE.read_text().partition("\nname:")[0]
    assert f"GRAPHLEDGER_API_TOKEN={default}" in header and "graphledger erase" in header
    assert env_of(services["api"], {"GRAPHLEDGER_API_TOKEN": "mine"})["GRAPHLEDGER_API_TOKEN"] == "mine"
    assert all("GRAPHLEDGER_API_TOKEN" not in env_of(services[name]) for name in OUR_SERVICES - {"api"})


def test_the_file_has_the_compose_structure(compose, services) -> None:
    assert set(compose) <= TOP_LEVEL_KEYS | {key for key in compose if key.startswith("x-")}
    assert compose["name"] == "graphledger"
    assert set(services) == OUR_SERVICES | {"kafka", "postgres"} | OBSERVABILITY
    for name, service in services.items():
        assert set(service) <= SERVICE_KEYS, (name, set(service) - SERVICE_KEYS)
        assert "image" in service, name
        for key in ("command", "entrypoint"):
            if key in service:
                assert isinstance(service[key], list) and all(isinstance(a, str) for a in service[key]), (name, key)
        assert str(service.get("restart", "no")) in RESTART_POLICIES, name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DOCKER / source).exists(), (name, source)  # relative to the compose file
            else:
                assert source in compose.get("volumes", {}), (name, source)


def test_images_are_pinned(services) -> None:
    for name, service in services.items():
        image = service["image"]
        if name in OUR_SERVICES:
            assert image == "graphledger:local"
            assert service["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}
            assert (DOCKER / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
            continue
        tag = image.partition(":")[2]
        assert tag and tag != "latest" and re.search(r"\d+\.\d+", tag), f"{name}: {image} is not pinned"
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["postgres"]["image"].startswith("pgvector/pgvector:")


def test_every_command_is_a_real_graphledger_command(services) -> None:
    parser = build_parser()
    commands = {}
    for name in OUR_SERVICES:
        args = parser.parse_args(services[name]["command"])
        commands[name] = " ".join(filter(None, [args.command, getattr(args, "topics_command", None)]))
    assert commands == {
        "topics": "topics ensure",
        "migrate": "migrate",
        "projector": "projector",
        "api": "api",
        "sweeper": "sweeper",
    }
    assert all("entrypoint" not in services[name] for name in OUR_SERVICES)  # the image's `graphledger`


def test_every_variable_is_a_setting_and_the_settings_validate(services, monkeypatch) -> None:
    for name in OUR_SERVICES:
        env = env_of(services[name])
        unknown = {key for key in env if key.startswith(PREFIX)} - SETTING_VARIABLES
        assert not unknown, (name, unknown)
        assert set(env) - SETTING_VARIABLES <= {
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_SERVICE_NAME",
        }, name
        for key in list(os.environ):
            if key.startswith(PREFIX):
                monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        settings = Settings()
        assert settings.topic_replication_factor == 1  # one broker
        if name in LONG_RUNNING:
            assert env["OTEL_SERVICE_NAME"] == f"graphledger-{name}"
            check_key_settings(settings)  # what the services check at start: they seal, with a key


def test_the_services_that_seal_get_a_key_encryption_key(services) -> None:
    """The projector, the read API and the sweeper get GRAPHLEDGER_KEY_ENCRYPTION_KEYS (the one-shots do
    not): by default a public key labelled dev-only, in the format the services parse, and the one in
    the environment when it is set."""
    assert {name for name in OUR_SERVICES if KEK_VARIABLE in env_of(services[name])} == LONG_RUNNING
    defaults = {env_of(services[name])[KEK_VARIABLE] for name in LONG_RUNNING}
    [default] = defaults  # one key for all three
    [(kek_id, key)] = parse_keys(default)
    assert kek_id == "compose-dev-only" and len(key) == KEY_BYTES
    header = COMPOSE.read_text().partition("\nname:")[0]
    assert KEK_VARIABLE in header and "--env-file" in header  # how to give your own
    own = "kek-1:" + "A" * 43 + "="
    for name in LONG_RUNNING:
        assert env_of(services[name], {KEK_VARIABLE: own})[KEK_VARIABLE] == own
        assert env_of(services[name], {KEK_VARIABLE: ""})[KEK_VARIABLE] == default  # `:-`: empty is unset


def test_interpolation_is_read_as_compose_reads_it() -> None:
    assert interpolate("${A:-x}", {}) == "x" and interpolate("${A:-x}", {"A": ""}) == "x"
    assert interpolate("${A-x}", {"A": ""}) == "" and interpolate("${A-x}", {}) == "x"
    assert interpolate("${A}", {"A": "a"}) == "a" and interpolate("a$$b", {}) == "a$b"
    with pytest.raises(AssertionError, match="not handled"):
        interpolate("${A:?required}", {})


def test_kafka_listeners_match_the_bootstrap_servers(services) -> None:
    kafka = env_of(services["kafka"])
    assert "broker" in kafka["KAFKA_PROCESS_ROLES"] and "controller" in kafka["KAFKA_PROCESS_ROLES"]  # KRaft
    assert "KAFKA_ZOOKEEPER_CONNECT" not in kafka
    assert kafka["CLUSTER_ID"]
    advertised = dict(item.split("://") for item in kafka["KAFKA_ADVERTISED_LISTENERS"].split(","))
    protocols = dict(item.split(":") for item in kafka["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    for name in OUR_SERVICES:
        env = env_of(services[name])
        bootstrap = env["GRAPHLEDGER_KAFKA_BOOTSTRAP_SERVERS"]
        [listener] = [key for key, address in advertised.items() if address == bootstrap]
        assert bootstrap.split(":")[0] in services  # reachable by service name
        assert protocols[listener] == env["GRAPHLEDGER_KAFKA_SECURITY_PROTOCOL"]
    # The listener for agents on the host is published on the port it advertises.
    host_address = advertised["HOST"]
    assert host_address.startswith("localhost:")
    port = int(host_address.split(":")[1])
    assert published(services["kafka"]) == {port: port}
    assert kafka["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"  # topics ensure creates them


def test_the_dsn_points_at_the_postgres_service(services) -> None:
    postgres = env_of(services["postgres"])
    for name in OUR_SERVICES:
        dsn = urlsplit(env_of(services[name])["GRAPHLEDGER_POSTGRES_DSN"])
        assert dsn.hostname == "postgres" and (dsn.port or 5432) == 5432
        assert dsn.username == postgres["POSTGRES_USER"] and dsn.password == postgres["POSTGRES_PASSWORD"]
        assert dsn.path.lstrip("/") == postgres["POSTGRES_DB"]


def test_the_api_port_is_consistent(services) -> None:
    api = services["api"]
    settings_port = int(env_of(api)["GRAPHLEDGER_API_PORT"])
    assert env_of(api)["GRAPHLEDGER_API_HOST"] == "0.0.0.0"
    assert published(api) == {settings_port: settings_port}
    probe = " ".join(api["healthcheck"]["test"])
    assert f"http://127.0.0.1:{settings_port}/readyz" in probe
    for name in OUR_SERVICES - {"api"}:
        assert "ports" not in services[name], f"{name} serves nothing"


def test_dependencies_start_things_in_order(services) -> None:
    for name, service in services.items():
        for dependency, spec in service.get("depends_on", {}).items():
            assert dependency in services, (name, dependency)
            condition = spec["condition"]
            assert condition in CONDITIONS, (name, condition)
            if condition == "service_healthy":
                assert "healthcheck" in services[dependency], f"{name} waits for {dependency}'s healthcheck"
            if condition == "service_completed_successfully":
                assert dependency in ONE_SHOT, (name, dependency)
            # The default stack never waits for an optional profile's service.
            if not service.get("profiles"):
                assert not services[dependency].get("profiles"), (name, dependency)
    depends = {name: services[name].get("depends_on", {}) for name in OUR_SERVICES}
    assert depends["topics"] == {"kafka": {"condition": "service_healthy"}}
    assert depends["migrate"] == {"postgres": {"condition": "service_healthy"}}
    for name in ("projector", "sweeper"):
        assert depends[name] == {dependency: {"condition": "service_completed_successfully"} for dependency in ONE_SHOT}
    assert depends["api"] == {"migrate": {"condition": "service_completed_successfully"}}
    for name in ONE_SHOT:
        assert str(services[name]["restart"]) == "no"
    for name in LONG_RUNNING:
        assert services[name]["restart"] == "unless-stopped"


def test_our_services_run_locked_down(services) -> None:
    for name in OUR_SERVICES:
        service = services[name]
        assert service["read_only"] is True and service["tmpfs"] == ["/tmp"]
        assert service["user"] == "10001:10001"
        assert service["cap_drop"] == ["ALL"]
        assert "no-new-privileges:true" in service["security_opt"]


def test_observability_is_configuration_that_fits_together(services) -> None:
    for name in OBSERVABILITY:
        assert services[name]["profiles"] == ["observability"]
    collector = yaml.safe_load((DOCKER / "otel-collector.yaml").read_text())
    pipelines = collector["service"]["pipelines"]
    for pipeline in pipelines.values():
        for kind in ("receivers", "processors", "exporters"):
            assert set(pipeline[kind]) <= set(collector[kind]), (kind, pipeline)
    # The services export OTLP over HTTP only: the endpoint must be the collector's HTTP receiver.
    http = collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    env = env_of(services["api"])
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
    endpoint = urlsplit(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert endpoint.hostname == "otel-collector" and endpoint.port == int(http.rsplit(":", 1)[1])
    assert urlsplit("//" + collector["exporters"]["otlp/jaeger"]["endpoint"]).hostname in services
    prometheus = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    targets = [t for job in prometheus["scrape_configs"] for c in job["static_configs"] for t in c["targets"]]
    exporter_port = collector["exporters"]["prometheus"]["endpoint"].rsplit(":", 1)[1]
    assert targets == [f"otel-collector:{exporter_port}"]
    # The alert rules are the chart's file, mounted where prometheus.yml looks for them.
    rule_mounts = dict(volume.split(":")[:2][::-1] for volume in services["prometheus"]["volumes"])
    for rule_file in prometheus["rule_files"]:
        assert rule_mounts[rule_file] == "../charts/graphledger/files/prometheus-rules.yaml"
        assert (DOCKER / rule_mounts[rule_file]).is_file()
    datasources = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/datasources.yaml").read_text())
    for source in datasources["datasources"]:
        assert urlsplit(source["url"]).hostname in services, source
    dashboards = yaml.safe_load((DOCKER / "grafana/provisioning/dashboards/graphledger.yaml").read_text())
    mounts = dict(volume.split(":")[:2][::-1] for volume in services["grafana"]["volumes"])
    assert dashboards["providers"][0]["options"]["path"] in mounts
