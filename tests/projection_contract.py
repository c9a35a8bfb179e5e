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

`test_projection_contract_checkpoints.py` and `test_projection_contract_store.py` run it, each with its
projection's fold; their tests take `conn`, a connection to the test's `fresh_database`
(tests/integration/conftest.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import asyncpg
import pytest

from graphledger.events import envelope
from graphledger.log.records import LogRecord
from graphledger.opening.records import DeadLetter
from graphledger_server.log.offsets import OffsetStatements, group_offsets
from graphledger_server.projection.batch import BatchApplier, TopicProjection
from graphledger_server.replay.checksums import compare

Rows = dict[str, list[tuple[Any, ...]]]
GROUP = "contract"
LIVE_BATCH_SIZES = (1, 2, 3, 5, 8, 13)
"""The projector's batches end wherever a fetch ended: the live side cuts the log at random among these."""
REPLAY_BATCH = 4
REPLAY_LANES = 2


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


class ProjectionContract(ABC):
    """The guarantees of a topic projection. A subclass per projection supplies its events and rows."""

    TOPIC: ClassVar[str]
    LOGS: ClassVar[tuple[str, ...]]
    """Names of the logs `log` builds; every log-driven test runs once per name."""

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """A test taking `log_name` runs once per log in `LOGS` (pytest calls a test class's own hook)."""
        if "log_name" in metafunc.fixturenames:
            metafunc.parametrize("log_name", self.LOGS)

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

    async def redelivered_rows(self, conn: asyncpg.Connection, schema: str) -> Rows:
        """The rows a redelivery leaves as they were (default: all); counts the offset rows alone keep
        exactly once are not among them."""
        return await self.rows(conn, schema)

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
        first = await self.redelivered_rows(conn, "redelivered")
        async with conn.transaction():
            await projection.apply(conn, items)
        assert await self.redelivered_rows(conn, "redelivered") == first

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
