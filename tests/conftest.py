"""Session fixtures: one embedded Postgres and one tansu broker for the whole run, on free ports, and the
dev stack; and the rule that keeps each kind of test in its directory.

Every server starts when the first test asks for it (fixtures are lazy), so `make test-unit` starts none.
Each test module that needs isolation takes its own database (`fresh_database`) and topic prefix.

Kinds (`pytest -m unit`, `-m integration`, `-m acceptance` select them as their directories do):
- `tests/unit/`: pure code, no server fixture; a client test uses the fakes of `fakes.py`.
- `tests/integration/`: the real broker and/or Postgres (`pg`, `broker`, `fresh_database`,
  `make_settings`, `empty_log`), services in the test's process; never a fake of either.
- `tests/acceptance/`: the dev stack (`stack`, or a `DevStack` of its own), the CLI and services as
  subprocesses, LangGraph graphs end to end, faults, several processes.
Helper modules (`tests/*.py`, `tests/fixtures/`) are imported by bare name from any kind: `tests/` is on
`sys.path` (`pythonpath` in pyproject.toml).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
import pytest

os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())

from graphledger.settings import Settings
from graphledger_server.devstack import KEEP_LOGS_ENV
from graphledger_server.devstack.broker import EmbeddedBroker
from graphledger_server.devstack.postgres import EmbeddedPostgres
from graphledger_server.keys.ring import new_key_entry

# The session's key-encryption key, from the environment as a deployment's Secret gives it: every test's
# services seal events (the default), as in production, and child processes inherit it.
os.environ.setdefault("GRAPHLEDGER_KEY_ENCRYPTION_KEYS", new_key_entry("test"))

KINDS = ("unit", "integration", "acceptance")
SERVER_FIXTURES = frozenset(
    {"pg", "broker", "stack", "fresh_database", "make_settings", "ready_settings", "db", "empty_log", "filled_log"}
)
"""The fixtures that start the session's Postgres, broker or dev stack, or need one of them."""


def _sort_by_kind(items: list[pytest.Item]) -> None:
    """Mark each test with its kind, and refuse one outside its kind's directory or beyond its kind:
    a unit test asking for a server, an integration test asking for the dev stack."""
    tests = Path(__file__).parent
    problems = []
    for item in items:
        parts = item.path.relative_to(tests).parts if item.path.is_relative_to(tests) else ()
        kind = parts[0] if len(parts) > 1 and parts[0] in KINDS else None
        servers = SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if kind is None:
            problems.append(f"{item.nodeid}: a test lives in tests/unit, tests/integration or tests/acceptance")
        elif kind == "unit" and servers:
            problems.append(f"{item.nodeid}: a unit test asks for {', '.join(sorted(servers))}; it belongs in "
                            "tests/integration or tests/acceptance")  # fmt: skip
        elif kind == "integration" and "stack" in servers:
            problems.append(
                f"{item.nodeid}: an integration test asks for the dev stack; it belongs in tests/acceptance"
            )
        else:
            item.add_marker(kind)
    if problems:
        raise pytest.UsageError("\n".join(problems))


PROMETHEUS_BINARIES = ("prometheus", "promtool")
PROMETHEUS_SKIPPED = pytest.StashKey[int]()


def missing_prometheus() -> list[str]:
    """The Prometheus binaries the `prometheus`-marked tests need that are not on PATH."""
    return [name for name in PROMETHEUS_BINARIES if shutil.which(name) is None]


