"""Builders of checkpoint events and records, row dumps, and the migrated projection, for the projection and
projector tests."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import psycopg
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from psycopg.rows import dict_row

from graphledger.events import envelope, to_envelope
from graphledger.events.checkpoint import (
    Blob,
    CheckpointEvent,
    CheckpointPut,
    CheckpointWrites,
    RunsDelete,
    ThreadCopy,
    ThreadCopyBarrier,
    ThreadDelete,
    ThreadPrune,
    Write,
)
from graphledger.log.records import LogRecord
from graphledger.ownership import NO_CHECKPOINT, Intent
from graphledger.settings import Settings
from graphledger_server.opening.vector_index import VectorIndex
from graphledger_server.projection.migrate import migrate

TOPIC = "test.checkpoints"


async def migrated(settings: Settings) -> Settings:
    """`settings`, once their projection schema is migrated as they say, the vector table included (what
    `graphledger migrate` does)."""
    await migrate(settings.postgres_dsn, settings.postgres_schema, vectors=VectorIndex.from_settings(settings))
    return settings


Item = tuple[str, int, int, CheckpointEvent]
"""What `CheckpointProjection.apply` takes: topic, partition, offset, event."""

TABLE_ORDER = {
    "checkpoints": "thread_id, checkpoint_ns, checkpoint_id",
    "checkpoint_blobs": "thread_id, checkpoint_ns, channel, version",
    "checkpoint_writes": "thread_id, checkpoint_ns, checkpoint_id, task_id, idx",
    "graphledger_thread_partitions": "thread_id",
    "graphledger_copy_stages": 'topic, partition, "offset"',
    "graphledger_staged_checkpoints": 'topic, partition, "offset", checkpoint_ns, checkpoint_id',
    "graphledger_staged_blobs": 'topic, partition, "offset", checkpoint_ns, channel, version',
    "graphledger_staged_writes": 'topic, partition, "offset", checkpoint_ns, checkpoint_id, task_id, idx',
}


def cid(n: int) -> str:
    """A checkpoint id that sorts by `n`, shaped like LangGraph's uuid6 ids."""
    return f"1f000000-0000-6000-8000-{n:012d}"


def version(n: int) -> str:
    return f"{n:032}.{0.5:016}"


def put(
    thread_id: str,
    n: int,
    parent: int | None = None,
    *,
    ns: str = "",
    inline: dict[str, Any] | None = None,
    blobs: dict[str, bytes | None] | None = None,
    metadata: dict[str, Any] | None = None,
    ver: int | None = None,
    refs: dict[str, int] | None = None,
    legacy: bool = False,
) -> CheckpointPut:
    """A put of checkpoint `cid(n)`: `inline` values in its JSON, `blobs` (channel -> bytes, None for an
    "empty" blob) at version `ver` (default n), every channel listed in `channel_versions`, plus `refs`
    (channel -> version number) for values stored by an earlier put. `legacy`: without its new channels, as
    events written before they were recorded."""
    inline = inline or {}
    blobs = blobs or {}
    v = version(ver if ver is not None else n)
    checkpoint = {
        "v": 4,
        "ts": "2026-01-01T00:00:00+00:00",
        "id": cid(n),
        "channel_values": inline,
        "channel_versions": {
            **{ch: version(r) for ch, r in (refs or {}).items()},
            **{ch: v for ch in [*inline, *blobs]},
        },
        "versions_seen": {},
        "updated_channels": None,
    }
    meta = {"source": "loop", "step": n, "parents": {}, **(metadata or {})}
    return CheckpointPut(
        thread_id,
        ns,
        cid(n),
        cid(parent) if parent is not None else None,
        json.dumps(checkpoint).encode(),
        json.dumps(meta).encode(),
        tuple(Blob(ch, v, "empty" if data is None else "bytes", data) for ch, data in blobs.items()),
        None if legacy else (*inline, *blobs),
    )


