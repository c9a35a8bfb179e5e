"""Fresh keys are bound to the subject of a record that opened with them, never of one that merely names
them (`opening/binding.py`), on the real key store and projection.

A fresh key's id is in the `gl-key` header of its subject's records, so whoever reads the log can name it
beside another subject and publish that first. Such a record binds nothing and is dead-lettered; the
victim's own records then apply, and a replay from the same key store decides the same.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import cast

import asyncpg
import pytest

from graphledger.erasure.sealing import SealedSubject, cipher_of, new_data_key, seal
from graphledger.erasure.subjects import reference, thread_subject
from graphledger.events import envelope, to_envelope
from graphledger.events.checkpoint import CheckpointEvent
from graphledger.events.chunks import frame
from graphledger.log.records import LogRecord, Tail
from graphledger.opening.records import DeadLetter, unwrapped
from graphledger_server.api.consistency.read_through import TailEvents
from graphledger_server.api.consistency.unprojected import Unprojected
from graphledger_server.keys.key_store import KeyStore
from graphledger_server.keys.lookup import DataKeyCache
from graphledger_server.keys.ring import KeyRing
from graphledger_server.opening.opener import RecordOpener
from graphledger_server.projection.batch import BatchApplier, BatchResult
from graphledger_server.projection.checkpoints import CheckpointProjection
from graphledger_server.projection.migrate import migrate
from projection_helpers import TOPIC, cid, put

KEYS_SCHEMA = "graphledger_keys"


@pytest.fixture
async def dsn(fresh_database: str) -> str:
    for schema in ("gl", "rebuilt"):
        await migrate(fresh_database, schema)
    return fresh_database


@pytest.fixture
async def store(dsn: str) -> AsyncIterator[KeyStore]:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    yield KeyStore(pool, KEYS_SCHEMA, KeyRing([("test", os.urandom(32))]))
    await pool.close()


@pytest.fixture
async def conn(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(dsn)
    yield connection
    await connection.close()


class Projector:
    """A batch applier into `schema` with a key cache of its own on `store`, and the dead letters it produced."""

    def __init__(self, store: KeyStore, schema: str) -> None:
        self.schema = schema
        self.dead: list[DeadLetter] = []

        async def sink(letters: Sequence[DeadLetter]) -> None:
            self.dead.extend(letters)

        self.applier = BatchApplier(
            schema, f"g-{schema}", {TOPIC: CheckpointProjection(schema)}, sink, keys=DataKeyCache(store)
        )

    async def apply(self, conn: asyncpg.Connection, records: Sequence[LogRecord]) -> BatchResult:
        return await self.applier.apply(conn, records)

    async def checkpoints(self, conn: asyncpg.Connection, thread_id: str) -> int:
        query = f"SELECT count(*) FROM {self.schema}.checkpoints WHERE thread_id = $1"
        return int(await conn.fetchval(query, thread_id))


async def _subject(store: KeyStore, tenant: str, thread: str) -> SealedSubject:
    ref = reference(await store.hash_key(tenant), thread_subject(tenant, f"{tenant}/{thread}"))
    return SealedSubject(ref, "thread", tenant, f"{tenant}/{thread}")


def _records(
    event: CheckpointEvent,
    subject: SealedSubject,
    raw_key: bytes,
    key_id: str,
    partition: int,
    first_offset: int = 0,
    chunk_bytes: int | None = None,
) -> list[LogRecord]:
    """The record of `event` sealed for `subject` under `raw_key` naming fresh key `key_id` (its chunks when
    `chunk_bytes` is given), as a writer publishes it on the subject's record key."""
    env = seal(to_envelope(event), subject, cipher_of(raw_key), key_id)
    value, headers = envelope.encode(env), envelope.headers_for(env)
    framed = frame(value, headers, chunk_bytes or len(value), str(uuid.uuid4()))
    return [
        LogRecord(TOPIC, partition, first_offset + i, subject.ref.encode(), r.value, tuple(r.headers), env.produced_ms)
        for i, r in enumerate(framed)
    ]


async def _bound_to(conn: asyncpg.Connection, key_id: str) -> str | None:
    ref: str | None = await conn.fetchval(f"SELECT ref FROM {KEYS_SCHEMA}.fresh_keys WHERE id = $1", key_id)
    return ref


async def test_a_record_naming_a_victims_fresh_key_for_another_subject_binds_nothing_and_the_victims_apply(
    store: KeyStore, conn: asyncpg.Connection
) -> None:
    [(key_id, victim_key)] = await store.fresh_keys("acme", 1)
    victim = await _subject(store, "acme", "victim")
    attacker = await _subject(store, "evil", "mine")
    # The attacker read `key_id` in the log, and publishes first, on another partition, naming it for its
    # own subject (sealed with a key of its own: it does not hold the victim's).
    forged = _records(put("evil/mine", 1), attacker, new_data_key(), key_id, partition=1)
    genuine = _records(put("acme/victim", 1), victim, victim_key, key_id, partition=0)

    projector = Projector(store, "gl")
    await projector.apply(conn, forged)
    assert await _bound_to(conn, key_id) is None
    [letter] = projector.dead
    assert f"does not open with fresh key {key_id}" in letter.reason
    assert await projector.checkpoints(conn, "evil/mine") == 0

    result = await projector.apply(conn, genuine)
    assert (result.applied, result.dead_letters) == (1, 0)
    assert await projector.checkpoints(conn, "acme/victim") == 1
    assert await _bound_to(conn, key_id) == victim.ref

    # Once bound, a record naming the key for another subject is misbound, as before.
    again = _records(put("evil/mine", 2), attacker, new_data_key(), key_id, partition=1, first_offset=1)
    await projector.apply(conn, again)
    assert f"sealed with fresh key {key_id}, which is bound to another subject" in projector.dead[-1].reason

    # A replay from the same key store decides the same, in one batch, the forged record first.
    replay = Projector(store, "rebuilt")
    result = await replay.apply(conn, [*forged, *genuine])
    assert (result.applied, result.dead_letters) == (1, 1)
    assert await replay.checkpoints(conn, "acme/victim") == 1
    assert await replay.checkpoints(conn, "evil/mine") == 0


