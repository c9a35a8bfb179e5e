"""Faults injected for real, as docs/operations-faults.md describes them: a Postgres outage, a broker that
is down, hung or restarted without its log, and projectors scaled 1 -> 3 -> 1 under load with a zombie
batch.

Each test that stops Postgres or the broker runs its own `DevStack` (or broker): the session `stack`
is shared with other tests.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypedDict

import asyncpg
import httpx
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph

from graphledger import KafkaSaver
from graphledger.errors import PublishError, ReadApiError
from graphledger.events import envelope, to_envelope
from graphledger.settings import Settings
from graphledger.wire import CONSISTENCY_HEADER, format_token
from graphledger_server.devstack.broker import EmbeddedBroker
from graphledger_server.devstack.ports import free_port, wait_until
from graphledger_server.devstack.stack import DevStack, settings_to_env
from graphledger_server.log.topics import ensure_topics
from graphledger_server.projection.migrate import migrate
from kafka_clients import raw_admin, raw_producer
from projection_helpers import put

WAIT_S = 180.0


# -- helpers --------------------------------------------------------------------------------------------


class State(TypedDict):
    n: int


def ticking_graph(saver: KafkaSaver, steps: int, gate_at: int, gate: threading.Event, arrived: Callable[[], None]):
    """A graph that ticks `n` up to `steps`, one checkpoint per tick, and waits at `gate_at` for `gate`."""

    def tick(state: State) -> State:
        if state["n"] == gate_at:
            arrived()
            if not gate.wait(WAIT_S):
                raise TimeoutError("the test never opened the gate")
        return {"n": state["n"] + 1}

    builder = StateGraph(State)
    builder.add_node("tick", tick)
    builder.add_edge(START, "tick")
    builder.add_conditional_edges("tick", lambda s: END if s["n"] >= steps else "tick")
    return builder.compile(checkpointer=saver)


class CountingSaver(KafkaSaver):
    """Counts the writes Kafka acknowledged (a put or put_writes that returned)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._count_lock = threading.Lock()
        self.puts = 0
        self.writes = 0

    def put(self, *args: Any, **kwargs: Any) -> Any:
        result = super().put(*args, **kwargs)
        with self._count_lock:
            self.puts += 1
        return result

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        super().put_writes(config, writes, task_id, task_path)
        with self._count_lock:
            self.writes += len(writes)


def sql(dsn: str, query: str, *args: Any) -> list[asyncpg.Record]:
    async def run() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetch(query, *args)
        finally:
            await conn.close()

    return asyncio.run(run())


def execute(dsn: str, script: str) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(script)
        finally:
            await conn.close()

    asyncio.run(run())


def stored_offsets(settings: Settings) -> dict[int, int]:
    rows = sql(
        settings.postgres_dsn,
        f"SELECT partition, next_offset FROM {settings.postgres_schema}.graphledger_offsets "
        "WHERE consumer_group = $1 AND topic = $2",
        settings.projector_group_id,
        settings.checkpoint_topic,
    )
    return {r["partition"]: r["next_offset"] for r in rows}


def count(settings: Settings, table: str) -> int:
    return sql(settings.postgres_dsn, f"SELECT count(*) AS n FROM {settings.postgres_schema}.{table}")[0]["n"]


def ends_of(token: dict[tuple[str, int], int], topic: str) -> dict[int, int]:
    """The log end each partition must reach: one past the newest acknowledged offset."""
    return {partition: offset + 1 for (t, partition), offset in token.items() if t == topic}


def read_log(path: Path) -> str:
    return path.read_text(errors="replace")


def checkpoint_args(thread_id: str) -> tuple[dict[str, Any], Any, dict[str, Any], dict[str, Any]]:
    checkpoint = empty_checkpoint()
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}, checkpoint, {"step": -1}, {}


# -- 1. Postgres outage ---------------------------------------------------------------------------------