def writes(
    thread_id: str,
    n: int,
    task_id: str,
    items: Sequence[tuple[str, bytes]],
    *,
    ns: str = "",
    upsert: bool = False,
    task_path: str = "",
    first_idx: int = 0,
) -> CheckpointWrites:
    return CheckpointWrites(
        thread_id,
        ns,
        cid(n),
        task_id,
        task_path,
        upsert,
        tuple(Write(first_idx + i, ch, "bytes", data) for i, (ch, data) in enumerate(items)),
    )


def protected(
    event: CheckpointPut | CheckpointWrites, expects: int | None, operations: int = 0
) -> CheckpointPut | CheckpointWrites:
    """`event` with its writer's intent: it read the thread at `operations` and expects checkpoint `expects`
    of its namespace (None: none). Names travel in clear, as a writer without a hashing key sends them."""
    expected = NO_CHECKPOINT if expects is None else cid(expects).encode()
    intent = Intent(event.checkpoint_ns.encode() or b"-", event.checkpoint_id.encode(), expected, operations)
    return dataclasses.replace(event, intent=intent.header())


def items(events: Sequence[CheckpointEvent], partition: int = 0, first_offset: int = 0) -> list[Item]:
    """`events` at consecutive offsets of one partition of `TOPIC`."""
    return [(TOPIC, partition, first_offset + i, e) for i, e in enumerate(events)]


def mixed_batch() -> list[Item]:
    """A batch touching every statement: duplicates, deletes, copies, runs, prunes; threads a, d on
    partition 0 and z and c (a copy of a, at its barrier) on partition 1 keep rows.

    A copy or a keep_latest prune reads the state it finds, so re-applying one after later events of
    its thread does not reproduce its effect: here they come after their threads' last put, so the
    whole batch can be re-applied (what a worker does when it dies after Postgres committed but before
    it knew; the projector itself never re-applies an event, the offset rows fence it).
    """
    return [
        *items(
            [
                put("a", 1, inline={"n": 1}, blobs={"msgs": b"m1", "empty": None}, metadata={"run_id": "r1"}),
                writes("a", 1, "t1", [("msgs", b"w1"), ("n", b"w2")]),
                put("a", 2, parent=1, blobs={"msgs": b"m2"}, metadata={"run_id": "r2"}),
                put("a", 2, parent=1, blobs={"msgs": b"m2-dup"}, metadata={"run_id": "r2", "again": True}),
                writes("a", 2, "t2", [("__interrupt__", b"i1")], upsert=True, first_idx=-3),
                writes("a", 2, "t2", [("__interrupt__", b"i2")], upsert=True, first_idx=-3),
                put("b", 1, blobs={"msgs": b"b1"}),
                ThreadDelete("b"),
                put("b", 5, blobs={"msgs": b"b5"}, metadata={"run_id": "r1"}),
                put("a", 3, parent=2, blobs={"msgs": b"m3"}, metadata={"run_id": "r3"}),
                ThreadCopy("a", "c"),
                RunsDelete(("r1",)),
                put("d", 1, blobs={"msgs": b"d1"}),
                put("d", 2, parent=1, blobs={"msgs": b"d2"}),
                ThreadPrune("d", "keep_latest"),
                put("e", 1),
                ThreadPrune("e", "delete"),
            ]
        ),
        *items([put("z", 1, metadata={"run_id": "r1"}), ThreadCopyBarrier("c", 0, 10)], partition=1),
    ]


