"""Kafka TLS and SASL settings: read from GRAPHLEDGER_* variables, turned into aiokafka options by
`Settings.kafka_client_options()`, and those options used by every Kafka client of the client library and
the services alike. The TLS path is exercised for real: a throwaway CA, server and client certificates
(made with `cryptography`), and a mutual-TLS handshake on loopback with the context the settings build."""

from __future__ import annotations

import ast
import os
import re
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import pytest

from graphledger.settings import Settings
from graphledger_server.keys.ring import new_key_entry
from pki import Pki, make_pki

ROOT = Path(__file__).resolve().parents[2]
KAFKA_CLIENTS = {"PartitionCheckedProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient"}
"""The classes the code builds clients with (`PartitionCheckedProducer` is aiokafka's producer checking the
partition count, `graphledger.log.layout`)."""
HANDSHAKE_TIMEOUT_S = 10


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No GRAPHLEDGER_* variable from the surrounding shell leaks into these settings."""
    for key in list(os.environ):
        if key.startswith("GRAPHLEDGER_"):
            monkeypatch.delenv(key)
    return monkeypatch


def secure_env(pki: Pki, **overrides: str) -> dict[str, str]:
    env = {
        "GRAPHLEDGER_KAFKA_BOOTSTRAP_SERVERS": "b-1.kafka.example:9096,b-2.kafka.example:9096",
        "GRAPHLEDGER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "GRAPHLEDGER_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "GRAPHLEDGER_KAFKA_SASL_USERNAME": "graphledger-agent",
        "GRAPHLEDGER_KAFKA_SASL_PASSWORD": "s3cret-Passw0rd",
        "GRAPHLEDGER_KAFKA_SSL_CAFILE": str(pki.ca),
        "GRAPHLEDGER_KAFKA_SSL_CERTFILE": str(pki.client_cert),
        "GRAPHLEDGER_KAFKA_SSL_KEYFILE": str(pki.client_key),
        "GRAPHLEDGER_KEY_ENCRYPTION_KEYS": new_key_entry("tls"),
    }
    env.update(overrides)
    return env


def settings_from(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> Settings:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return Settings()


# -- settings from the environment -----------------------------------------------------------------------


def test_tls_and_sasl_settings_come_from_the_environment(pki, clean_env) -> None:
    settings = settings_from(clean_env, secure_env(pki))
    assert settings.kafka_security_protocol == "SASL_SSL"
    assert settings.kafka_sasl_mechanism == "SCRAM-SHA-512"
    assert settings.kafka_sasl_username == "graphledger-agent"
    assert settings.kafka_sasl_password is not None
    assert settings.kafka_sasl_password.get_secret_value() == "s3cret-Passw0rd"
    assert "s3cret" not in repr(settings)  # the password never shows in logs or tracebacks
    assert (settings.kafka_ssl_cafile, settings.kafka_ssl_certfile, settings.kafka_ssl_keyfile) == (
        str(pki.ca),
        str(pki.client_cert),
        str(pki.client_key),
    )


@pytest.mark.parametrize(
    ("protocol", "expected"),
    [
        ("PLAINTEXT", set()),
        ("SSL", {"ssl_context"}),
        ("SASL_PLAINTEXT", {"sasl_mechanism", "sasl_plain_username", "sasl_plain_password"}),
        ("SASL_SSL", {"sasl_mechanism", "sasl_plain_username", "sasl_plain_password", "ssl_context"}),
    ],
)
def test_each_protocol_gets_exactly_its_options(pki, clean_env, protocol: str, expected: set[str]) -> None:
    settings = settings_from(clean_env, secure_env(pki, GRAPHLEDGER_KAFKA_SECURITY_PROTOCOL=protocol))
    options = settings.kafka_client_options()
    assert set(options) == {"bootstrap_servers", "security_protocol"} | expected
    assert options["bootstrap_servers"] == "b-1.kafka.example:9096,b-2.kafka.example:9096"
    assert options["security_protocol"] == protocol
    if "sasl_mechanism" in expected:
        assert options["sasl_mechanism"] == "SCRAM-SHA-512"
        assert options["sasl_plain_username"] == "graphledger-agent"
        assert options["sasl_plain_password"] == "s3cret-Passw0rd"


def test_an_invalid_protocol_is_refused_naming_the_variable(clean_env) -> None:
    from graphledger_server.cli import describe_settings_error

    clean_env.setenv("GRAPHLEDGER_KAFKA_SECURITY_PROTOCOL", "TLS")
    clean_env.setenv("GRAPHLEDGER_KAFKA_SASL_PASSWORD", "do-not-echo")
    with pytest.raises(Exception) as caught:
        Settings()
    lines = describe_settings_error(caught.value)
    assert any("GRAPHLEDGER_KAFKA_SECURITY_PROTOCOL" in line for line in lines), lines
    assert not any("do-not-echo" in line for line in lines)


def test_the_ssl_context_verifies_the_brokers_with_the_given_ca(pki, clean_env) -> None:
    context = settings_from(clean_env, secure_env(pki)).kafka_client_options()["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert [dict(part[0] for part in ca["subject"])["commonName"] for ca in context.get_ca_certs()] == [
        "graphledger test CA"
    ]


def test_a_missing_or_mismatched_file_fails_when_the_options_are_made(pki, clean_env) -> None:
    """A wrong path or key fails at start-up with the file named, not at the first connection."""
    missing = settings_from(clean_env, secure_env(pki, GRAPHLEDGER_KAFKA_SSL_CAFILE=str(pki.ca) + ".missing"))
    with pytest.raises(FileNotFoundError):
        missing.kafka_client_options()
    mismatched = settings_from(clean_env, secure_env(pki, GRAPHLEDGER_KAFKA_SSL_KEYFILE=str(pki.other_key)))
    with pytest.raises(ssl.SSLError):
        mismatched.kafka_client_options()


# -- the context works, for real -------------------------------------------------------------------------


def _mtls_server(pki: Pki) -> tuple[socket.socket, ssl.SSLContext]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    context.load_verify_locations(pki.ca)
    context.verify_mode = ssl.CERT_REQUIRED  # mutual TLS: the client must present a certificate
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(HANDSHAKE_TIMEOUT_S)
    return listener, context


def _handshake(pki: Pki, client_context: ssl.SSLContext) -> dict[str, Any]:
    """Connect with `client_context` to a loopback server that requires a client certificate; what
    each side saw. Raises the client's SSL error when the handshake fails."""
    listener, server_context = _mtls_server(pki)
    seen: dict[str, Any] = {}

    def serve() -> None:
        try:
            conn, _ = listener.accept()
            with server_context.wrap_socket(conn, server_side=True) as tls:
                seen["client"] = dict(part[0] for part in tls.getpeercert()["subject"])["commonName"]
                tls.sendall(b"ok")
        except (OSError, ssl.SSLError) as exc:
            seen["server_error"] = exc

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=HANDSHAKE_TIMEOUT_S) as raw:
            with client_context.wrap_socket(raw, server_hostname="localhost") as tls:
                seen["server"] = dict(part[0] for part in tls.getpeercert()["subject"])["commonName"]
                seen["reply"] = tls.recv(2)
    finally:
        thread.join(HANDSHAKE_TIMEOUT_S)
        listener.close()
    return seen