OUTAGE_AGENTS = 3
OUTAGE_STEPS = 12
OUTAGE_GATE = 3
RETRY_MAX_S = 1.0
OUTAGE_CAPPED_RETRIES = 15  # at RETRY_MAX_S each, after 0.1 + 0.2 + 0.4 + 0.8: an outage of ~20 s


@pytest.fixture
def outage_stack() -> Iterator[DevStack]:
    base = Settings(api_pool_timeout_s=2.0, consistency_timeout_s=10.0, projector_retry_max_s=RETRY_MAX_S)
    with DevStack(partitions=2, base=base) as stack:
        yield stack


STORE_BATCH = "/v1/store/batch"
STORE_SEARCH = {"op": "search", "namespace_prefix": ["outage"]}


@pytest.mark.slow
def test_postgres_outage_agents_keep_writing_reads_fail_fast_and_all_is_projected_once(
    outage_stack: DevStack,
) -> None:
    stack = outage_stack
    settings = stack.settings
    projector = stack.children["projector"]
    gate = threading.Event()
    arrivals = []
    saver = CountingSaver(settings)
    graph = ticking_graph(saver, OUTAGE_STEPS, OUTAGE_GATE, gate, lambda: arrivals.append(1))
    threads = [f"outage-{i}-{uuid.uuid4().hex[:6]}" for i in range(OUTAGE_AGENTS)]
    api = httpx.Client(base_url=settings.api_url, timeout=30.0)
    try:
        with ThreadPoolExecutor(OUTAGE_AGENTS) as agents:
            # Agents start their runs (a run begins with a read) and stop mid-run at the gate.
            runs = [
                agents.submit(graph.invoke, {"n": 0}, {"configurable": {"thread_id": t}, "recursion_limit": 100})
                for t in threads
            ]
            wait_until(lambda: len(arrivals) == OUTAGE_AGENTS, WAIT_S, "every agent to reach the gate")
            # A store read before the outage leaves a pooled store connection for the outage to break.
            assert api.post(STORE_BATCH, json={"ops": [STORE_SEARCH]}).status_code == 200
            # A thread the read API never read: it has no view of it to fold the log onto (a thread it
            # holds a view of, with every record since, it answers without Postgres).
            unread = f"outage-unread-{uuid.uuid4().hex[:6]}"
            saver.put({"configurable": {"thread_id": unread, "checkpoint_ns": ""}}, empty_checkpoint(), {}, {})

            stack.stop_postgres()
            outage_ended = False
            try:
                # Reads that need Postgres fail fast with a clear, retryable 503, with and without a
                # consistency token.
                for headers in ({}, {CONSISTENCY_HEADER: format_token(saver.consistency_token)}):
                    answer = api.post("/v1/checkpoints/get", json={"thread_id": unread}, headers=headers)
                    assert answer.status_code == 503, answer.text
                    assert answer.json()["error"] == "postgres_unavailable"
                    assert answer.json()["retryable"] is True
                    assert answer.headers["Retry-After"] == "1"
                # The writer reads its own thread without Postgres (the newest checkpoint it keeps, and
                # its own writes: the log shows nothing else); another process fails fast, retryably.
                assert saver.get_tuple({"configurable": {"thread_id": threads[0]}}) is not None
                with KafkaSaver(settings) as other, pytest.raises(ReadApiError) as failed:
                    other.get_tuple({"configurable": {"thread_id": unread}})
                assert failed.value.status == 503 and failed.value.retryable
                # Store reads (their own pool, asyncpg) too: the broken connection, then a refused one.
                for _ in range(2):
                    answer = api.post(STORE_BATCH, json={"ops": [STORE_SEARCH]})
                    assert answer.status_code == 503, answer.text
                    assert answer.json()["error"] == "postgres_unavailable"
                    assert answer.headers["Retry-After"] == "1"

                # The agents finish their runs while Postgres is down: writes only need Kafka.
                gate.set()
                for run in runs:
                    assert run.result(WAIT_S)["n"] == OUTAGE_STEPS
                # Those writes sealed with the data keys the agents hold. A write that needs a new one
                # (a process that never wrote) asks the key store, in Postgres: it fails fast, retryably.
                fresh = {"configurable": {"thread_id": f"outage-new-{uuid.uuid4().hex[:6]}", "checkpoint_ns": ""}}
                with KafkaSaver(settings) as newcomer, pytest.raises(ReadApiError) as no_key:
                    newcomer.put(fresh, empty_checkpoint(), {"source": "input", "step": -1}, {})
                assert no_key.value.status == 503 and no_key.value.retryable, no_key.value

                # The projector retries the same batch, backing off to the cap, without exiting.
                def delays() -> list[float]:
                    pattern = r"batch of \d+ records failed \(.*?\); retrying in ([0-9.]+)s"
                    return [float(d) for d in re.findall(pattern, read_log(projector.log_path))]

                wait_until(lambda: delays().count(RETRY_MAX_S) >= OUTAGE_CAPPED_RETRIES, WAIT_S, "~20 s of retries")
                assert projector.running
                delays = delays()
                assert delays[:5] == [0.1, 0.2, 0.4, 0.8, RETRY_MAX_S], delays[:8]
                assert max(delays) == RETRY_MAX_S
            finally:
                stack.start_postgres()
                outage_ended = True
        assert outage_ended

        # Everything acknowledged is projected once Postgres is back, and nothing beyond it.
        ends = ends_of(saver.consistency_token, settings.checkpoint_topic)
        wait_until(lambda: stored_offsets(settings) == ends, WAIT_S, "the projector to apply the outage's writes")
        assert projector.running and stack.children["projector"].process.pid == projector.process.pid
        assert count(settings, "checkpoints") == saver.puts
        assert count(settings, "checkpoint_writes") == saver.writes
        # Once the read API is ready again, reads with the agents' consistency token see every run's last step.
        wait_until(lambda: api.get("/readyz").status_code == 200, WAIT_S, "the read API to be ready", poll_s=0.5)
        for thread in threads:
            assert graph.get_state({"configurable": {"thread_id": thread}}).values == {"n": OUTAGE_STEPS}
        assert api.post(STORE_BATCH, json={"ops": [STORE_SEARCH]}).status_code == 200  # the first store read after
    finally:
        gate.set()
        api.close()
        saver.close()