def _skip_prometheus(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip exactly the `prometheus`-marked tests when the binaries are missing (said once, at the end)."""
    missing = missing_prometheus()
    if not missing:
        return
    skip = pytest.mark.skip(reason=f"{' and '.join(missing)} not on PATH")
    marked = [item for item in items if item.get_closest_marker("prometheus") is not None]
    for item in marked:
        item.add_marker(skip)
    config.stash[PROMETHEUS_SKIPPED] = len(marked)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _sort_by_kind(items)
    _skip_prometheus(config, items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    """A failing test on the session's dev stack carries what its services warned of meanwhile."""
    outcome = yield
    report = outcome.get_result()
    stack = getattr(item, "funcargs", {}).get("stack")
    if report.failed and stack is not None:
        from stack_warnings import warnings_since

        if seen := warnings_since(stack.log_dir, call.start):
            report.sections.append((f"dev stack warnings during {call.when}", seen))


@pytest.fixture(autouse=True)
def _tasks_printed_before_the_timeout(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that hangs shows where its coroutines wait (`hang_dump.py`)."""
    from hang_dump import tasks_printed_before

    marker = request.node.get_closest_marker("timeout")  # pytest-timeout's order: marker, --timeout, ini
    given = marker.args[0] if marker is not None and marker.args else request.config.getoption("timeout")
    with tasks_printed_before(float(given if given is not None else request.config.getini("timeout"))):
        yield


STACK_LOGS = pytest.StashKey[Path]()
EXIT_STATUS = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    """Every dev stack of the run (its xdist workers' too: they inherit the variable) copies its services'
    logs into one directory when it stops, kept when the run failed and removed when it passed."""
    if os.environ.get(KEEP_LOGS_ENV) is None:
        os.environ[KEEP_LOGS_ENV] = tempfile.mkdtemp(prefix="graphledger-test-logs-")
        config.stash[STACK_LOGS] = Path(os.environ[KEEP_LOGS_ENV])


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[EXIT_STATUS] = exitstatus


def pytest_unconfigure(config: pytest.Config) -> None:
    logs = config.stash.get(STACK_LOGS, None)
    if logs is not None and config.stash.get(EXIT_STATUS, 0) == 0:
        shutil.rmtree(logs, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    logs = config.stash.get(STACK_LOGS, None)
    if logs is not None and config.stash.get(EXIT_STATUS, 0) != 0 and any(logs.iterdir()):
        terminalreporter.write_line(f"the dev stacks' service logs of this run are kept in {logs}")
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
    """Settings for an isolated graphledger: own topic prefix, own database, tansu-compatible producer.
    Events of a thread or namespace published in the clear are applied (`accept_clear_events`), as in a
    log with a clear era: tests build logs by hand; those of sealing pass `accept_clear_events=False`."""

    def make(**overrides: object) -> Settings:
        values: dict[str, object] = {
            "kafka_bootstrap_servers": broker.bootstrap_servers,
            "kafka_idempotence": False,
            "topic_prefix": f"t{uuid.uuid4().hex[:10]}",
            "topic_partitions": 4,
            "topic_replication_factor": 1,
            "topic_allow_single_broker_acks": True,  # the one tansu broker
            "projector_group_id": f"g{uuid.uuid4().hex[:10]}",
            "accept_clear_events": True,
        }
        if "postgres_dsn" not in overrides:
            values["postgres_dsn"] = pg.create_database(f"t_{uuid.uuid4().hex[:12]}")
        values.update(overrides)
        return Settings(**values)  # type: ignore[arg-type]

    return make


@pytest.fixture
def ready_settings(make_settings: Callable[..., Settings]) -> Callable[..., Awaitable[Settings]]:
    """`make_settings` (awaited), then its topics created and its projection migrated: what a test's
    projector, read API or command finds in a deployment before it starts."""
    from graphledger_server.log.topics import ensure_topics
    from projection_helpers import migrated

    async def make(**overrides: object) -> Settings:
        settings = make_settings(**overrides)
        await ensure_topics(settings)
        return await migrated(settings)

    return make


@pytest.fixture
async def db(settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    """A connection to the database of the test module's `settings` fixture."""
    conn = await asyncpg.connect(settings.postgres_dsn)
    yield conn
    await conn.close()


@pytest.fixture(scope="session")
def empty_log(broker: EmbeddedBroker) -> dict[str, object]:
    """Kafka settings naming existing, empty topics: for a read API over a projection a test fills
    directly, which must learn from the log that nothing waits to be projected."""
    import asyncio

    from graphledger_server.log.topics import ensure_topics

    values: dict[str, object] = {
        "kafka_bootstrap_servers": broker.bootstrap_servers,
        "kafka_idempotence": False,
        "topic_prefix": f"t{uuid.uuid4().hex[:10]}",
        "topic_partitions": 4,
        "topic_replication_factor": 1,
        "topic_allow_single_broker_acks": True,
    }
    asyncio.run(ensure_topics(Settings(**values)))  # type: ignore[arg-type]
    return values


@pytest.fixture(scope="session")
def filled_log(empty_log: dict[str, object]) -> dict[str, object]:
    """Kafka settings naming topics that hold records (`filled_log.py`): consistency tokens can name
    offsets within the log."""
    import asyncio

    from filled_log import fill_topics

    values = {**empty_log, "topic_prefix": f"t{uuid.uuid4().hex[:10]}"}
    asyncio.run(fill_topics(Settings(**values)))  # type: ignore[arg-type]
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
