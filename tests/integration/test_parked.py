"""What a hostile record can do to a batch, on real Postgres and a real key store (the broker left out):
it parks its own subject, never its partition; an erasure applies only when the key store recorded it;
a sealed event affects only the subject its seal authenticates (`projection/parked.py`,
`projection/admission.py`)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import asyncpg
import pytest

from graphledger.erasure.sealer import EventSealer
from graphledger.erasure.sealing import SealedSubject, cipher_of, seal
from graphledger.erasure.subjects import reference, thread_subject
from graphledger.events import envelope, to_envelope
from graphledger.events.checkpoint import CheckpointEvent, RunsDelete, ThreadCopy, ThreadCopyBarrier
from graphledger.events.envelope import Envelope
from graphledger.events.erasure import TenantErase, ThreadErase
from graphledger.settings import Settings
from graphledger_server.keys.lookup import DataKeyCache
from graphledger_server.keys.source import StoreKeySource
from graphledger_server.keys.store import Erasure, KeyStore, key_store_for
from graphledger_server.log.offsets import OffsetStatements, visible_offsets
from graphledger_server.projection import parked
from graphledger_server.projection.batch import BatchApplier, BatchResult
from graphledger_server.projection.checkpoints import CheckpointProjection
from graphledger_server.projection.migrate import migrate
from graphledger_server.projection.records import DeadLetter, SourceRecord
from projection_helpers import TOPIC, cid, put

GROUP = "g"


@dataclasses.dataclass
class Lab:
    settings: Settings
    conn: asyncpg.Connection
    store: KeyStore
    sealer: EventSealer
    letters: list[DeadLetter]
    ends: dict[tuple[str, int], int]
    """What the log-end callback answers (a partition absent: it does not exist)."""

    @property
    def schema(self) -> str:
        return self.settings.postgres_schema

    def applier(self, schema: str | None = None) -> BatchApplier:
        schema = schema or self.schema

        async def sink(letters: Sequence[DeadLetter]) -> None:
            self.letters.extend(letters)

        async def log_ends(positions: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
            return {tp: self.ends[tp] for tp in positions if tp in self.ends}

        return BatchApplier(
            schema, GROUP, {TOPIC: CheckpointProjection(schema)}, sink,
            keys=DataKeyCache(self.store), sealed_only=True, log_ends=log_ends,
        )  # fmt: skip

    async def sealed(self, event: CheckpointEvent, tenant: str, partition: int, offset: int) -> SourceRecord:
        key, env = await self.sealer.seal(event, tenant)
        return _record(env, key, partition, offset)

    async def apply(self, records: Sequence[SourceRecord], applier: BatchApplier | None = None) -> BatchResult:
        return await (applier or self.applier()).apply(self.conn, records)

    async def release(self, applier: BatchApplier | None = None) -> BatchResult:
        """What a worker does with its parked partitions: run those due again."""
        applier = applier or self.applier()
        partitions = {
            (r["topic"], r["partition"])
            for r in await self.conn.fetch(f"SELECT topic, partition FROM {applier.schema}.graphledger_parked")
        }
        return await applier.apply(self.conn, [], released=await applier.releasable(self.conn, partitions))

    async def checkpoints(self, thread_id: str, schema: str | None = None) -> list[str]:
        rows = await self.conn.fetch(
            f"SELECT checkpoint_id FROM {schema or self.schema}.checkpoints WHERE thread_id = $1 ORDER BY 1", thread_id
        )
        return [r["checkpoint_id"] for r in rows]

    async def parked_list(self, schema: str | None = None) -> list[dict[str, Any]]:
        return await parked.list_parked(self.conn, schema or self.schema)


def _record(env: Envelope, key: str | None, partition: int, offset: int) -> SourceRecord:
    value, headers = envelope.encode(env), tuple(envelope.headers_for(env))
    key_bytes = None if key is None else key.encode()
    return SourceRecord(TOPIC, partition, offset, key_bytes, value, headers, env.produced_ms)  # appended as produced


def plain(
    event: Any, partition: int, offset: int, key: bytes | None = b"forged", version: int | None = None
) -> SourceRecord:
    env = to_envelope(event)
    if version is not None:
        env = Envelope(env.type, env.event_id, env.produced_ms, env.payload, version=version)
    value, headers = envelope.encode(env), tuple(envelope.headers_for(env))
    return SourceRecord(TOPIC, partition, offset, key, value, headers, env.produced_ms)  # appended as produced


def newer(record: SourceRecord, version: int = 99) -> SourceRecord:
    """The record as a version no release wrote would carry it."""
    env = envelope.decode(record.value)
    return dataclasses.replace(record, value=envelope.encode(dataclasses.replace(env, version=version)))


@pytest.fixture
async def lab(make_settings: Callable[..., Settings]) -> AsyncIterator[Lab]:
    settings = make_settings()
    await migrate(settings.postgres_dsn, settings.postgres_schema)
    pool = await asyncpg.create_pool(settings.postgres_dsn, min_size=1, max_size=2)
    conn = await asyncpg.connect(settings.postgres_dsn)
    store = key_store_for(settings, pool)
    assert store is not None
    try:
        yield Lab(settings, conn, store, EventSealer(StoreKeySource(store, settings), 60.0), [], {})
    finally:
        await conn.close()
        await pool.close()


# -- parking ---------------------------------------------------------------------------------------------


async def test_a_newer_version_parks_its_subject_and_the_partition_moves_on(lab: Lab) -> None:
    first = await lab.sealed(put("acme/t", 1), "acme", 0, 0)
    too_new = newer(await lab.sealed(put("acme/t", 2, 1), "acme", 0, 1))
    later = await lab.sealed(put("acme/t", 3, 2), "acme", 0, 2)
    other = await lab.sealed(put("acme/u", 1), "acme", 0, 3)
    result = await lab.apply([first, too_new, later, other])
    assert result.next_offsets == {(TOPIC, 0): 4} and result.parked_records == 2
    assert await lab.checkpoints("acme/t") == [cid(1)] and await lab.checkpoints("acme/u") == [cid(1)]
    [subject] = await lab.parked_list()
    assert (subject["subject"], subject["cause"], subject["records"]) == (f"{TOPIC}:0@1", "newer_version", 2)
    # Records of the subject after it wait with it, in later batches too; other subjects do not.
    more = await lab.sealed(put("acme/t", 4, 3), "acme", 0, 4)
    assert (await lab.apply([more])).parked_records == 1
    # A release runs it again: still too new, it parks again, as a replay of the log would.
    assert await parked.request(lab.conn, lab.schema, TOPIC, 0, 1, "release") == "newer_version"
    released = await lab.release()
    assert released.released == 1 and released.parked_records == 3 and await lab.checkpoints("acme/t") == [cid(1)]
    # A skip dead-letters the record that parked it, and the subject's other records apply.
    await parked.request(lab.conn, lab.schema, TOPIC, 0, 1, "skip")
    skipped = await lab.release()
    assert skipped.dead_letters == 1 and skipped.applied == 2
    assert [letter.record.offset for letter in lab.letters] == [1] and "skipped by an operator" in lab.letters[0].reason
    assert await lab.checkpoints("acme/t") == [cid(1), cid(3), cid(4)]
    assert await lab.parked_list() == []


async def test_a_replay_parks_what_the_live_projection_parked_and_skips_what_an_operator_skipped(lab: Lab) -> None:
    records = [
        newer(await lab.sealed(put("acme/t", 9), "acme", 0, 0)),
        await lab.sealed(put("acme/t", 1), "acme", 0, 1),
        plain(RunsDelete(("r",)), 0, 2, key=None),
    ]
    await lab.apply(records)
    await parked.request(lab.conn, lab.schema, TOPIC, 0, 0, "skip")
    await lab.release()
    # A rebuild into another schema, with the skips carried over: the same decision without an operator.
    rebuilt = lab.schema + "_rebuild"
    await migrate(lab.settings.postgres_dsn, rebuilt)
    await parked.carry_skips(lab.conn, lab.schema, rebuilt)
    result = await lab.apply(records, lab.applier(rebuilt))
    assert result.dead_letters == 1 and result.parked_records == 0
    assert await lab.checkpoints("acme/t", rebuilt) == await lab.checkpoints("acme/t") == [cid(1)]
    # Without the skips, it parks as the live projection first did.
    other = lab.schema + "_other"
    await migrate(lab.settings.postgres_dsn, other)
    assert (await lab.apply(records, lab.applier(other))).parked_records == 2


async def test_a_keyless_record_no_version_can_apply_parks_alone(lab: Lab) -> None:
    records = [
        plain(RunsDelete(("r1",)), 1, 0, key=None, version=99),
        plain(RunsDelete(("r2",)), 1, 1, key=None),
        await lab.sealed(put("acme/t", 1), "acme", 1, 2),
    ]
    result = await lab.apply(records)
    assert result.parked_records == 1 and result.applied == 2
    [subject] = await lab.parked_list()
    assert subject["keyless"] and subject["records"] == 1


async def test_a_copy_barrier_beyond_the_log_parks_its_subject_for_an_operator(lab: Lab) -> None:
    lab.ends = {(TOPIC, 1): 10}
    barrier = await lab.sealed(ThreadCopyBarrier("acme/target", 1, 2**62), "acme", 0, 0)
    after = await lab.sealed(put("acme/target", 1), "acme", 0, 1)
    other = await lab.sealed(put("acme/other", 1), "acme", 0, 2)
    nowhere = await lab.sealed(ThreadCopyBarrier("acme/else", 7, 0), "acme", 0, 3)  # no partition 7
    result = await lab.apply([barrier, after, other, nowhere])
    assert result.next_offsets == {(TOPIC, 0): 4} and result.applied == 1
    causes = sorted((s["subject"], s["cause"], s["records"]) for s in await lab.parked_list())
    assert causes == [(f"{TOPIC}:0@0", "beyond_log", 2), (f"{TOPIC}:0@3", "beyond_log", 1)]
    offsets = await visible_offsets(lab.conn, OffsetStatements(lab.schema), GROUP)
    assert offsets[(TOPIC, 0)] == 4  # nothing waits: reads are not held by a forged barrier
    assert (await lab.release()).released == 0  # an operator's matter


async def test_a_copy_barrier_waits_on_its_subject_alone_until_its_copy_applied(lab: Lab) -> None:
    lab.ends = {(TOPIC, 1): 10}
    copy = await lab.sealed(ThreadCopy("acme/source", "acme/target"), "acme", 1, 5)
    source = [await lab.sealed(put("acme/source", 1), "acme", 1, 4)]
    barrier = await lab.sealed(ThreadCopyBarrier("acme/target", 1, 5), "acme", 0, 0)
    after = await lab.sealed(put("acme/target", 2, 1), "acme", 0, 1)
    other = await lab.sealed(put("acme/other", 1), "acme", 0, 2)
    result = await lab.apply([barrier, after, other])
    assert result.applied == 1 and result.parked_state[(TOPIC, 0)].waiting
    # A read counts partition 0 applied only up to the barrier, as when the barrier held the partition.
    assert (await visible_offsets(lab.conn, OffsetStatements(lab.schema), GROUP))[(TOPIC, 0)] == 0
    assert (await lab.release()).released == 0  # the copy has not applied
    await lab.apply([*source, copy])
    released = await lab.release()
    assert released.released == 1 and released.applied == 2
    assert await lab.checkpoints("acme/target") == [cid(1), cid(2)]  # the copy's, then its own
    assert await lab.parked_list() == []
    assert (await visible_offsets(lab.conn, OffsetStatements(lab.schema), GROUP))[(TOPIC, 0)] == 3


# -- erasure only when the key store recorded it ----------------------------------------------------------


async def test_a_forged_erasure_changes_nothing_a_recorded_one_applies(lab: Lab) -> None:
    await lab.apply([await lab.sealed(put("acme/t", 1), "acme", 0, 0)])
    hash_key = (await StoreKeySource(lab.store, lab.settings).tenant_hashing("acme")).hash_key
    ref = reference(hash_key, thread_subject("acme", "acme/t"))
    forged = [plain(TenantErase("acme"), 0, 1, key=None), plain(ThreadErase(ref), 0, 2, key=ref.encode())]
    result = await lab.apply(forged)
    assert result.dead_letters == 2 and result.applied == 0
    assert all("the key store records no erasure" in letter.reason for letter in lab.letters)
    assert await lab.checkpoints("acme/t") == [cid(1)]
    after = await lab.sealed(put("acme/t", 2, 1), "acme", 0, 3)
    assert (await lab.apply([after])).applied == 1  # its later writes are not lost either
    await lab.store.erase(Erasure("thread", "acme", ref), "test")
    assert (await lab.apply([plain(ThreadErase(ref), 0, 4, key=ref.encode())])).applied == 1
    assert await lab.checkpoints("acme/t") == []


# -- a sealed event affects only the subject its seal authenticates ---------------------------------------


async def test_only_the_subject_a_seal_authenticates_is_affected(lab: Lab) -> None:
    victim = await lab.sealed(put("acme/t", 1), "acme", 0, 0)
    await lab.apply([victim])
    evil = await lab.sealed(put("evil/x", 1), "evil", 0, 2)
    key, envelope_ = await lab.sealer.seal(put("evil/x", 2, 1), "evil")
    evil_ref = envelope_.payload["sealed"]["ref"]
    evil_key = (await lab.store.owned([evil_ref]))[evil_ref][0]
    assert isinstance(evil_key, bytes)

    def sealed_as(event: CheckpointEvent, tenant: str, name: str, offset: int) -> SourceRecord:
        """Sealed with evil's key, claiming another subject inside the seal."""
        env = seal(to_envelope(event), SealedSubject(evil_ref, "thread", tenant, name), cipher_of(evil_key))
        return _record(env, key, 0, offset)

    hostile = [
        sealed_as(put("acme/t", 9), "acme", "acme/t", 1),  # first: its claim would be the name of evil's ref
        plain(put("acme/t", 2, 1), 0, 3, key=victim.key),  # in the clear, for a sealed deployment
        sealed_as(put("acme/t", 3, 1), "acme", "acme/t", 4),  # evil's key claims acme's thread
        sealed_as(put("acme/t", 4, 1), "evil", "acme/t", 5),  # evil's own tenant, acme's thread
        sealed_as(put("evil/y", 1), "evil", "evil/y", 6),  # evil's thread, not its key's subject
        sealed_as(ThreadCopy("acme/t", "evil/x"), "evil", "evil/x", 7),  # a copy out of acme
    ]
    result = await lab.apply([hostile[0]])
    assert result.dead_letters == 1
    hostile = hostile[1:]
    result = await lab.apply([evil, *hostile])
    assert result.applied == 1 and result.dead_letters == len(hostile)
    reasons = [letter.reason for letter in lab.letters[1:]]
    assert "in the clear names a subject's data" in reasons[0]
    assert "another tenant than its key's" in reasons[1]
    assert "outside that tenant" in reasons[2]
    assert "not the reference" in reasons[3]
    assert "outside that tenant" in reasons[4]
    assert await lab.checkpoints("acme/t") == [cid(1)] and await lab.checkpoints("evil/y") == []
    assert await lab.checkpoints("evil/x") == [cid(1)]
    # A refused seal names no subject: erasing the key's own subject erases only that.
    names = await lab.conn.fetch(f"SELECT name FROM {lab.schema}.graphledger_subjects WHERE ref = $1", evil_ref)
    assert [r["name"] for r in names] == ["evil/x"]
    await lab.store.erase(Erasure("thread", "evil", evil_ref), "test")
    assert (await lab.apply([plain(ThreadErase(evil_ref), 0, 8, key=key.encode())])).applied == 1
    assert await lab.checkpoints("acme/t") == [cid(1)] and await lab.checkpoints("evil/x") == []


async def test_naming_someone_elses_fresh_key_binds_nothing(lab: Lab) -> None:
    [(key_id, raw)] = await lab.store.fresh_keys("acme", 1)
    hash_key = (await StoreKeySource(lab.store, lab.settings).tenant_hashing("acme")).hash_key
    ref = reference(hash_key, thread_subject("acme", "acme/t"))
    # A record in evil's hands: it names acme's fresh key (seen in a header) for another subject.
    stolen = plain(put("evil/x", 1), 0, 0, key=b"evil")
    stolen = dataclasses.replace(
        stolen, headers=(*stolen.headers, (envelope.HEADER_SUBJECT, b"0" * 32), (envelope.HEADER_KEY, key_id.encode()))
    )
    await lab.apply([stolen])
    env = seal(to_envelope(put("acme/t", 1)), SealedSubject(ref, "thread", "acme", "acme/t"), cipher_of(raw), key_id)
    result = await lab.apply([_record(env, ref, 0, 1)])
    assert result.applied == 1 and await lab.checkpoints("acme/t") == [cid(1)]
    assert (await lab.store.fresh_found([key_id]))[key_id].ref == ref