# -- 2. broker trouble ----------------------------------------------------------------------------------

PRODUCE_TIMEOUT_S = 3.0


def test_writes_to_a_down_or_hung_broker_fail_after_the_deadline_and_the_same_saver_recovers(tmp_path: Path) -> None:
    port = free_port()
    settings = Settings(
        kafka_bootstrap_servers=f"127.0.0.1:{port}",
        kafka_idempotence=False,
        topic_prefix=f"t{uuid.uuid4().hex[:10]}",
        topic_partitions=2,
        topic_replication_factor=1,
        topic_allow_single_broker_acks=True,
        produce_timeout_s=PRODUCE_TIMEOUT_S,
        encrypt_events=False,  # the broker alone: no read API to get data keys from
    )
    saver = KafkaSaver(settings)
    calls = ThreadPoolExecutor(1)

    def write(thread_id: str) -> Any:
        # Bounded by the test too, so a write that hangs fails here instead of hanging the suite.
        return calls.submit(saver.put, *checkpoint_args(thread_id)).result(WAIT_S)

    broker: EmbeddedBroker | None = None
    try:
        # Down from the start: a clear, retryable error naming the broker.
        with pytest.raises(PublishError) as down:
            write("before-the-broker")
        assert down.value.retryable and f"127.0.0.1:{port}" in str(down.value)

        broker = EmbeddedBroker.start(tmp_path, port=port)
        asyncio.run(ensure_topics(settings))
        assert write("broker-up")["configurable"]["thread_id"] == "broker-up"
        before = dict(saver.consistency_token)

        # Hung mid-run (SIGSTOP): the write fails at the deadline; nothing acknowledged, no token.
        broker.process.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: _stopped(broker.process.pid), WAIT_S, "the broker to be stopped (SIGSTOP)")
            with pytest.raises(PublishError) as hung:
                write("broker-hung")
            assert hung.value.retryable and f"within {PRODUCE_TIMEOUT_S}s" in str(hung.value)
            assert saver.consistency_token == before
        finally:
            broker.process.send_signal(signal.SIGCONT)
        write_after(write, "broker-thawed")

        # Gone mid-run (stopped): the same, and the same saver writes again once a broker is back.
        broker.stop()
        with pytest.raises(PublishError):
            write("broker-gone")
        broker = EmbeddedBroker.start(tmp_path, port=port)
        asyncio.run(ensure_topics(settings))
        write_after(write, "broker-back")
    finally:
        saver.close()
        calls.shutdown()
        if broker is not None:
            broker.stop()