def copies_log() -> list[Item]:
    """Copies onto threads whose own records before the barrier change them, over three partitions:
    source `s` on 0, targets `t` and `u` on 1, `fresh` and `v` on 2. In the log order of each target's
    partition, with the source as of each copy's record: `t` is pruned to 8, then gets 1 and 2, then puts
    10; `u` copies `t` then (1, 2, 8, 10); `fresh` gets 1, 2 and puts 20; `v` is deleted, then gets 1
    and 2; `s` (3 put after the copies, copied onto itself) keeps 1, 2, 3 (`COPIES_LOG_IDS`)."""
    return [
        *items(
            [
                put("s", 1, blobs={"m": b"s1"}, metadata={"run_id": "r"}),
                put("s", 2, parent=1, blobs={"m": b"s2"}),
                writes("s", 2, "task", [("m", b"sw")]),
                ThreadCopy("s", "t"),  # 3
                ThreadCopy("s", "fresh"),  # 4
                ThreadCopy("s", "v"),  # 5
                put("s", 3, parent=2, blobs={"m": b"s3"}),
                ThreadCopy("s", "s"),  # 7
                ThreadCopyBarrier("s", 0, 7),
            ],
            partition=0,
        ),
        *items(
            [
                put("t", 7, blobs={"m": b"t7"}),
                put("t", 8, parent=7, blobs={"m": b"t8"}),
                ThreadPrune("t", "keep_latest"),  # acknowledged before the copy: it keeps 8 alone
                ThreadCopyBarrier("t", 0, 3),
                put("t", 10, parent=8, blobs={"m": b"t10"}),
                ThreadCopy("t", "u"),  # 5
                ThreadCopyBarrier("u", 1, 5),
            ],
            partition=1,
        ),
        *items(
            [
                put("v", 5, blobs={"m": b"v5"}),
                ThreadDelete("fresh"),
                ThreadCopyBarrier("fresh", 0, 4),
                put("fresh", 20, parent=2, blobs={"m": b"f20"}),
                ThreadDelete("v"),  # acknowledged before the copy: it drops 5 alone
                ThreadCopyBarrier("v", 0, 5),
            ],
            partition=2,
        ),
    ]


def one_writer_log() -> list[Item]:
    """Every branch of the one-writer rule (`graphledger.ownership`), over two partitions. Thread `w` (0):
    a chain of protected puts and writes, a retried put, a superseded writer's put and writes, writes before
    their put (kept when it counts, dropped when it is refused), two writers against one head; `x` (0): a
    delete, a put without an intent and a prune `delete` refuse the writers that read before them; `y` (1): a
    `runs.delete` of the lead's run, a subgraph namespace; `c` (1): a copy lands on it
    (`ONE_WRITER_LOG_IDS`, `ONE_WRITER_LOG_REFUSED`)."""
    p = protected
    return [
        *items(
            [
                p(put("w", 1, blobs={"m": b"w1"}), None),
                p(writes("w", 1, "a", [("m", b"a1")]), 1),  # of the lead
                p(put("w", 2, parent=1, blobs={"m": b"w2"}), 1),
                p(put("w", 2, parent=1, blobs={"m": b"w2"}), 1),  # a producer's retry: counts, changes nothing
                p(put("w", 3, parent=1, blobs={"m": b"zombie"}), 1),  # superseded: refused
                p(writes("w", 1, "z", [("m", b"z1")]), 1),  # the zombie's late writes of what it read: refused
                p(writes("w", 4, "a", [("m", b"early")]), 2),  # before its put, ahead of the lead: counted
                p(put("w", 4, parent=2, blobs={"m": b"w4"}), 2),
                p(writes("w", 5, "b", [("m", b"gone")]), 2),  # before a put that is refused: dropped with it
                p(put("w", 5, parent=2, blobs={"m": b"w5"}), 2),  # read 2, the lead is 4: refused
                p(put("w", 6, parent=4, blobs={"m": b"w6"}), 4),  # of two writers against head 4, the first
                p(put("w", 7, parent=4, blobs={"m": b"w7"}), 4),  # and the second: refused
                p(put("x", 1, blobs={"m": b"x1"}), None),
                ThreadDelete("x"),
                p(put("x", 2, parent=1, blobs={"m": b"x2"}), 1),  # read before the delete: refused
                p(put("x", 3, blobs={"m": b"x3"}), None, 1),
                put("x", 4, parent=3, blobs={"m": b"x4"}),  # no intent: counts, opens, one more operation
                p(writes("x", 3, "late", [("m", b"x3w")]), 3, 1),  # read before it: refused
                p(put("x", 5, parent=4, blobs={"m": b"x5"}), 4, 2),
                ThreadPrune("x", "delete"),
                p(put("x", 6, parent=5, blobs={"m": b"x6"}), 5, 2),  # read before the prune: refused
                p(put("x", 7, blobs={"m": b"x7"}), None, 3),
            ]
        ),
        *items(
            [
                p(put("y", 1, blobs={"m": b"y1"}, metadata={"run_id": "run-1"}), None),
                p(put("y", 2, parent=1, ns="child:1", blobs={"s": b"s2"}), None),  # its own namespace, open
                RunsDelete(("run-1",)),  # the lead's run: the root namespace opens, one more operation
                p(put("y", 3, parent=1, blobs={"m": b"y3"}), 1),  # read before it: refused
                p(put("y", 4, blobs={"m": b"y4"}), None, 1),
                p(writes("y", 2, "s", [("s", b"sw")], ns="child:1"), 2, 1),  # the subgraph's, read after: counted
                RunsDelete(("run-other",)),  # no lead's run: nothing
                p(put("y", 5, parent=4, blobs={"m": b"y5"}), 4, 1),
                put("c", 1, blobs={"m": b"c1"}),
                ThreadCopy("y", "c"),
                ThreadCopyBarrier("c", 1, 9),  # the copy lands: one more operation of c
                p(put("c", 6, parent=5, blobs={"m": b"c6"}), 1, 1),  # read before the copy: refused
                p(put("c", 7, parent=5, blobs={"m": b"c7"}), 5, 2),
            ],
            partition=1,
        ),
    ]


