"""The projection contract: what every topic projection guarantees, run against each one on real Postgres.

As eventsourcing's abstract persistence tests do for its recorders, `ProjectionContract` states the
guarantees once (the log is the source of truth; delivery is at least once, the effect exactly once)
and each projection runs them by subclassing it with its own events:
- a batch applied twice through `BatchApplier` equals it applied once: the offset rows skip every
  record the second time, in the same applier or a restarted one;
- events a redelivery past the offset rows meets again (a worker died after Postgres committed, before
  it knew) change nothing when the projection's own apply takes them a second time;
- the events of one key apply in log order, whatever the batch boundaries;
- events of other keys (threads, namespaces) leave a key's rows alone, even on its partition, in its batch;
- a replay of the same records into a fresh schema, with other batch boundaries and the partitions
  split over lanes as the rebuild splits them, equals the live projection row for row, and by the
  replay's own checksums;
- the fold the read API lays over the projection (`graphledger.folds.thread`, `graphledger.folds.store_item`) answers
  a read as the projection does once it has applied the same events, for every event type, or says it
  cannot for the events the docs list as ones a read waits for (`TestCheckpointFold`, `TestStoreFold`).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import zlib
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import asyncpg
import orjson
import pytest

import projection_helpers as checkpoints
import store_helpers as store
from graphledger.erasure.sealing import SealedSubject
from graphledger.events import envelope
from graphledger.events.checkpoint import (
    CheckpointPut,
    RunsDelete,
    ThreadCopy,
    ThreadCopyBarrier,
    ThreadDelete,
    ThreadExpire,
    ThreadPrune,
)
from graphledger.events.erasure import TenantErase, ThreadErase
from graphledger.events.store import StoreExpire, StoreRefresh
from graphledger.folds import store_item, thread
from graphledger.log.records import LogRecord
from graphledger.opening.records import DeadLetter
from graphledger_server.api.consistency.read_through import thread_events
from graphledger_server.api.reads.checkpoint_sql import BLOB_CEILINGS_SQL, THREAD_NAMESPACES_SQL
from graphledger_server.api.reads.saver import PassThroughSerde, TenantSaver, wire_tuple
from graphledger_server.api.reads.store_sql import item_rows_statement
from graphledger_server.api.tenant import Tenant
from graphledger_server.log.offsets import OffsetStatements, group_offsets
from graphledger_server.opening.vector_index import VectorIndex
from graphledger_server.projection import erasure
from graphledger_server.projection.batch import BatchApplier, TopicProjection
from graphledger_server.projection.checkpoints import CheckpointProjection
from graphledger_server.projection.migrate import migrate
from graphledger_server.projection.store import StoreProjection
from graphledger_server.replay.checksums import compare

Rows = dict[str, list[tuple[Any, ...]]]
GROUP = "contract"
LIVE_BATCH_SIZES = (1, 2, 3, 5, 8, 13)
"""The projector's batches end wherever a fetch ended: the live side cuts the log at random among these."""
REPLAY_BATCH = 4
REPLAY_LANES = 2


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test taking `log_name` runs once per log its projection's class names in `LOGS`."""
    if "log_name" in metafunc.fixturenames and metafunc.cls is not None:
        metafunc.parametrize("log_name", metafunc.cls.LOGS)


def relog(records: Sequence[LogRecord], partition: int = 0) -> list[LogRecord]:
    """The same records (keys, values, producer times) at consecutive offsets of one partition."""
    return [dataclasses.replace(r, partition=partition, offset=i) for i, r in enumerate(records)]


def of_key(rows: Rows, columns: tuple[Any, ...]) -> Rows:
    """The rows whose leading columns are `columns` (a thread id; a namespace prefix and key)."""
    return {table: [r for r in found if r[: len(columns)] == columns] for table, found in rows.items()}


@dataclasses.dataclass
class Fetches:
    """Batches applied as the projector applies what it fetched: a partition held at a record (a copy
    barrier whose copy has not applied yet, `BatchResult.paused`) is fetched again from that record, with
    the next batch."""

    applier: BatchApplier
    conn: asyncpg.Connection
    held: list[LogRecord] = dataclasses.field(default_factory=list)
    applied: int = 0
    skipped: int = 0

    async def apply(self, batch: Sequence[LogRecord]) -> None:
        records = [*self.held, *batch]
        if records:
            result = await self.applier.apply(self.conn, records)
            self.applied += result.applied
            self.skipped += result.skipped
            self.held = [r for r in records if r.offset >= result.paused.get((r.topic, r.partition), r.offset + 1)]


async def drain(*fetches: Fetches) -> None:
    """Fetch the held partitions again until none is held (each round can release the next)."""
    for _ in range(sum(len(f.held) for f in fetches) + 1):
        if not any(f.held for f in fetches):
            return
        for f in fetches:
            await f.apply([])
    raise AssertionError(f"held for ever: {[r for f in fetches for r in f.held]}")