def test_a_mutual_tls_handshake_succeeds_with_the_settings_context(pki, clean_env) -> None:
    context = settings_from(clean_env, secure_env(pki)).kafka_client_options()["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    seen = _handshake(pki, context)
    assert seen == {"server": "localhost", "client": "graphledger-agent", "reply": b"ok"}


def test_a_broker_certificate_from_another_ca_is_rejected(pki, clean_env) -> None:
    context = settings_from(clean_env, secure_env(pki, GRAPHLEDGER_KAFKA_SSL_CAFILE=str(pki.other_ca)))
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(pki, context.kafka_client_options()["ssl_context"])  # type: ignore[arg-type]


def test_without_a_client_certificate_an_mtls_broker_refuses(pki, clean_env) -> None:
    env = secure_env(pki)
    del env["GRAPHLEDGER_KAFKA_SSL_CERTFILE"], env["GRAPHLEDGER_KAFKA_SSL_KEYFILE"]
    context = settings_from(clean_env, env).kafka_client_options()["ssl_context"]
    # With TLS 1.3 the client learns of the refusal on its first read, which _handshake does.
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _handshake(pki, context)  # type: ignore[arg-type]


# -- every Kafka client uses these options ---------------------------------------------------------------


def _kafka_client_calls() -> list[tuple[str, str, ast.Call]]:
    """`(class name, where, call)` of every aiokafka client built in the code."""
    calls = []
    for path in sorted([*(ROOT / "libs").rglob("*.py"), *(ROOT / "services").rglob("*.py")]):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if name in KAFKA_CLIENTS:
                    calls.append((name, f"{path.relative_to(ROOT)}:{node.lineno}", node))
    return calls


def test_every_kafka_client_in_the_code_is_built_from_the_shared_options() -> None:
    """Client library and services alike: no aiokafka client may be configured any other way, or a
    TLS/SASL setting would silently not apply to it."""
    calls = _kafka_client_calls()
    # Each kind is built somewhere: producers by `new_producer`, the services' consumers and admin clients
    # by `log/clients.py`.
    assert {name for name, _, _ in calls} == KAFKA_CLIENTS
    for _, where, call in calls:
        unpacked = [kw.value for kw in call.keywords if kw.arg is None]
        assert any(
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr == "kafka_client_options"
            for value in unpacked
        ), f"{where} does not pass **settings.kafka_client_options()"
        explicit = {kw.arg for kw in call.keywords if kw.arg is not None}
        assert not explicit & {"bootstrap_servers", "security_protocol", "ssl_context", "sasl_mechanism"}, where


class _Recorder:
    """Stands in for an aiokafka client class: records its keyword arguments, never connects."""

    def __init__(self, calls: list[tuple[str, dict[str, Any]]], name: str) -> None:
        self.calls, self.name = calls, name

    def __call__(self, *args: Any, **kwargs: Any) -> _Recorder:
        self.calls.append((self.name, kwargs))
        return self

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def subscribe(self, *args: Any, **kwargs: Any) -> None:
        return None

    def acquire(self) -> _Recorder:  # as an asyncpg pool
        return self

    async def __aenter__(self) -> _Recorder:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


def _assert_same_options(recorded: dict[str, Any], settings: Settings) -> None:
    expected = settings.kafka_client_options()
    for key, value in expected.items():
        if key == "ssl_context":
            assert isinstance(recorded[key], ssl.SSLContext)
            assert recorded[key].get_ca_certs() == value.get_ca_certs()  # type: ignore[attr-defined]
        else:
            assert recorded[key] == value, key


async def test_the_agent_the_projector_and_topics_ensure_connect_with_the_same_options(pki, clean_env) -> None:
    from graphledger.client import producer, publisher
    from graphledger_server.log import clients, topics
    from graphledger_server.projection.checkpoints import CheckpointProjection
    from graphledger_server.projector import worker

    settings = settings_from(clean_env, secure_env(pki))
    calls: list[tuple[str, dict[str, Any]]] = []
    # Every producer comes from `new_producer`; the agent's is built first, the projector's second.
    clean_env.setattr(producer, "PartitionCheckedProducer", _Recorder(calls, "producer"))
    clean_env.setattr(clients, "AIOKafkaConsumer", _Recorder(calls, "projector consumer"))

    async def no_pool(*args: Any, **kwargs: Any) -> _Recorder:
        return _Recorder(calls, "pool")

    clean_env.setattr(worker.asyncpg, "create_pool", no_pool)

    class _Stop(Exception):
        pass

    class _Admin(_Recorder):
        async def start(self) -> None:
            raise _Stop

    clean_env.setattr(clients, "AIOKafkaAdminClient", _Admin(calls, "topics admin"))

    agent = publisher.EventPublisher(settings)
    await agent.start()
    await agent.stop()
    # The checkpoint projection only: its Kafka clients are what this is about, not the store's schema.
    projector = worker.ProjectorWorker(
        settings, {settings.checkpoint_topic: CheckpointProjection(settings.postgres_schema)}
    )
    await projector.start()
    await projector.close()
    with pytest.raises(_Stop):
        await topics.ensure_topics(settings)

    producers = iter(["agent producer", "projector producer"])
    clients = {next(producers) if name == "producer" else name: kwargs for name, kwargs in calls if name != "pool"}
    assert set(clients) == {"agent producer", "projector producer", "projector consumer", "topics admin"}
    for kwargs in clients.values():
        _assert_same_options(kwargs, settings)


async def test_aiokafka_accepts_the_options(pki, clean_env) -> None:
    """The real aiokafka classes take the options as they are (their constructors validate them)."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient

    for protocol in ("SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        settings = settings_from(clean_env, secure_env(pki, GRAPHLEDGER_KAFKA_SECURITY_PROTOCOL=protocol))
        producer = AIOKafkaProducer(**settings.kafka_client_options())  # type: ignore[arg-type]
        consumer = AIOKafkaConsumer(**settings.kafka_client_options())  # type: ignore[arg-type]
        admin = AIOKafkaAdminClient(**settings.kafka_client_options())  # type: ignore[arg-type]
        await producer.stop()
        await consumer.stop()
        await admin.close()


# -- the read API's TLS ----------------------------------------------------------------------------------


def test_the_read_apis_certificate_and_key_come_in_pairs(pki) -> None:
    for given in ({"api_tls_certfile": str(pki.server_cert)}, {"api_tls_keyfile": str(pki.server_key)}):
        with pytest.raises(ValueError, match=f"{next(iter(given))} is set without its pair"):
            Settings(**given)  # type: ignore[arg-type]


def test_the_read_api_checks_its_certificate_and_key_before_it_listens(pki) -> None:
    from graphledger_server.api.main import tls_options

    assert tls_options(Settings()) == {}
    good = Settings(api_tls_certfile=str(pki.server_cert), api_tls_keyfile=str(pki.server_key))
    assert tls_options(good) == {"ssl_certfile": str(pki.server_cert), "ssl_keyfile": str(pki.server_key)}
    for certfile, keyfile in ((pki.server_cert, pki.other_key), (pki.server_cert.with_suffix(".gone"), pki.server_key)):
        bad = Settings(api_tls_certfile=str(certfile), api_tls_keyfile=str(keyfile))
        with pytest.raises(
            ValueError, match=re.escape(f"api_tls_certfile '{certfile}' with api_tls_keyfile '{keyfile}'")
        ):
            tls_options(bad)


def test_the_client_trusts_exactly_the_ca_file_for_an_https_read_api(pki) -> None:
    assert Settings().api_ssl_context() is None  # the system CAs
    context = Settings(api_url="https://api.example:8443", api_ca_file=str(pki.ca)).api_ssl_context()
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert [dict(part[0] for part in ca["subject"])["commonName"] for ca in context.get_ca_certs()] == [
        "graphledger test CA"
    ]
    missing = Settings(api_url="https://api.example:8443", api_ca_file=str(pki.ca) + ".gone")
    with pytest.raises(ValueError, match=r"api_ca_file '.*\.gone': No such file"):
        missing.api_ssl_context()
    with pytest.raises(
        ValueError, match=re.escape("api_ca_file is set but api_url 'http://127.0.0.1:8080' is not https")
    ):
        Settings(api_ca_file=str(pki.ca))