def _stopped(pid: int) -> bool:
    """Whether the process is stopped (state `T` in /proc): a SIGSTOP sent is not yet a process stopped."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


def write_after(write: Callable[[str], Any], thread_id: str) -> None:
    """The saver recovers by itself: a write succeeds again (the first attempts may still meet the
    producer's reconnect), with no restart of the saver."""
    errors: list[PublishError] = []

    def succeeds() -> bool:
        try:
            write(thread_id)
            return True
        except PublishError as exc:
            errors.append(exc)
            return False

    wait_until(succeeds, WAIT_S, f"a write after the broker came back (errors: {errors[-1:]})", poll_s=0.5)


@pytest.fixture
def broker_stack() -> Iterator[DevStack]:
    base = Settings(produce_timeout_s=PRODUCE_TIMEOUT_S, metrics_port=free_port())
    with DevStack(partitions=2, base=base) as stack:
        yield stack


def graphledger(stack: DevStack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHLEDGER_")}
    env.update(stack.service_env())
    return subprocess.run(
        [sys.executable, "-m", "graphledger_server", *args], env=env, capture_output=True, text=True, timeout=120
    )


def stopped_gauge(stack: DevStack) -> set[str]:
    """Partitions the projector's `graphledger_projector_partitions_stopped` gauge reports."""
    text = httpx.get(stack.metrics_urls()["projector"], timeout=10).text
    return set(
        re.findall(r'graphledger_projector_partitions_stopped\{[^}]*messaging_destination_partition_id="(\d+)"', text)
    )


@pytest.mark.slow
def test_a_failed_step_is_retried_and_a_lost_log_stops_the_partition_until_reset(broker_stack: DevStack) -> None:
    stack = broker_stack
    settings = stack.settings
    projector = stack.children["projector"]
    topic = settings.checkpoint_topic
    saver = CountingSaver(settings)
    never = threading.Event()
    never.set()
    graph = ticking_graph(saver, 3, -1, never, lambda: None)
    try:
        # A hung broker fails the graph step after the deadline; retried once it is back, the run completes.
        config = {"configurable": {"thread_id": "step-retry"}}
        stack.freeze_broker()
        try:
            with pytest.raises(PublishError):
                graph.invoke({"n": 0}, config)
        finally:
            stack.thaw_broker()
        wait_until(lambda: _invokes(graph, config), WAIT_S, "the retried run to succeed", poll_s=0.5)
        assert graph.get_state(config).values == {"n": 3}

        # Enough writes that both partitions' stored offsets are well past what the new log will hold.
        for i in range(8):
            graph.invoke({"n": 0}, {"configurable": {"thread_id": f"before-{i}"}})
        ends = ends_of(saver.consistency_token, topic)
        wait_until(lambda: stored_offsets(settings) == ends, WAIT_S, "the writes before the restart to apply")
        before = count(settings, "checkpoints")

        # The broker restarts without its log: the same saver writes again, from offset 0.
        stack.stop_broker()
        stack.start_broker()
        wait_until(lambda: _writes(saver, "after-restart"), WAIT_S, "a write to the new broker", poll_s=0.5)
        assert all(ends[p] > 1 for p in ends)

        # The projector stops every partition whose stored offset the new log does not reach, says
        # so with the command to run, reports it in a metric, and applies nothing of the new log.
        log_text = lambda: read_log(projector.log_path)  # noqa: E731
        wait_until(lambda: log_text().count("stopping partition") >= len(ends), WAIT_S, "the projector to stop")
        assert "graphledger offsets reset" in log_text()
        wait_until(lambda: stopped_gauge(stack) == {str(p) for p in ends}, WAIT_S, "the stopped-partitions gauge")
        assert projector.running
        assert stored_offsets(settings) == ends
        assert count(settings, "checkpoints") == before

        # Without --yes the command only says what it would do.
        for partition in ends:
            dry = graphledger(
                stack, "offsets", "reset", "--topic", topic, "--partition", str(partition), "--to", "earliest"
            )
            assert dry.returncode == 2 and "pass --yes" in dry.stdout, dry
        assert stored_offsets(settings) == ends
        bad = graphledger(stack, "offsets", "reset", "--topic", "nope", "--partition", "0", "--to", "earliest", "--yes")
        assert bad.returncode == 1 and "not one the projector consumes" in bad.stderr, bad

        # With --yes, the running projector resumes from the new log's beginning and applies it.
        for partition in ends:
            done = graphledger(
                stack, "offsets", "reset", "--topic", topic, "--partition", str(partition), "--to", "earliest", "--yes"
            )
            assert done.returncode == 0 and f"from {ends[partition]} to 0" in done.stdout, done
        wait_until(lambda: _has_thread(settings, "after-restart"), WAIT_S, "the new log to be applied")
        wait_until(lambda: not stopped_gauge(stack), WAIT_S, "the gauge to clear")
        assert projector.running
    finally:
        saver.close()


def _invokes(graph: Any, config: dict[str, Any]) -> bool:
    try:
        graph.invoke({"n": 0}, config)
        return True
    except PublishError:
        return False


def _has_thread(settings: Settings, thread_id: str) -> bool:
    rows = sql(
        settings.postgres_dsn,
        f"SELECT 1 FROM {settings.postgres_schema}.checkpoints WHERE thread_id = $1",
        thread_id,
    )
    return bool(rows)


def _writes(saver: KafkaSaver, thread_id: str) -> bool:
    try:
        saver.put(*checkpoint_args(thread_id))
        return True
    except PublishError:
        return False


# -- 3. rebalance under load ----------------------------------------------------------------------------

SCALE_PARTITIONS = 6

AUDIT_SQL = """
CREATE TABLE {schema}.applied_audit (thread_id text, checkpoint_id text);
CREATE FUNCTION {schema}.audit_apply() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO {schema}.applied_audit VALUES (NEW.thread_id, NEW.checkpoint_id);
  RETURN NEW;
END $$;
-- BEFORE INSERT fires for every row an INSERT proposes, also one that then hits ON CONFLICT: a
-- checkpoint applied twice leaves two audit rows, though its projected row looks the same.
CREATE TRIGGER audit_apply BEFORE INSERT ON {schema}.checkpoints
  FOR EACH ROW EXECUTE FUNCTION {schema}.audit_apply();

CREATE TABLE {schema}.offset_audit (
  partition int, before bigint, after bigint, at timestamptz DEFAULT clock_timestamp()
);
CREATE FUNCTION {schema}.audit_offset() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO {schema}.offset_audit (partition, before, after) VALUES (OLD.partition, OLD.next_offset, NEW.next_offset);
  RETURN NEW;
END $$;
CREATE TRIGGER audit_offset BEFORE UPDATE ON {schema}.graphledger_offsets
  FOR EACH ROW EXECUTE FUNCTION {schema}.audit_offset();
"""


class Projectors:
    """Projector processes of one consumer group, started and stopped like replicas of a deployment."""

    def __init__(self, settings: Settings, log_dir: Path) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHLEDGER_")}
        # A batch waits up to half a second to fill, so a batch held up holds every partition's records.
        env.update(settings_to_env(self.settings), GRAPHLEDGER_BATCH_MAX_WAIT_MS="500")
        log = self.log_dir / f"projector-{len(self.processes)}.log"
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "graphledger_server.projector"], env=env, stdout=out, stderr=subprocess.STDOUT
            )
        self.processes.append(process)
        return process

    def terminate(self, process: subprocess.Popen[bytes]) -> int:
        process.send_signal(signal.SIGTERM)
        return process.wait(60)

    def logs(self) -> str:
        return "".join(read_log(p) for p in sorted(self.log_dir.glob("projector-*.log")))

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def group_members(settings: Settings) -> tuple[str, int]:
    async def describe() -> tuple[str, int]:
        admin = raw_admin(settings)
        await admin.start()
        try:
            for response in await admin.describe_consumer_groups([settings.projector_group_id]):
                for group in response.groups:
                    if group[1] == settings.projector_group_id:
                        return str(group[2]), len(group[5])
        finally:
            await admin.close()
        return "Dead", 0

    return asyncio.run(describe())