async def test_a_forged_record_before_the_victims_first_in_one_batch_binds_nothing(
    store: KeyStore, conn: asyncpg.Connection
) -> None:
    [(key_id, victim_key)] = await store.fresh_keys("acme", 1)
    victim = await _subject(store, "acme", "victim")
    forged = _records(put("acme/victim", 9), await _subject(store, "acme", "other"), new_data_key(), key_id, 1)
    genuine = _records(put("acme/victim", 1), victim, victim_key, key_id, partition=0)
    projector = Projector(store, "gl")
    result = await projector.apply(conn, [*forged, *genuine])
    assert (result.applied, result.dead_letters) == (1, 1)
    assert f"does not open with fresh key {key_id}" in projector.dead[0].reason
    assert await _bound_to(conn, key_id) == victim.ref
    assert await projector.checkpoints(conn, "acme/victim") == 1


async def test_a_chunked_event_binds_its_fresh_key_once_reassembled_and_opened(
    store: KeyStore, conn: asyncpg.Connection
) -> None:
    """Chunks open only once reassembled, inside the batch's transaction, where the key store is not asked:
    the batch stops the partition at the completing chunk, and the next one binds the key first."""
    [(key_id, victim_key)] = await store.fresh_keys("acme", 1)
    victim = await _subject(store, "acme", "victim")
    attacker = await _subject(store, "evil", "mine")
    big = put("acme/victim", 1, blobs={"messages": os.urandom(4000)})
    forged = _records(put("evil/mine", 1, blobs={"messages": os.urandom(4000)}), attacker, new_data_key(), key_id, 1,
                      chunk_bytes=1500)  # fmt: skip
    genuine = _records(big, victim, victim_key, key_id, partition=0, chunk_bytes=1500)
    assert len(forged) > 1 and len(genuine) > 1

    projector = Projector(store, "gl")
    result = await projector.apply(conn, [*forged, *genuine])
    assert await _bound_to(conn, key_id) is None
    [letter] = projector.dead
    assert f"does not open with fresh key {key_id}" in letter.reason
    assert result.deferred == {(TOPIC, 0): genuine[-1].offset}  # fetched again once its key is bound
    assert result.next_offsets[(TOPIC, 0)] == genuine[-1].offset
    assert await projector.checkpoints(conn, "acme/victim") == 0

    result = await projector.apply(conn, genuine[-1:])  # what the worker fetches again
    assert (result.applied, result.dead_letters, result.deferred) == (1, 0, {})
    assert await _bound_to(conn, key_id) == victim.ref
    assert await projector.checkpoints(conn, "acme/victim") == 1


class _NoNotes:
    """What `TailEvents` keeps of records between reads (`Unprojected.note`): nothing, here."""

    def note(self, record: LogRecord) -> None:
        return None

    def set_note(self, record: LogRecord, value: object) -> None:
        pass


async def test_the_read_through_folds_the_victims_record_and_binds_as_the_projector_would(
    store: KeyStore, conn: asyncpg.Connection
) -> None:
    """The read API binds a fresh key on the same terms (a record opened with it), so what it folds is what
    the projector then applies; a forged record on the thread's key is left out and binds nothing."""
    [(key_id, victim_key)] = await store.fresh_keys("acme", 1)
    victim = await _subject(store, "acme", "victim")
    attacker = await _subject(store, "evil", "mine")
    forged = _records(put("acme/victim", 9), attacker, new_data_key(), key_id, partition=0)
    genuine = _records(put("acme/victim", 1), victim, victim_key, key_id, partition=0, first_offset=1)
    forged = [replace(r, key=victim.ref.encode()) for r in forged]  # on the victim's record key: in its tail
    opener = RecordOpener(DataKeyCache(store), lambda topic: CheckpointProjection("gl").to_event)
    events = await TailEvents(cast("Unprojected", _NoNotes()), opener).events(Tail(0, 2, (*forged, *genuine)), 0)
    assert [(offset, unwrapped(event).checkpoint_id) for offset, event in events] == [(1, cid(1))]
    assert await _bound_to(conn, key_id) == victim.ref

    projector = Projector(store, "gl")
    result = await projector.apply(conn, [*forged, *genuine])
    assert (result.applied, result.dead_letters) == (1, 1)
    assert await projector.checkpoints(conn, "acme/victim") == 1