ONE_WRITER_LOG_IDS = {"w": [1, 2, 4, 6], "x": [7], "y": [2, 4, 5], "c": [1, 2, 4, 5, 7]}
"""The checkpoint ids (`cid(n)`) of each thread once `one_writer_log` applied."""
ONE_WRITER_LOG_REFUSED = {"w": 4, "x": 3, "y": 1, "c": 1}
"""How many of each thread's records the rule refused in `one_writer_log`."""


COPIES_LOG_IDS = {"s": [1, 2, 3], "t": [1, 2, 8, 10], "u": [1, 2, 8, 10], "fresh": [1, 2, 20], "v": [1, 2]}
"""The checkpoint ids (`cid(n)`) of each thread once `copies_log` applied."""


def record(event: CheckpointEvent, partition: int, offset: int, topic: str = TOPIC) -> LogRecord:
    """The Kafka record of `event`, appended now (its time, which a thread's activity comes from)."""
    env = to_envelope(event)
    key = event.key.encode() if event.key is not None else None
    headers = tuple(envelope.headers_for(env))
    return LogRecord(topic, partition, offset, key, envelope.encode(env), headers, env.produced_ms)


RULE_ORDER = {
    "graphledger_thread_ledgers": "thread_id",
    "graphledger_thread_leads": "thread_id, checkpoint_ns",
    "graphledger_refusals": 'topic, partition, "offset"',
}
"""The one-writer rule's state and verdicts (`graphledger.ownership`), apart from the threads' rows: its
counts are exactly-once through the offset rows, as copies and prunes are, not idempotent."""


async def rule_dump(conn: asyncpg.Connection, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    """The rule's rows (`RULE_ORDER`), ordered, without the time a refusal was recorded."""
    out = {}
    for table, order in RULE_ORDER.items():
        rows = await conn.fetch(f"SELECT * FROM {schema}.{table} ORDER BY {order}")
        out[table] = [tuple(v for k, v in r.items() if k != "recorded_at") for r in rows]
    return out


async def dump(conn: asyncpg.Connection, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the projection tables, ordered, JSON columns as text."""
    out = {}
    for table, order in TABLE_ORDER.items():
        rows = await conn.fetch(f"SELECT * FROM {schema}.{table} ORDER BY {order}")
        out[table] = [tuple(str(v) if isinstance(v, dict) else v for v in r.values()) for r in rows]
    return out


async def count(conn: asyncpg.Connection, schema: str, table: str, where: str = "TRUE", *args: Any) -> int:
    return await conn.fetchval(f"SELECT count(*) FROM {schema}.{table} WHERE {where}", *args)


@asynccontextmanager
async def official_saver(dsn: str, schema: str) -> AsyncIterator[AsyncPostgresSaver]:
    """The official saver on `schema`, connected as its docs say (autocommit, dict rows)."""
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, row_factory=dict_row, options=f"-c search_path={schema}"
    ) as conn:
        yield AsyncPostgresSaver(conn)