class Load:
    """A producer in its own thread sending checkpoint puts round-robin over the partitions until stopped."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.sent: list[tuple[str, str]] = []
        self.ends: dict[int, int] = {}
        self._running = threading.Event()
        self._stop = threading.Event()
        self._burst = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def burst(self, n: int) -> None:
        with self._lock:
            self._burst += n

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(WAIT_S)
        if self.error is not None:
            raise self.error

    async def _run(self) -> None:
        producer = raw_producer(self.settings)
        await producer.start()
        try:
            i = 0
            while not self._stop.is_set():
                with self._lock:
                    size, self._burst = max(1, self._burst), 0
                futures = []
                for _ in range(size * SCALE_PARTITIONS):
                    thread_id, partition = f"load-{i}", i % SCALE_PARTITIONS
                    event = put(thread_id, i)
                    futures.append(
                        await producer.send(
                            self.settings.checkpoint_topic,
                            envelope.encode(to_envelope(event)),
                            key=thread_id.encode(),
                            partition=partition,
                        )
                    )
                    self.sent.append((thread_id, event.checkpoint_id))
                    i += 1
                for meta in await asyncio.gather(*futures):
                    self.ends[meta.partition] = max(self.ends.get(meta.partition, 0), meta.offset + 1)
                await asyncio.sleep(0.05)  # pacing of the load, not synchronisation
        except BaseException as exc:
            self.error = exc
        finally:
            await producer.stop()


def lock_waiters(settings: Settings) -> int:
    """Backends of this database waiting for a lock (projector batches held up on the offset rows)."""
    rows = sql(
        settings.postgres_dsn,
        "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    return rows[0]["n"]


@pytest.mark.slow
def test_scaling_projectors_1_3_1_under_load_applies_every_event_exactly_once(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = make_settings(topic_partitions=SCALE_PARTITIONS, batch_max_events=500)
    asyncio.run(ensure_topics(settings))
    asyncio.run(migrate(settings.postgres_dsn, settings.postgres_schema))
    schema = settings.postgres_schema
    execute(settings.postgres_dsn, AUDIT_SQL.replace("{schema}", schema))
    projectors = Projectors(settings, tmp_path)
    load = Load(settings)
    holder: list[asyncpg.Connection] = []
    try:
        first = projectors.start()
        load.start()
        wait_until(lambda: len(stored_offsets(settings)) == SCALE_PARTITIONS, WAIT_S, "every partition applied once")

        # A zombie in the making: hold every offset row, so the one worker's next batch (which, filling
        # for 500 ms, holds records of every partition) waits in its transaction. Scaling to three
        # moves partitions away from it (its revoke gives up waiting after 10 s); the new owners fetch
        # the same records from the stored offsets and wait too. Then let them all race.
        locker = asyncio.new_event_loop()
        conn = locker.run_until_complete(asyncpg.connect(settings.postgres_dsn))
        holder.append(conn)
        transaction = conn.transaction()
        locker.run_until_complete(transaction.start())
        locker.run_until_complete(
            conn.fetch(f"SELECT * FROM {schema}.graphledger_offsets WHERE consumer_group = $1 FOR UPDATE",
                       settings.projector_group_id)
        )  # fmt: skip
        load.burst(20)
        wait_until(lambda: lock_waiters(settings) >= 1, WAIT_S, "the first worker's batch to wait on the rows")
        projectors.start()
        projectors.start()
        wait_until(lambda: group_members(settings) == ("Stable", 3), WAIT_S, "three workers in the group", poll_s=0.5)
        wait_until(lambda: lock_waiters(settings) >= 3, WAIT_S, "the new owners' batches to wait too", poll_s=0.5)
        locker.run_until_complete(transaction.rollback())

        # Scale back to one with clean stops, still under load.
        for process in projectors.processes[1:]:
            assert projectors.terminate(process) == 0
        wait_until(lambda: group_members(settings) == ("Stable", 1), WAIT_S, "one worker again", poll_s=0.5)
        load.burst(20)
        wait_until(lambda: len(load.sent) > 0 and stored_offsets(settings) != {}, WAIT_S, "load after scaling down")
        load.stop()
        wait_until(lambda: stored_offsets(settings) == load.ends, WAIT_S, "every record to be applied")
        assert first.poll() is None
        assert projectors.terminate(first) == 0
    finally:
        load._stop.set()
        projectors.close()
        for conn in holder:
            locker.run_until_complete(conn.close())

    # No loss: every acknowledged put is projected.
    rows = sql(settings.postgres_dsn, f"SELECT thread_id, checkpoint_id FROM {schema}.checkpoints")
    assert sorted((r["thread_id"], r["checkpoint_id"]) for r in rows) == sorted(load.sent)
    # No duplicates: each was applied by exactly one committed transaction.
    audit = sql(
        settings.postgres_dsn,
        f"SELECT thread_id, checkpoint_id, count(*) AS n FROM {schema}.applied_audit GROUP BY 1, 2",
    )
    assert {(r["thread_id"], r["checkpoint_id"]) for r in audit} == set(load.sent)
    assert [r for r in audit if r["n"] != 1] == []
    # Offsets only ever moved forward, each batch starting where the previous commit ended.
    moves = sql(settings.postgres_dsn, f"SELECT partition, before, after FROM {schema}.offset_audit ORDER BY at")
    for partition in range(SCALE_PARTITIONS):
        steps = [(m["before"], m["after"]) for m in moves if m["partition"] == partition]
        assert all(after > before for before, after in steps), steps
        assert all(b == a for (_, a), (b, _) in itertools.pairwise(steps)), steps
    # The race really happened: a batch arrived with records another worker had committed, and skipped them.
    skipped = [int(n) for n in re.findall(r"skipped (\d+) records applied before", projectors.logs())]
    assert sum(skipped) > 0, "no batch was fenced; the test proved nothing"

    # The audit itself catches a second application (so its silence above means something).
    thread_id, checkpoint_id = load.sent[0]
    sql(
        settings.postgres_dsn,
        f"INSERT INTO {schema}.checkpoints (thread_id, checkpoint_ns, checkpoint_id, checkpoint, metadata) "
        "SELECT thread_id, checkpoint_ns, checkpoint_id, checkpoint, metadata FROM "
        f"{schema}.checkpoints WHERE thread_id = $1 ON CONFLICT DO NOTHING",
        thread_id,
    )
    again = sql(
        settings.postgres_dsn, f"SELECT count(*) AS n FROM {schema}.applied_audit WHERE thread_id = $1", thread_id
    )
    assert again[0]["n"] == 2 and checkpoint_id
