"""The `graphledger` command as an operator runs it: a subprocess configured only by `GRAPHLEDGER_*`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest

from graphledger_server.cli import SERVER_EXTRA_MESSAGE
from graphledger_server.devstack.broker import EmbeddedBroker
from graphledger_server.devstack.ports import wait_until
from graphledger_server.sweeper.main import START_MESSAGE

COMMAND_TIMEOUT_S = 120


def clean_env(**settings: str) -> dict[str, str]:
    """This process's environment without any GRAPHLEDGER_* variable but the key-encryption key (the
    Secret every service is given), plus `settings`."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("GRAPHLEDGER_")}
    env["GRAPHLEDGER_KEY_ENCRYPTION_KEYS"] = os.environ["GRAPHLEDGER_KEY_ENCRYPTION_KEYS"]
    env.update({f"GRAPHLEDGER_{k.upper()}": v for k, v in settings.items()})
    return env


def graphledger(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "graphledger_server", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )


def test_help_lists_every_command() -> None:
    result = graphledger("--help", env=clean_env())
    assert result.returncode == 0
    for command in ("dev", "migrate", "topics", "projector", "api", "sweeper", "replay"):
        assert command in result.stdout


def test_migrate_is_idempotent(fresh_database: str) -> None:
    env = clean_env(postgres_dsn=fresh_database, postgres_schema="cli_schema")

    first = graphledger("migrate", env=env)
    assert first.returncode == 0, first.stderr
    assert "migrate: applied" in first.stdout

    second = graphledger("migrate", env=env)
    assert second.returncode == 0, second.stderr
    assert "migrate: schema cli_schema is up to date" in second.stdout

    async def tables() -> set[str]:
        conn = await asyncpg.connect(fresh_database)
        try:
            rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'cli_schema'")
        finally:
            await conn.close()
        return {row["tablename"] for row in rows}

    assert {"checkpoints", "checkpoint_blobs", "checkpoint_writes", "graphledger_migrations"} <= asyncio.run(tables())


def test_topics_ensure_is_idempotent(broker: EmbeddedBroker) -> None:
    prefix = f"cli{uuid.uuid4().hex[:8]}"
    env = clean_env(
        kafka_bootstrap_servers=broker.bootstrap_servers,
        topic_prefix=prefix,
        topic_partitions="3",
        topic_replication_factor="1",
    )
    topics = [f"{prefix}.checkpoints", f"{prefix}.store", f"{prefix}.dead-letters"]

    # One replica acknowledges alone: refused, naming both values, until told to accept it.
    refused = graphledger("topics", "ensure", env=env)
    assert refused.returncode == 1
    assert "GRAPHLEDGER_TOPIC_REPLICATION_FACTOR 1 and min.insync.replicas 1" in refused.stderr
    assert "--allow-single-broker-acks" in refused.stderr

    first = graphledger("topics", "ensure", "--allow-single-broker-acks", env=env)
    assert first.returncode == 0, first.stderr
    for topic in topics:
        assert f"topics: {topic} created, 3 partitions" in first.stdout
    for topic in topics[:2]:  # tansu describes the configs it was created with
        assert f"topics: {topic} created, 3 partitions, retention.ms -1, replication factor 1, " \
               "min.insync.replicas 1" in first.stdout  # fmt: skip

    second = graphledger("topics", "ensure", env={**env, "GRAPHLEDGER_TOPIC_ALLOW_SINGLE_BROKER_ACKS": "true"})
    assert second.returncode == 0, second.stderr
    for topic in topics:
        assert f"topics: {topic} exists, 3 partitions" in second.stdout


@pytest.mark.parametrize(
    ("args", "variable", "value"),
    [
        (("migrate",), "postgres_schema", "x;drop"),
        (("topics", "ensure"), "postgres_schema", "x;drop"),
        (("topics", "ensure"), "topic_partitions", "0"),
        (("api",), "api_port", "not-a-port"),
    ],
)
def test_bad_setting_exits_non_zero_naming_it(args: tuple[str, ...], variable: str, value: str) -> None:
    result = graphledger(*args, env=clean_env(**{variable: value}))
    assert result.returncode == 2
    assert f"GRAPHLEDGER_{variable.upper()}" in result.stderr
    assert "Traceback" not in result.stderr


def test_secret_settings_are_not_echoed() -> None:
    # A malformed value next to a secret: the error names the bad variable, the secret never appears.
    result = graphledger("migrate", env=clean_env(api_token="s3cret-token", api_port="-1"))
    assert result.returncode == 2
    assert "GRAPHLEDGER_API_PORT" in result.stderr
    assert "s3cret-token" not in result.stderr


def test_missing_server_extra_is_one_clear_message() -> None:
    # `sys.modules[name] = None` makes `import name` fail as if the package were not installed.
    code = (
        "import sys; sys.modules['asyncpg'] = None; "
        "from graphledger_server.cli import main; raise SystemExit(main(['migrate']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
    )
    assert result.returncode == 2
    assert result.stderr.strip() == SERVER_EXTRA_MESSAGE


def test_unreachable_postgres_fails_naming_the_setting(tmp_path: Path) -> None:
    result = graphledger("migrate", env=clean_env(postgres_dsn=f"postgresql://postgres@/postgres?host={tmp_path}"))
    assert result.returncode == 1
    assert "GRAPHLEDGER_POSTGRES_DSN" in result.stderr


def test_exit_after_demo_needs_demo() -> None:
    result = graphledger("dev", "--exit-after-demo", env=clean_env())
    assert result.returncode == 2
    assert "--exit-after-demo needs --demo" in result.stderr


@pytest.mark.parametrize("value", ["20", "-1", "ten"])
def test_a_nice_out_of_range_is_refused_naming_it(value: str) -> None:
    result = graphledger("projector", "--nice", value, env=clean_env())
    assert result.returncode == 2
    assert "--nice" in result.stderr and value in result.stderr


def test_sweeper_stands_by_without_a_database_until_sigterm(tmp_path: Path) -> None:
    log_path = tmp_path / "sweeper.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "graphledger_server", "sweeper"],
            env=clean_env(postgres_dsn=f"postgresql://postgres@/postgres?host={tmp_path}", sweeper_interval_s="0.2"),
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(
            lambda: process.poll() is not None or "standing by until the next try" in log_path.read_text(),
            COMMAND_TIMEOUT_S,
            "the sweeper to start and stand by (no database)",
        )
        assert process.poll() is None, log_path.read_text()
        process.send_signal(signal.SIGTERM)
        assert process.wait(COMMAND_TIMEOUT_S) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    lines = log_path.read_text().splitlines()
    start = json.loads(next(line for line in lines if START_MESSAGE in line))  # services log JSON lines
    assert (start["level"], start["logger"]) == ("INFO", "graphledger_server.sweeper.main")
    assert start["message"] == START_MESSAGE