def end_offsets(records: Sequence[LogRecord]) -> dict[tuple[str, int], int]:
    ends: dict[tuple[str, int], int] = {}
    for r in records:
        ends[(r.topic, r.partition)] = max(ends.get((r.topic, r.partition), 0), r.offset + 1)
    return ends


@pytest.fixture
async def conn(fresh_database: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(fresh_database)
    yield connection
    await connection.close()


class ProjectionContract(ABC):
    """The guarantees of a topic projection. A subclass per projection supplies its events and rows."""

    TOPIC: ClassVar[str]
    LOGS: ClassVar[tuple[str, ...]]
    """Names of the logs `log` builds; every log-driven test runs once per name."""

    @abstractmethod
    async def migrate(self, dsn: str, schema: str) -> None:
        """Create `schema` as `graphledger migrate` does for this projection."""

    @abstractmethod
    def projection(self, schema: str) -> TopicProjection: ...

    @abstractmethod
    def records(self, events: Sequence[Any]) -> list[LogRecord]:
        """`events` as records of partition 0: consecutive offsets, producer times in log order."""

    @abstractmethod
    def log(self, name: str) -> list[LogRecord]:
        """Records of many keys over several partitions (each partition's in offset order), touching
        every statement of the projection."""

    def redeliverable(self, name: str) -> list[LogRecord]:
        """The records of a log whose second application has the effect of the first (default: all).
        Events whose effect depends on the state they find are exactly-once by the offset rows alone."""
        return self.log(name)

    @abstractmethod
    def check_outcome(self, name: str, rows: Rows) -> None:
        """What applying log `name` leaves, so the other checks do not pass on a log that left nothing."""

    @abstractmethod
    def one_key(self) -> list[Any]:
        """Events of one key whose outcome depends on their order."""

    @abstractmethod
    async def key_state(self, conn: asyncpg.Connection, schema: str) -> Any:
        """What `schema` holds for `one_key`'s key, comparable with `==`."""

    @abstractmethod
    def expected_key_state(self) -> Any:
        """`key_state` after `one_key`'s events applied in their order."""

    @abstractmethod
    def two_keys(self) -> tuple[list[Any], list[Any], tuple[Any, ...]]:
        """Events of a key, events of neighbouring keys (same partition, similar names), and the
        leading columns of the first key's rows."""

    @abstractmethod
    async def rows(self, conn: asyncpg.Connection, schema: str) -> Rows:
        """Every row the projection's events write, ordered."""

    # -- plumbing ---------------------------------------------------------------------------------

    async def prepared(self, dsn: str, conn: asyncpg.Connection, schema: str) -> TopicProjection:
        await self.migrate(dsn, schema)
        projection = self.projection(schema)
        await projection.prepare(conn)
        return projection

    async def applier(self, dsn: str, conn: asyncpg.Connection, schema: str, dead: list[DeadLetter]) -> BatchApplier:
        """A `BatchApplier` of this projection alone into a new `schema`; dead letters go to `dead`."""

        async def sink(letters: Sequence[DeadLetter]) -> None:
            dead.extend(letters)

        projection = await self.prepared(dsn, conn, schema)
        return BatchApplier(schema, GROUP, {self.TOPIC: projection}, sink)

    # -- the contract -----------------------------------------------------------------------------

    async def test_a_batch_applied_twice_through_the_applier_equals_it_applied_once(
        self, fresh_database: str, conn: asyncpg.Connection, log_name: str
    ) -> None:
        log, dead = self.log(log_name), []
        applier = await self.applier(fresh_database, conn, "twice", dead)
        first = Fetches(applier, conn)
        await first.apply(log)
        await drain(first)
        assert (first.applied, first.skipped, dead) == (len(log), 0, [])
        rows = await self.rows(conn, "twice")
        self.check_outcome(log_name, rows)
        offsets = await group_offsets(conn, OffsetStatements("twice"), GROUP)
        assert offsets == end_offsets(log)

        again = await applier.apply(conn, log)
        assert (again.applied, again.skipped) == (0, len(log))
        restarted = await self.applier(fresh_database, conn, "twice", dead)  # a new worker after a crash
        assert (await restarted.apply(conn, log)).skipped == len(log)
        assert await self.rows(conn, "twice") == rows
        assert await group_offsets(conn, OffsetStatements("twice"), GROUP) == offsets

    async def test_redelivered_events_applied_again_by_the_projection_change_nothing(
        self, fresh_database: str, conn: asyncpg.Connection, log_name: str
    ) -> None:
        projection = await self.prepared(fresh_database, conn, "redelivered")
        items = [
            (r.topic, r.partition, r.offset, projection.to_event(envelope.decode(r.value), r.timestamp))
            for r in self.redeliverable(log_name)
        ]
        async with conn.transaction():
            await projection.apply(conn, items)
        first = await self.rows(conn, "redelivered")
        async with conn.transaction():
            await projection.apply(conn, items)
        assert await self.rows(conn, "redelivered") == first

    async def test_the_events_of_one_key_apply_in_log_order(
        self, fresh_database: str, conn: asyncpg.Connection
    ) -> None:
        events, dead = self.one_key(), []
        whole = await self.applier(fresh_database, conn, "whole", dead)
        await whole.apply(conn, self.records(events))
        single = await self.applier(fresh_database, conn, "single", dead)
        for record in self.records(events):
            await single.apply(conn, [record])
        backwards = await self.applier(fresh_database, conn, "backwards", dead)
        await backwards.apply(conn, self.records(events[::-1]))
        assert dead == []
        expected = self.expected_key_state()
        assert await self.key_state(conn, "whole") == expected
        assert await self.key_state(conn, "single") == expected
        assert await self.key_state(conn, "backwards") != expected  # so the order is what decided it

    async def test_events_of_other_keys_leave_a_keys_rows_alone(
        self, fresh_database: str, conn: asyncpg.Connection
    ) -> None:
        mine, theirs, columns = self.two_keys()
        own, others, dead = self.records(mine), self.records(theirs), []
        alone = await self.applier(fresh_database, conn, "alone", dead)
        await alone.apply(conn, own)
        shared = await self.applier(fresh_database, conn, "shared", dead)
        interleaved = [r for pair in itertools.zip_longest(own, others) for r in pair if r is not None]
        await shared.apply(conn, relog(interleaved))
        assert dead == []
        rows_alone, rows_shared = await self.rows(conn, "alone"), await self.rows(conn, "shared")
        assert any(of_key(rows_alone, columns).values())
        assert of_key(rows_shared, columns) == of_key(rows_alone, columns)
        assert rows_shared != rows_alone  # the other keys left rows of their own beside

    async def test_a_replay_into_a_fresh_schema_equals_the_live_projection(
        self, fresh_database: str, conn: asyncpg.Connection, log_name: str
    ) -> None:
        log, dead = self.log(log_name), []
        live = Fetches(await self.applier(fresh_database, conn, "live", dead), conn)
        sizes = random.Random(log_name)
        start = 0
        while start < len(log):
            end = start + sizes.choice(LIVE_BATCH_SIZES)
            await live.apply(log[start:end])
            start = end
        await drain(live)

        # The rebuild: a fresh schema, its partitions split over lanes, each lane in batches of its own.
        replay = await self.applier(fresh_database, conn, "replay", dead)
        lanes = [[r for r in log if r.partition % REPLAY_LANES == lane] for lane in range(REPLAY_LANES)]
        fetches = [Fetches(replay, conn) for _ in lanes]
        for start in range(0, len(log), REPLAY_BATCH):
            for lane, fetched in zip(lanes, fetches, strict=True):
                await fetched.apply(lane[start : start + REPLAY_BATCH])
        await drain(*fetches)

        assert dead == []
        assert await self.rows(conn, "replay") == await self.rows(conn, "live")
        checks = await compare(conn, "live", "replay")
        assert all(check.equal for check in checks), [check.describe() for check in checks]
        assert await group_offsets(conn, OffsetStatements("replay"), GROUP) == await group_offsets(
            conn, OffsetStatements("live"), GROUP
        )


# -- the checkpoint projection ------------------------------------------------------------------------


def copied_ids(rows: Rows) -> dict[str, list[int]]:
    """Each thread's checkpoint ids, as the `n` of `cid(n)`."""
    ids: dict[str, list[int]] = {}
    for row in rows["checkpoints"]:
        ids.setdefault(row[0], []).append(int(row[2].rsplit("-", 1)[1]))
    return ids


class TestCheckpointProjection(ProjectionContract):
    TOPIC = checkpoints.TOPIC
    LOGS = ("mixed", "copies")

    async def migrate(self, dsn: str, schema: str) -> None:
        await migrate(dsn, schema)

    def projection(self, schema: str) -> TopicProjection:
        return CheckpointProjection(schema)

    def records(self, events: Sequence[Any]) -> list[LogRecord]:
        return [checkpoints.record(e, 0, offset) for offset, e in enumerate(events)]

    def log(self, name: str) -> list[LogRecord]:
        logged = checkpoints.copies_log() if name == "copies" else checkpoints.mixed_batch()
        return [checkpoints.record(e, partition, offset) for _, partition, offset, e in logged]

    def redeliverable(self, name: str) -> list[LogRecord]:
        """Of the copies: the puts and deletes (a copy stages its source as it finds it, later puts included)."""
        if name != "copies":
            return self.log(name)
        return [r for r in self.log(name) if dict(r.headers)["gl-type"] in (b"checkpoint.put", b"thread.delete")]

    def check_outcome(self, name: str, rows: Rows) -> None:
        if name == "copies":
            assert copied_ids(rows) == checkpoints.COPIES_LOG_IDS
            assert rows["graphledger_copy_stages"] == []  # every barrier took its stage
        else:
            assert {r[0] for r in rows["checkpoints"]} == {"a", "c", "d", "z"}

    def one_key(self) -> list[Any]:
        put, writes = checkpoints.put, checkpoints.writes
        return [
            put("t", 1, blobs={"msgs": b"1"}),
            put("t", 2, parent=1, blobs={"msgs": b"2"}),
            writes("t", 2, "task", [("msgs", b"w")]),
            ThreadPrune("t", "keep_latest"),
            put("t", 3, parent=2, blobs={"msgs": b"3"}),
        ]

    async def key_state(self, conn: asyncpg.Connection, schema: str) -> Any:
        rows = await checkpoints.dump(conn, schema)
        return [r[2] for r in rows["checkpoints"]], [r[5] for r in rows["checkpoint_blobs"]]

    def expected_key_state(self) -> Any:
        return [checkpoints.cid(2), checkpoints.cid(3)], [b"2", b"3"]

    def two_keys(self) -> tuple[list[Any], list[Any], tuple[Any, ...]]:
        put, writes = checkpoints.put, checkpoints.writes
        mine = [
            put("t", 1, blobs={"m": b"t1"}),
            writes("t", 1, "task", [("m", b"tw")]),
            put("t", 2, parent=1, ns="child:x", blobs={"m": b"t2"}),
        ]
        theirs = [
            put("tt", 1, blobs={"m": b"tt1"}),
            writes("tt", 1, "task", [("m", b"ttw")]),
            put("tt", 2, parent=1, blobs={"m": b"tt2"}),
            ThreadCopy("tt", "t-copy"),
            ThreadPrune("tt", "keep_latest"),
            ThreadDelete("tt"),
            put("tt", 3, blobs={"m": b"tt3"}),
            ThreadPrune("tt", "delete"),
        ]
        return mine, theirs, ("t",)

    async def rows(self, conn: asyncpg.Connection, schema: str) -> Rows:
        return await checkpoints.dump(conn, schema)

    async def test_a_copy_lands_among_its_targets_records_whichever_partition_applies_first(
        self, fresh_database: str, conn: asyncpg.Connection
    ) -> None:
        """A projector reaching the copies' source partition first (the live one, usually: the copy is
        acknowledged before its barrier is sent), or their targets' partitions first (a replay's lanes, a
        lagging worker), leaves what the log order of each target's partition says."""
        log, dead = self.log("copies"), []
        orders = [(0, 1, 2), (1, 2, 0), (2, 0, 1)]
        for order in orders:
            fetched = Fetches(await self.applier(fresh_database, conn, f"order_{''.join(map(str, order))}", dead), conn)
            for partition in order:
                await fetched.apply([r for r in log if r.partition == partition])
            await drain(fetched)
        assert dead == []
        first, *others = [f"order_{''.join(map(str, order))}" for order in orders]
        rows = await self.rows(conn, first)
        self.check_outcome("copies", rows)
        for schema in others:
            assert await self.rows(conn, schema) == rows
            checks = await compare(conn, first, schema)  # lineage and activity times too
            assert all(check.equal for check in checks), [check.describe() for check in checks]


# -- the store projection -----------------------------------------------------------------------------


def _at(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


class TestStoreProjection(ProjectionContract):
    TOPIC = store.STORE_TOPIC
    LOGS = ("seed-0", "seed-1", "seed-2")
    PARTITIONS = 3

    async def migrate(self, dsn: str, schema: str) -> None:
        await migrate(dsn, schema, vectors=VectorIndex(store.DIMS))

    def projection(self, schema: str) -> TopicProjection:
        return StoreProjection(schema)

    def records(self, events: Sequence[Any]) -> list[LogRecord]:
        log = store.Log()
        return [log(e, store.T0 + 1_000 * i) for i, e in enumerate(events)]

    def _log(self, name: str, *, maintenance: bool) -> list[LogRecord]:
        """Each item on the partition its key hashes to, as the producer places it."""
        events = store.random_events(random.Random(int(name.removeprefix("seed-"))), 60, maintenance=maintenance)
        logs = [store.Log(p) for p in range(self.PARTITIONS)]
        return [logs[zlib.crc32(e.key.encode()) % self.PARTITIONS](e, ts) for e, ts in events]

    def log(self, name: str) -> list[LogRecord]:
        return self._log(name, maintenance=True)

    def redeliverable(self, name: str) -> list[LogRecord]:
        """Puts and deletes: a refresh or an expiry compares times with the row it finds."""
        return self._log(name, maintenance=False)

    def check_outcome(self, name: str, rows: Rows) -> None:
        assert rows["store"] and rows["store_vectors"]

    def one_key(self) -> list[Any]:
        put, delete, vec = store.put, store.delete, store.vec
        return [
            put(["u"], "k", {"v": 1}),
            put(["u"], "k", {"v": 2}, {"t": vec(1)}),
            delete(["u"], "k"),
            put(["u"], "k", {"v": 3}),
        ]

    async def key_state(self, conn: asyncpg.Connection, schema: str) -> Any:
        row = await conn.fetchrow(
            f"SELECT value::text AS value, created_at, updated_at FROM {schema}.store WHERE prefix = 'u' AND key = 'k'"
        )
        vectors = await conn.fetchval(f"SELECT count(*) FROM {schema}.store_vectors WHERE prefix = 'u' AND key = 'k'")
        return None if row is None else (row["value"], row["created_at"], row["updated_at"], vectors)

    def expected_key_state(self) -> Any:
        return '{"v": 3}', _at(store.T0 + 3_000), _at(store.T0 + 3_000), 0

    def two_keys(self) -> tuple[list[Any], list[Any], tuple[Any, ...]]:
        put, delete, vec = store.put, store.delete, store.vec
        mine = [
            put(["a"], "k", {"v": 1}, {"t": vec(1)}, ttl=5),
            StoreRefresh(("a",), "k"),
            put(["a"], "k", {"v": 2}, ttl=0.5),
        ]
        theirs = [
            put(["a", "b"], "k", {"v": 9}, {"t": vec(0, 1)}, ttl=0.01),  # expired before the refresh
            put(["a"], "k2", {"w": 1}, {"t": vec(1, 1)}),
            StoreRefresh(("a", "b"), "k"),
            delete(["a"], "k2"),
            StoreExpire(("a", "b"), "k", store.T0 + 4_000),
            put(["b"], "k", {"v": 8}),
            delete(["a", "b", "c"], "k"),
        ]
        return mine, theirs, ("a", "k")

    async def rows(self, conn: asyncpg.Connection, schema: str) -> Rows:
        return await store.dump(conn, schema)


# -- the fold equals the SQL --------------------------------------------------------------------------
#
# The read API answers a read at the log's end from the projection's answer at its applied offset and
# the key's records since, folded in Python (`graphledger.folds.thread`, `graphledger.folds.store_item`). For each
# event type, a scenario is applied record by record with the projection's SQL; from every point of it,
# the answers the projection gives there, with the rest of the scenario folded on, must be the answers
# the projection gives after applying all of it, or the fold must say it cannot (`Underivable`: the
# read then waits for the projection), and that only for the events docs/architecture.md lists.

FOLD_REF = "reft"
"""The reference of thread `t` as a sealed event of it would have recorded it (for `thread.erase`)."""


def _scenarios() -> dict[str, list[Any]]:
    put, writes = checkpoints.put, checkpoints.writes
    chain = [
        put("t", 1, inline={"n": 1}, blobs={"msgs": b"m1", "empty": None}, metadata={"run_id": "r1"}),
        writes("t", 1, "task-a", [("msgs", b"w1")]),
        put("t", 2, parent=1, blobs={"msgs": b"m2"}, refs={"empty": 1}, metadata={"run_id": "r2"}),
    ]
    return {
        "checkpoint.put": [
            *chain,
            put("t", 2, parent=1, blobs={"msgs": b"m2-again"}, refs={"empty": 1}, metadata={"again": True}),
            put("t", 3, parent=2, inline={"n": 3}, refs={"msgs": 2, "empty": 1}),
            put("t", 4, parent=3, ns="child:x", blobs={"sub": b"s4"}),
            # A put again of an older checkpoint: its row changes, the newest does not.
            put("t", 1, inline={"n": 1}, blobs={"msgs": b"m1", "empty": None}, metadata={"run_id": "r1", "x": 1}),
        ],
        # A put again of an older checkpoint with a blob at a version no checkpoint of the chain has yet;
        # a later put names that version without a blob of its own: the projection's blob row answers.
        "checkpoint.put (a version first stored by a put of an older checkpoint)": [
            *chain,
            put("t", 1, inline={"n": 1}, blobs={"msgs": b"m9"}, ver=9, refs={"empty": 1}),
            put("t", 3, parent=2, refs={"msgs": 9, "empty": 1}),
            writes("t", 3, "task-a", [("msgs", b"w3")]),
        ],
        # A put storing a value at a version an earlier put stored a row at, which the newest does not name:
        # the earlier row stays (a row is never replaced), and the fold does not hold it.
        "checkpoint.put (a value stored again at a version an earlier put stored)": [
            *chain,
            put("t", 3, parent=2, blobs={"msgs": b"m1-again"}, ver=1, refs={"empty": 1}),
            writes("t", 3, "task-a", [("msgs", b"w3")]),
        ],
        # A put naming a version it does not call new, holding a value inline: above every blob row of the
        # channel, the inline value answers; at a version another put stored a row at, the row does.
        "checkpoint.put (an inline value at a version the put does not call new)": [
            *chain,
            _not_new(put("t", 3, parent=2, inline={"n": 3}, refs={"msgs": 2, "empty": 1})),
        ],
        "checkpoint.put (an inline value at a version another put stored a row at)": [
            *chain,
            put("t", 1, inline={"n": 1}, blobs={"msgs": b"m9"}, ver=9, refs={"empty": 1}),
            _not_new(put("t", 3, parent=2, inline={"msgs": "inline"}, ver=9, refs={"empty": 1})),
            writes("t", 3, "task-a", [("msgs", b"w3")]),
        ],
        # Written before puts recorded their new channels: a version newer than the parent's is the put's own.
        "checkpoint.put (events before their new channels were recorded)": [
            put("t", 1, inline={"n": 1}, blobs={"msgs": b"m1", "empty": None}, legacy=True),
            put("t", 2, parent=1, blobs={"msgs": b"m2"}, refs={"empty": 1}, legacy=True),
            put("t", 3, parent=2, inline={"n": 3}, refs={"msgs": 2, "empty": 1}, legacy=True),
        ],
        "checkpoint.writes": [
            *chain,
            writes("t", 2, "task-b", [("msgs", b"w2"), ("n", b"w3")], task_path="~b"),
            writes("t", 2, "task-b", [("msgs", b"never")], task_path="~b"),  # a regular write never replaces
            writes("t", 2, "task-c", [("__error__", b"e1")], upsert=True, first_idx=-1),
            writes("t", 2, "task-c", [("__error__", b"e2")], upsert=True, first_idx=-1, task_path="~c"),
            writes("t", 1, "task-z", [("msgs", b"late")]),  # a late write of the parent
        ],
        "thread.delete": [*chain, ThreadDelete("t"), put("t", 5, blobs={"msgs": b"m5"})],
        "thread.prune (delete)": [*chain, ThreadPrune("t", "delete"), put("t", 5, blobs={"msgs": b"m5"})],
        "thread.prune (keep_latest)": [*chain, ThreadPrune("t", "keep_latest"), writes("t", 2, "x", [("msgs", b"w")])],
        "thread.copy": [*chain, ThreadCopy("t", "t-copy"), writes("t", 2, "task-b", [("msgs", b"w2")])],
        "thread.copy.barrier": [
            put("s", 1, blobs={"msgs": b"s1"}),
            ThreadCopy("s", "t"),
            ThreadCopyBarrier("t", 0, 1),
            put("t", 2, parent=1, blobs={"msgs": b"t2"}),
        ],
        "thread.expire": [*chain, ThreadExpire("t", 2**40), writes("t", 2, "x", [("n", b"1")])],
        "runs.delete": [*chain, RunsDelete(("r1",)), RunsDelete(("r-other",)), writes("t", 2, "x", [("n", b"1")])],
        "runs.delete (the newest's run)": [*chain, RunsDelete(("r2",)), writes("t", 1, "x", [("n", b"1")])],
        # The projection matches the text of `metadata ->> 'run_id'`: a run id of another JSON type too.
        "runs.delete (run ids that are not strings)": [
            put("t", 1, blobs={"msgs": b"m1"}, metadata={"run_id": 7}),
            put("t", 2, parent=1, blobs={"msgs": b"m2"}, metadata={"run_id": True}),
            put("t", 3, parent=2, blobs={"msgs": b"m3"}, metadata={"run_id": 1.5}),
            put("t", 4, parent=3, blobs={"msgs": b"m4"}, metadata={"run_id": "r4"}),
            RunsDelete(("7", "true", "1.5")),
        ],
        # After an erasure the thread's records are sealed under its destroyed key: none applies.
        "thread.erase": [*chain, ThreadErase(FOLD_REF)],
        "tenant.erase": [*chain, TenantErase("other"), writes("t", 2, "x", [("n", b"1")]), TenantErase("t")],
    }


def _not_new(event: CheckpointPut) -> CheckpointPut:
    """The put as code that calls the saver itself may make it: no channel called new."""
    return dataclasses.replace(event, new_channels=())


WAITS = {
    "thread.prune (keep_latest)": ThreadPrune,
    "thread.copy.barrier": ThreadCopyBarrier,
    "thread.expire": ThreadExpire,
    "runs.delete (the newest's run)": RunsDelete,
    # The fold holds no blob of an older checkpoint's put: the later put's read waits for the blob row.
    "checkpoint.put (a version first stored by a put of an older checkpoint)": CheckpointPut,
    "checkpoint.put (an inline value at a version another put stored a row at)": CheckpointPut,
    "checkpoint.put (a value stored again at a version an earlier put stored)": CheckpointPut,
}
"""Scenarios whose event the fold cannot derive (a read that meets it waits for the projection)."""


class ThreadAnswers:
    """What reads of one thread answer in one schema, as the read API answers them (`wire_tuple`)."""

    def __init__(self, conn: Any, thread_id: str) -> None:
        self.saver = TenantSaver(conn=conn, serde=PassThroughSerde(), thread_prefix=None)
        self.conn = conn
        self.thread_id = thread_id

    async def namespaces(self) -> list[str]:
        cursor = await self.conn.execute(THREAD_NAMESPACES_SQL, {"thread": self.thread_id, "most": 100})
        return [row["checkpoint_ns"] for row in await cursor.fetchall()]

    async def ceilings(self, ns: str) -> dict[str, int]:
        cursor = await self.conn.execute(BLOB_CEILINGS_SQL, {"thread": self.thread_id, "ns": ns})
        row = await cursor.fetchone()
        assert row is not None
        ceilings: dict[str, int] = row["ceilings"]
        return ceilings

    async def get(self, ns: str, checkpoint_id: str | None = None) -> dict[str, Any] | None:
        configurable = {"thread_id": self.thread_id, "checkpoint_ns": ns}
        if checkpoint_id is not None:
            configurable["checkpoint_id"] = checkpoint_id
        found = await self.saver.aget_tuple({"configurable": configurable})  # type: ignore[arg-type]
        return wire_tuple(found, Tenant("")) if found is not None else None

    async def ids(self) -> list[tuple[str, str]]:
        config = {"configurable": {"thread_id": self.thread_id}}
        return [
            (t.config["configurable"]["checkpoint_ns"], t.config["configurable"]["checkpoint_id"])
            async for t in self.saver.alist(config)  # type: ignore[arg-type]
        ]


async def _pg(dsn: str, schema: str) -> Any:
    import psycopg
    from psycopg.rows import dict_row

    return await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, row_factory=dict_row, options=f"-c search_path={schema}"
    )


def _fold_newest(
    base: dict[str, Any] | None, namespaces: list[str], ceilings: dict[str, int], events: Sequence[Any], ns: str
) -> Any:
    view = thread.from_answer(ns, base, namespaces, ceilings=ceilings)
    for event in events:
        view = thread.apply(view, event)
    return None if view.erased else view.answer("t", ns, None), view


def _fold_one(
    base: dict[str, Any] | None, newest: dict[str, Any] | None, namespaces: list[str], ceilings: dict[str, int],
    events: Sequence[Any], ns: str, checkpoint_id: str,
) -> Any:  # fmt: skip
    if base is None:
        start = thread.from_answer(ns, newest, namespaces, ceilings=ceilings)
        view = thread.fold_to_checkpoint(start, events, ns, checkpoint_id)
        if isinstance(view, thread.Underivable):
            return view
    else:
        view = thread.from_answer(ns, base)
        for event in events:
            view = thread.apply_to_checkpoint(view, event, ns, checkpoint_id)
    return None if view.erased else view.answer("t", ns, checkpoint_id)


class TestCheckpointFold:
    """`graphledger.folds.thread` against `CheckpointProjection`'s SQL, for every checkpoint event type."""

    @pytest.mark.parametrize("scenario", list(_scenarios()))
    async def test_the_fold_of_unprojected_events_equals_the_projection(
        self, fresh_database: str, conn: asyncpg.Connection, scenario: str
    ) -> None:
        events = _scenarios()[scenario]
        records = [checkpoints.record(e, 0, offset) for offset, e in enumerate(events)]
        projection = CheckpointProjection("final")
        timed = [projection.to_event(envelope.decode(r.value or b""), r.timestamp) for r in records]
        mine = thread_events(list(enumerate(timed)), "t", FOLD_REF)
        positions = [offset for offset, e in enumerate(timed) if e.event in mine]
        subject = SealedSubject(FOLD_REF, "thread", "", "t")
        contract = TestCheckpointProjection()

        final = await contract.applier(fresh_database, conn, "final", [])
        await erasure.record_subjects(conn, erasure.ErasureStatements("final"), [subject])
        for record in records:  # one at a time: a barrier's copy must have committed before it
            await final.apply(conn, [record])
        steps = await contract.applier(fresh_database, conn, "steps", [])
        await erasure.record_subjects(conn, erasure.ErasureStatements("steps"), [subject])
        at_end, at_step = await _pg(fresh_database, "final"), await _pg(fresh_database, "steps")
        try:
            end, step = ThreadAnswers(at_end, "t"), ThreadAnswers(at_step, "t")
            namespaces_end = await end.namespaces()
            read_ns = sorted({"", *namespaces_end, *(e.checkpoint_ns for e in events if hasattr(e, "checkpoint_ns"))})
            expected = {ns: await end.get(ns) for ns in read_ns}
            ever = {
                (e.checkpoint_ns, e.checkpoint_id)
                for e in events
                if isinstance(e, CheckpointPut) and e.thread_id == "t"
            }
            expected_one = {key: await end.get(*key) for key in sorted(ever)}
            derived: set[str] = set()
            underivable: set[str] = set()
            folds = ones = 0
            for k in range(len(records) + 1):
                suffix = [e for offset, e in zip(positions, mine, strict=True) if offset >= k]
                kinds = {type(e).TYPE for e in suffix}
                namespaces = await step.namespaces()
                for ns in read_ns:
                    base = await step.get(ns)
                    answer, view = _fold_newest(base, namespaces, await step.ceilings(ns), suffix, ns)
                    if isinstance(answer, thread.Underivable):
                        underivable |= kinds
                        continue
                    assert answer == expected[ns], (scenario, k, ns)
                    if view.complete and not view.erased:
                        held = sorted(n for n, h in view.namespaces.items() if h is None or h.newest)
                        assert held == namespaces_end, (scenario, k)
                    derived |= kinds
                    folds += len(suffix) > 0
                for ns, checkpoint_id in sorted(ever):
                    base, newest = await step.get(ns, checkpoint_id), await step.get(ns)
                    answer = _fold_one(base, newest, namespaces, await step.ceilings(ns), suffix, ns, checkpoint_id)
                    if isinstance(answer, thread.Underivable):
                        continue
                    assert answer == expected_one[(ns, checkpoint_id)], (scenario, k, ns, checkpoint_id)
                    ones += len(suffix) > 0
                if k < len(records):
                    await steps.apply(conn, [records[k]])
        finally:
            await at_end.close()
            await at_step.close()
        waiting = WAITS.get(scenario)
        if waiting is None:
            assert not underivable, f"{scenario}: the fold could not derive a read after {sorted(underivable)}"
        else:
            assert waiting.TYPE in underivable and waiting.TYPE not in derived  # the read waits: documented
        assert folds and ones, scenario  # the scenario exercised the fold, of the newest and of one checkpoint


def _store_scenario(seed: int) -> list[tuple[Any, int]]:
    """Random puts, deletes, refreshes and expiries of a few items, a tenant's erasure among them and an
    imported put (which carries its creation time)."""
    events = store.random_events(random.Random(seed), 40, maintenance=True)
    ts = events[-1][1]
    imported = dataclasses.replace(store.put(["c"], "k1", {"imported": True}), created_ms=store.T0 - 5_000)
    return [*events[:20], (TenantErase("c"), events[19][1]), *events[20:], (imported, ts + 1)]


def _store_record(event: Any, ts_ms: int, offset: int) -> LogRecord:
    env = envelope.Envelope(event.TYPE, f"e{offset}", ts_ms, event.to_payload())
    key = event.key.encode() if event.key is not None else None
    headers = tuple(envelope.headers_for(env))
    return LogRecord(store.STORE_TOPIC, 0, offset, key, envelope.encode(env), headers, ts_ms)  # appended at ts_ms


async def _items(conn: asyncpg.Connection, schema: str, items: list[tuple[str, str]]) -> dict[Any, Any]:
    """Each item's row as `store_item.Item` (None: no row), read as the read API reads it."""
    sql, args = item_rows_statement(schema, items)
    found: dict[Any, Any] = {}
    for row in await conn.fetch(sql, *args):
        item = None
        if row["created_at"] is not None:
            value = orjson.loads(row["value"])
            item = store_item.Item(row["prefix"], row["key"], value, row["created_at"], row["updated_at"],
                                   row["expires_at"], row["ttl"])  # fmt: skip
        found[(row["prefix"], row["key"])] = item
    return found


class TestStoreFold:
    """`graphledger.folds.store_item` against `StoreProjection`'s SQL: what a store get answers."""

    @pytest.mark.parametrize("seed", [0, 1, 2, 3])
    async def test_the_fold_of_unprojected_events_equals_the_projection(
        self, fresh_database: str, conn: asyncpg.Connection, seed: int
    ) -> None:
        scenario = _store_scenario(seed)
        records = [_store_record(e, ts, offset) for offset, (e, ts) in enumerate(scenario)]
        contract = TestStoreProjection()
        final = await contract.applier(fresh_database, conn, "final", [])
        await final.apply(conn, records)
        steps = await contract.applier(fresh_database, conn, "steps", [])
        to_event = final.projections[store.STORE_TOPIC].to_event
        timed = [to_event(envelope.decode(r.value or b""), r.timestamp) for r in records]
        items = sorted({(".".join(e.namespace), e.item_key) for e, _ in scenario if hasattr(e, "item_key")})
        expected = await _items(conn, "final", items)
        kinds: set[str] = set()
        for k in range(len(records) + 1):
            at_k = await _items(conn, "steps", items)
            for prefix, key in items:
                found = at_k[(prefix, key)]
                for event in timed[k:]:
                    mine = getattr(event.event, "item_key", key) == key and (
                        ".".join(getattr(event.event, "namespace", prefix.split("."))) == prefix
                    )
                    if mine:
                        found = store_item.apply(found, event.event, event.ts_ms)
                        kinds.add(event.TYPE)
                assert found == expected[(prefix, key)], (seed, k, prefix, key)
            if k < len(records):
                await steps.apply(conn, [records[k]])
        assert kinds == {"store.put", "store.delete", "store.refresh", "store.expire", "tenant.erase"}
