"""Session fixtures: one embedded Postgres and one tansu broker for the whole run, on free ports.

Each test module that needs isolation takes its own database (`fresh_database`) and topic prefix.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())

from graphledger.settings import Settings
from graphledger_server.devstack.broker import EmbeddedBroker
from graphledger_server.devstack.postgres import EmbeddedPostgres

PROMETHEUS_BINARIES = ("prometheus", "promtool")
PROMETHEUS_SKIPPED = pytest.StashKey[int]()


def missing_prometheus() -> list[str]:
    """The Prometheus binaries the `prometheus`-marked tests need that are not on PATH."""
    return [name for name in PROMETHEUS_BINARIES if shutil.which(name) is None]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip exactly the `prometheus`-marked tests when the binaries are missing (said once, at the end)."""
    missing = missing_prometheus()
    if not missing:
        return
    skip = pytest.mark.skip(reason=f"{' and '.join(missing)} not on PATH")
    marked = [item for item in items if item.get_closest_marker("prometheus") is not None]
    for item in marked:
        item.add_marker(skip)
    config.stash[PROMETHEUS_SKIPPED] = len(marked)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    skipped = config.stash.get(PROMETHEUS_SKIPPED, 0)
    if skipped:
        terminalreporter.write_line(
            f"skipped {skipped} Prometheus tests (dashboards and alert rules): {' and '.join(missing_prometheus())} "
            "not on PATH; install Debian's `prometheus` package (apt-get install -y prometheus) to run them"
        )


@pytest.fixture(scope="session")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="graphledger-test-") as d:
        yield Path(d)


@pytest.fixture(scope="session")
def pg(workdir: Path) -> Iterator[EmbeddedPostgres]:
    server = EmbeddedPostgres.start(workdir / "pg", keep=False)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def broker(workdir: Path) -> Iterator[EmbeddedBroker]:
    server = EmbeddedBroker.start(workdir / "broker")
    yield server
    server.stop()


@pytest.fixture
def fresh_database(pg: EmbeddedPostgres) -> str:
    """DSN of a new, empty database."""
    return pg.create_database(f"t_{uuid.uuid4().hex[:12]}")


@pytest.fixture
def make_settings(broker: EmbeddedBroker, pg: EmbeddedPostgres):
    """Settings for an isolated graphledger: own topic prefix, own database, tansu-compatible producer."""

    def make(**overrides: object) -> Settings:
        values: dict[str, object] = {
            "kafka_bootstrap_servers": broker.bootstrap_servers,
            "kafka_idempotence": False,
            "topic_prefix": f"t{uuid.uuid4().hex[:10]}",
            "topic_partitions": 4,
            "topic_replication_factor": 1,
            "projector_group_id": f"g{uuid.uuid4().hex[:10]}",
        }
        if "postgres_dsn" not in overrides:
            values["postgres_dsn"] = pg.create_database(f"t_{uuid.uuid4().hex[:12]}")
        values.update(overrides)
        return Settings(**values)  # type: ignore[arg-type]

    return make


@pytest.fixture(scope="session")
def empty_log(broker: EmbeddedBroker) -> dict[str, object]:
    """Kafka settings naming existing, empty topics: for a read API over a projection a test fills
    directly, which must learn from the log that nothing waits to be projected."""
    import asyncio

    from graphledger_server.commands.topics import ensure_topics

    values: dict[str, object] = {
        "kafka_bootstrap_servers": broker.bootstrap_servers,
        "kafka_idempotence": False,
        "topic_prefix": f"t{uuid.uuid4().hex[:10]}",
        "topic_partitions": 4,
        "topic_replication_factor": 1,
    }
    asyncio.run(ensure_topics(Settings(**values)))  # type: ignore[arg-type]
    return values


if TYPE_CHECKING:
    from graphledger_server.devstack.stack import DevStack


@pytest.fixture(scope="session")
def stack() -> Iterator[DevStack]:
    """The whole dev stack (Postgres, tansu, projector, read API, sweeper as child processes), started
    once for the session exactly as `graphledger dev` starts it, in a temporary directory."""
    from graphledger_server.devstack.stack import DevStack

    dev = DevStack(partitions=4)
    dev.start()
    try:
        yield dev
    finally:
        dev.stop()
