"""The key store on Postgres: tenants' hashing keys, subjects' data keys, fresh keys, erasures, all in
a schema of their own (`GRAPHLEDGER_KEY_STORE_SCHEMA`), which a replay never drops or switches.

Keys are created on first use, race-free across processes: every caller generates a key and inserts
it with `ON CONFLICT DO NOTHING`, then reads what the table holds, so all of them get the first one.
An erasure replaces the wrapped key by NULL and stamps `erased_at` (a tombstone: the subject's key can
never be created again), in the same transaction as its audit row.

Fresh keys (`graphledger.erasure.fresh_keys`) are issued to a tenant bound to no subject. A reader of the
log reads them without binding (`fresh`), and binds one to a subject (`bind_fresh`) only once a record of
that subject opened with it: the seal's associated data names the subject, so only a holder of the key
can make such a record, while anyone who reads the log sees the key ids its headers name. The first
binding wins; a record naming a key bound to another subject does not open. An erasure destroys the
fresh keys bound to its subject, and binding a key to an erased subject destroys it: both take the
subject's advisory lock, so neither can slip between the other's check and write.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass

import asyncpg

from graphledger.erasure.sealing import ERASED, MISBOUND, Erased, Misbound, new_data_key
from graphledger.erasure.subjects import Subject
from graphledger.errors import SubjectErasedError
from graphledger.settings import Settings
from graphledger_server.keys.ring import KeyRing, KeyRingError, Wrapped
from graphledger_server.sql import XACT_LOCK_SQL, lock_key, render

log = logging.getLogger(__name__)

RawKey = bytes | Erased
"""A data key as stored (unwrapped), or `ERASED`."""

SCHEMA_SQL = """
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.tenant_keys (
    tenant TEXT PRIMARY KEY,
    kek_id TEXT,
    wrapped BYTEA,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    erased_at TIMESTAMPTZ
);
CREATE TABLE IF NOT EXISTS {schema}.data_keys (
    ref TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    kind TEXT NOT NULL,
    kek_id TEXT,
    wrapped BYTEA,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    erased_at TIMESTAMPTZ
);
CREATE INDEX IF NOT EXISTS data_keys_tenant_idx ON {schema}.data_keys (tenant);
CREATE TABLE IF NOT EXISTS {schema}.fresh_keys (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    kek_id TEXT,
    wrapped BYTEA,
    ref TEXT,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    bound_at TIMESTAMPTZ
);
CREATE INDEX IF NOT EXISTS fresh_keys_ref_idx ON {schema}.fresh_keys (ref);
CREATE INDEX IF NOT EXISTS fresh_keys_tenant_idx ON {schema}.fresh_keys (tenant);
CREATE TABLE IF NOT EXISTS {schema}.erasures (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind TEXT NOT NULL,
    ref TEXT,
    tenant TEXT NOT NULL,
    erased_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    erased_by TEXT NOT NULL
);
"""

KEY_STORE_RELATIONS = tuple(re.findall(r"CREATE (?:TABLE|INDEX) IF NOT EXISTS (?:\{schema\}\.)?(\w+)", SCHEMA_SQL))
"""The tables and indexes `SCHEMA_SQL` makes."""
# $1 schema, $2 -> relation names: how many of them the schema has.
EXISTING_RELATIONS_SQL = """
SELECT count(*) FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1::text AND c.relname = ANY($2::text[])
"""

# $1 tenant, $2 kek id, $3 wrapped key.
INSERT_HASH_KEY_SQL = """
INSERT INTO {schema}.tenant_keys (tenant, kek_id, wrapped) VALUES ($1::text, $2::text, $3::bytea)
ON CONFLICT (tenant) DO NOTHING
"""
# $1 tenant.
HASH_KEY_SQL = "SELECT kek_id, wrapped FROM {schema}.tenant_keys WHERE tenant = $1::text"

# $1 tenant: its hashing key row, locked against a concurrent erasure of the tenant (which locks it
# for update), so that no data key is created for a tenant being erased.
TENANT_ERASED_SQL = "SELECT erased_at IS NOT NULL FROM {schema}.tenant_keys WHERE tenant = $1::text FOR SHARE"
# $1..$5 -> unnest(ref, tenant, kind, kek_id, wrapped).
INSERT_DATA_KEYS_SQL = """
INSERT INTO {schema}.data_keys (ref, tenant, kind, kek_id, wrapped)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[])
ON CONFLICT (ref) DO NOTHING
"""
# $1 -> refs. A row with a NULL key is an erased subject.
DATA_KEYS_SQL = "SELECT ref, kek_id, wrapped FROM {schema}.data_keys WHERE ref = ANY($1::text[])"

# $1..$4 -> unnest(id, tenant, kek_id, wrapped).
INSERT_FRESH_KEYS_SQL = """
INSERT INTO {schema}.fresh_keys (id, tenant, kek_id, wrapped)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[])
"""
IDLE_IN_TRANSACTION_S = 5.0
"""Longest a key store transaction waits on its own process between two statements before Postgres ends
its session (rolling it back). A process stopped inside one (a paused pod, a partition from Postgres)
would otherwise hold the subject's lock and the rows it wrote for as long as it stays stopped, and with
them every binding of that subject: the read-through of a read, a projector's batch, an erasure. The
statements follow one another with nothing but the event loop in between, so no live process comes near
it; the one stopped gets a retryable error once it runs again."""
# $1 -> the bound, for this transaction only.
BOUND_IDLE_SQL = "SELECT set_config('idle_in_transaction_session_timeout', $1, true)"
# A subject's lock, taken by an erasure and by a binding: $1 -> the lock key of its reference.
SUBJECT_LOCK_SQL = "SELECT pg_advisory_xact_lock($1::bigint)"
# $1 -> ids, $2 -> refs: each fresh key not bound yet is bound to its ref.
BIND_FRESH_KEYS_SQL = """
UPDATE {schema}.fresh_keys AS f SET ref = u.ref, bound_at = now()
FROM unnest($1::text[], $2::text[]) AS u(id, ref)
WHERE f.id = u.id AND f.ref IS NULL
"""
# $1 -> refs: fresh keys bound to an erased subject are destroyed.
DESTROY_FRESH_KEYS_OF_ERASED_SQL = """
UPDATE {schema}.fresh_keys AS f SET kek_id = NULL, wrapped = NULL
FROM {schema}.data_keys AS d
WHERE f.ref = d.ref AND d.ref = ANY($1::text[]) AND d.erased_at IS NOT NULL AND f.wrapped IS NOT NULL
"""
# $1 -> ids.
FRESH_KEYS_SQL = "SELECT id, ref, tenant, kek_id, wrapped FROM {schema}.fresh_keys WHERE id = ANY($1::text[])"
# $1 ref.
DESTROY_BOUND_FRESH_KEYS_SQL = "UPDATE {schema}.fresh_keys SET kek_id = NULL, wrapped = NULL WHERE ref = $1::text"
# $1 tenant.
DESTROY_TENANT_FRESH_KEYS_SQL = "UPDATE {schema}.fresh_keys SET kek_id = NULL, wrapped = NULL WHERE tenant = $1::text"
STALE_FRESH_KEYS_SQL = "SELECT id, kek_id, wrapped FROM {schema}.fresh_keys WHERE kek_id <> $1::text"
# $1 id, $2 old kek id, $3 new kek id, $4 wrapped.
REWRAP_FRESH_KEY_SQL = """
UPDATE {schema}.fresh_keys SET kek_id = $3::text, wrapped = $4::bytea WHERE id = $1::text AND kek_id = $2::text
"""

# $1 ref, $2 tenant, $3 kind.
ERASE_DATA_KEY_SQL = """
INSERT INTO {schema}.data_keys AS k (ref, tenant, kind, erased_at) VALUES ($1::text, $2::text, $3::text, now())
ON CONFLICT (ref) DO UPDATE SET kek_id = NULL, wrapped = NULL, erased_at = coalesce(k.erased_at, now())
"""
# $1 tenant.
ERASE_TENANT_DATA_KEYS_SQL = """
UPDATE {schema}.data_keys SET kek_id = NULL, wrapped = NULL, erased_at = coalesce(erased_at, now())
WHERE tenant = $1::text
"""
ERASE_HASH_KEY_SQL = """
INSERT INTO {schema}.tenant_keys AS k (tenant, erased_at) VALUES ($1::text, now())
ON CONFLICT (tenant) DO UPDATE SET kek_id = NULL, wrapped = NULL, erased_at = coalesce(k.erased_at, now())
"""
# $1 kind, $2 ref (null for a tenant), $3 tenant, $4 who.
RECORD_ERASURE_SQL = """
INSERT INTO {schema}.erasures (kind, ref, tenant, erased_by) VALUES ($1::text, $2::text, $3::text, $4::text)
"""

# $1 -> thread references.
THREAD_ERASURE_TIMES_SQL = """
SELECT ref, (extract(epoch FROM min(erased_at)) * 1000)::bigint AS at_ms
FROM {schema}.erasures WHERE kind = 'thread' AND ref = ANY($1::text[]) GROUP BY ref
"""

# $1 -> subject references, $2 -> fresh key ids: the tenant each key was made for (or issued to).
KEY_OWNERS_SQL = """
SELECT ref, NULL::text AS id, tenant FROM {schema}.data_keys WHERE ref = ANY($1::text[])
UNION ALL
SELECT NULL, id, tenant FROM {schema}.fresh_keys WHERE id = ANY($2::text[])
"""

# $1 -> subject references, $2 -> tenants: which of them the key store recorded as erased.
RECORDED_ERASURES_SQL = """
SELECT kind, ref, tenant FROM {schema}.erasures
WHERE ref = ANY($1::text[]) OR (kind = 'tenant' AND tenant = ANY($2::text[]))
"""

# Rotation: the keys wrapped by another key-encryption key than the active one. $1 active kek id.
STALE_DATA_KEYS_SQL = "SELECT ref, kek_id, wrapped FROM {schema}.data_keys WHERE kek_id <> $1::text"
STALE_HASH_KEYS_SQL = "SELECT tenant, kek_id, wrapped FROM {schema}.tenant_keys WHERE kek_id <> $1::text"
# $1 ref, $2 old kek id, $3 new kek id, $4 wrapped: only if nobody erased or rewrapped it meanwhile.
REWRAP_DATA_KEY_SQL = """
UPDATE {schema}.data_keys SET kek_id = $3::text, wrapped = $4::bytea WHERE ref = $1::text AND kek_id = $2::text
"""
REWRAP_HASH_KEY_SQL = """
UPDATE {schema}.tenant_keys SET kek_id = $3::text, wrapped = $4::bytea WHERE tenant = $1::text AND kek_id = $2::text
"""


FreshKey = bytes | Erased | Misbound
FRESH_ID_BYTES = 16


@dataclass(frozen=True, slots=True)
class IssuedFreshKey:
    """A fresh key as the key store holds it (`KeyStore.fresh`), read without binding it."""

    key: RawKey
    """The key, or `ERASED` once destroyed (an erasure of its subject or of its tenant)."""
    ref: str | None
    """The subject it is bound to, None while it is bound to none."""
    tenant: str
    """The tenant it was issued to (its owner, `owners`)."""


@dataclass(frozen=True, slots=True)
class Erasure:
    """What to erase: a subject (by its reference) or a whole tenant (`ref` None)."""

    kind: str
    tenant: str
    ref: str | None = None


@contextlib.asynccontextmanager
async def bounded_transaction(conn: asyncpg.Connection) -> AsyncIterator[None]:
    """A transaction that Postgres ends if its process stops inside it (`IDLE_IN_TRANSACTION_S`)."""
    async with conn.transaction():
        await conn.execute(BOUND_IDLE_SQL, f"{round(IDLE_IN_TRANSACTION_S * 1000)}ms")
        yield


async def migrate_key_store(conn: asyncpg.Connection, schema: str) -> None:
    """Create the key store's schema and tables if missing (idempotent, serialized across processes).

    A key store that has them all is left untouched: `CREATE INDEX IF NOT EXISTS` takes a SHARE lock on
    its table even when the index exists, so it waits for every open write on the table, and every write
    asked for after it waits behind it. A process starting while a binding is held open (its projector
    stopped inside the transaction) would stop every bind and key creation of every process."""
    if await conn.fetchval(EXISTING_RELATIONS_SQL, schema, list(KEY_STORE_RELATIONS)) == len(KEY_STORE_RELATIONS):
        return
    async with bounded_transaction(conn):
        await conn.execute(XACT_LOCK_SQL, lock_key(f"graphledger:keys:{schema}"))
        await conn.execute(render(SCHEMA_SQL, schema))


def key_store_for(settings: Settings, pool: asyncpg.Pool, acquire_timeout_s: float | None = None) -> KeyStore | None:
    """The key store on `pool`; None without key-encryption keys (see `check_key_settings`)."""
    check_key_settings(settings)
    if settings.key_encryption_keys is None:
        return None
    return KeyStore(pool, settings.key_store_schema, KeyRing.from_settings(settings), acquire_timeout_s)


def check_key_settings(settings: Settings) -> None:
    """`KeyRingError`, naming the setting, when events are sealed without key-encryption keys or these
    are malformed: only a deployment that seals nothing may leave them unset."""
    if settings.key_encryption_keys is not None:
        KeyRing.from_settings(settings)
    elif settings.encrypt_events:
        raise KeyRingError(
            "GRAPHLEDGER_ENCRYPT_EVENTS is on but GRAPHLEDGER_KEY_ENCRYPTION_KEYS is not set: give the services "
            "a key-encryption key (`graphledger keys new-kek`), or turn encryption off everywhere"
        )


class KeyStore:
    """Keys wrapped by a `KeyRing`, on an asyncpg pool. Its tables are created on first use."""

    def __init__(self, pool: asyncpg.Pool, schema: str, ring: KeyRing, acquire_timeout_s: float | None = None) -> None:
        self._pool = pool
        self._acquire_timeout_s = acquire_timeout_s
        """How long a call waits for a pooled connection (None: as long as it takes): a request's bound."""
        self._ring = ring
        self._schema = schema
        self._sql = {name: render(sql, schema) for name, sql in _STATEMENTS.items()}
        self._migrated = False

    async def _ready(self, conn: asyncpg.Connection) -> None:
        if not self._migrated:
            await migrate_key_store(conn, self._schema)
            self._migrated = True

    async def hash_key(self, tenant: str) -> bytes:
        """The tenant's hashing key, created on first use; `SubjectErasedError` once the tenant is erased."""
        owner = _tenant_owner(tenant)
        async with self._pool.acquire(timeout=self._acquire_timeout_s) as conn:
            await self._ready(conn)
            row = await conn.fetchrow(self._sql["hash_key"], tenant)
            if row is None:
                wrapped = self._ring.wrap(new_data_key(), owner)
                await conn.execute(self._sql["insert_hash_key"], tenant, wrapped.kek_id, wrapped.data)
                row = await conn.fetchrow(self._sql["hash_key"], tenant)
        if row is None or row["wrapped"] is None:
            raise SubjectErasedError(f"tenant {tenant!r} was erased")
        return self._ring.unwrap(Wrapped(row["kek_id"], row["wrapped"]), owner)

    async def data_keys(self, subjects: Sequence[tuple[str, Subject]]) -> dict[str, RawKey]:
        """The data key of each `(reference, subject)`, created on first use; erased ones are `ERASED`.
        `SubjectErasedError` when a key would be created for an erased tenant."""
        refs = [ref for ref, _ in subjects]
        async with self._pool.acquire(timeout=self._acquire_timeout_s) as conn:
            await self._ready(conn)
            found = await self._fetch(conn, refs)
            missing = [(ref, s) for ref, s in subjects if ref not in found]
            if missing:
                async with bounded_transaction(conn):
                    for tenant in sorted({s.tenant for _, s in missing}):
                        if await conn.fetchval(self._sql["tenant_erased"], tenant):
                            raise SubjectErasedError(f"tenant {tenant!r} was erased")
                    wrapped = [self._ring.wrap(new_data_key(), ref) for ref, _ in missing]
                    await conn.execute(
                        self._sql["insert_data_keys"],
                        [ref for ref, _ in missing],
                        [s.tenant for _, s in missing],
                        [s.kind for _, s in missing],
                        [w.kek_id for w in wrapped],
                        [w.data for w in wrapped],
                    )
                found |= await self._fetch(conn, [ref for ref, _ in missing])
        return found

    async def fresh_keys(self, tenant: str, count: int) -> list[tuple[str, bytes]]:
        """`count` new data keys of the tenant, bound to no subject yet, as `(id, key)`;
        `SubjectErasedError` for an erased tenant."""
        keys = [(os.urandom(FRESH_ID_BYTES).hex(), new_data_key()) for _ in range(count)]
        wrapped = [self._ring.wrap(key, _fresh_owner(key_id)) for key_id, key in keys]
        async with self._pool.acquire(timeout=self._acquire_timeout_s) as conn:
            await self._ready(conn)
            async with bounded_transaction(conn):
                if await conn.fetchval(self._sql["tenant_erased"], tenant):
                    raise SubjectErasedError(f"tenant {tenant!r} was erased")
                await conn.execute(
                    self._sql["insert_fresh_keys"],
                    [key_id for key_id, _ in keys],
                    [tenant] * count,
                    [w.kek_id for w in wrapped],
                    [w.data for w in wrapped],
                )
        return keys

    async def fresh(self, key_ids: Collection[str]) -> dict[str, IssuedFreshKey]:
        """The fresh keys among `key_ids` the store issued, as they are, with their owners: binds none."""
        async with self._pool.acquire(timeout=self._acquire_timeout_s) as conn:
            await self._ready(conn)
            rows = await conn.fetch(self._sql["fresh_keys"], list(key_ids))
        return {
            row["id"]: IssuedFreshKey(
                ERASED
                if row["wrapped"] is None
                else self._ring.unwrap(Wrapped(row["kek_id"], row["wrapped"]), _fresh_owner(row["id"])),
                row["ref"],
                row["tenant"],
            )
            for row in rows
        }

    async def bind_fresh(self, opened: Collection[tuple[str, str]]) -> dict[tuple[str, str], FreshKey]:
        """Each `(reference, fresh key id)` a record OPENED with (authenticated: never one a record merely
        names): the key, once bound to that subject (if it was bound to none); `ERASED` when the subject
        (so the key) is erased; `MISBOUND` when the key is another subject's (bound first, perhaps by
        another reader meanwhile); none for an id the store never issued."""
        named = sorted(set(opened))
        refs = sorted({ref for ref, _ in named})
        async with self._pool.acquire(timeout=self._acquire_timeout_s) as conn:
            await self._ready(conn)
            async with bounded_transaction(conn):
                for ref in refs:
                    await conn.execute(self._sql["subject_lock"], lock_key(f"graphledger:subject:{ref}"))
                await conn.execute(
                    self._sql["bind_fresh_keys"], [key_id for _, key_id in named], [ref for ref, _ in named]
                )
                await conn.execute(self._sql["destroy_fresh_keys_of_erased"], refs)
                rows = await conn.fetch(self._sql["fresh_keys"], [key_id for _, key_id in named])
        by_id = {row["id"]: row for row in rows}
        found: dict[tuple[str, str], FreshKey] = {}
        for ref, key_id in named:
            row = by_id.get(key_id)
            if row is None:
                continue
            if row["ref"] != ref:
                found[(ref, key_id)] = MISBOUND
            elif row["wrapped"] is None:
                found[(ref, key_id)] = ERASED
            else:
                found[(ref, key_id)] = self._ring.unwrap(Wrapped(row["kek_id"], row["wrapped"]), _fresh_owner(key_id))
        return found

    async def find(self, refs: Collection[str]) -> dict[str, RawKey]:
        """The data keys of `refs` that exist (none is created)."""
        async with self._pool.acquire(timeout=self._acquire_timeout_s) as conn:
            await self._ready(conn)
            return await self._fetch(conn, list(refs))

    async def _fetch(self, conn: asyncpg.Connection, refs: list[str]) -> dict[str, RawKey]:
        keys: dict[str, RawKey] = {}
        for r in await conn.fetch(self._sql["data_keys"], refs):
            keys[r["ref"]] = (
                ERASED if r["wrapped"] is None else self._ring.unwrap(Wrapped(r["kek_id"], r["wrapped"]), r["ref"])
            )
        return keys

    async def owners(self, refs: Collection[str], key_ids: Collection[str]) -> tuple[dict[str, str], dict[str, str]]:
        """The tenant each data key of `refs` and each fresh key of `key_ids` was made for (those that exist)."""
        async with self._pool.acquire(timeout=self._acquire_timeout_s) as conn:
            await self._ready(conn)
            rows = await conn.fetch(self._sql["key_owners"], list(refs), list(key_ids))
        by_ref = {r["ref"]: r["tenant"] for r in rows if r["ref"] is not None}
        return by_ref, {r["id"]: r["tenant"] for r in rows if r["id"] is not None}

    async def recorded_erasures(self, refs: Collection[str], tenants: Collection[str]) -> tuple[set[str], set[str]]:
        """Which of the subjects `refs` and the `tenants` the key store recorded as erased."""
        async with self._pool.acquire(timeout=self._acquire_timeout_s) as conn:
            await self._ready(conn)
            rows = await conn.fetch(self._sql["recorded_erasures"], list(refs), list(tenants))
        erased_refs = {r["ref"] for r in rows if r["kind"] != "tenant"}
        return erased_refs, {r["tenant"] for r in rows if r["kind"] == "tenant"}

    async def thread_erasure_times(self, refs: Collection[str]) -> dict[str, int]:
        """When each of the threads `refs` was first erased (ms since the epoch), for those erased."""
        async with self._pool.acquire(timeout=self._acquire_timeout_s) as conn:
            await self._ready(conn)
            rows = await conn.fetch(self._sql["thread_erasure_times"], list(refs))
        return {r["ref"]: r["at_ms"] for r in rows}

    async def erase(self, erasure: Erasure, erased_by: str) -> None:
        """Destroy the subject's data key, or every key of the tenant, and record who did it when."""
        async with self._pool.acquire(timeout=self._acquire_timeout_s) as conn:
            await self._ready(conn)
            async with bounded_transaction(conn):
                await self._erase(conn, erasure, erased_by)
        log.warning("erased %s %s of tenant %r (by %s)", erasure.kind, erasure.ref or "", erasure.tenant, erased_by)

    async def _erase(self, conn: asyncpg.Connection, erasure: Erasure, erased_by: str) -> None:
        if erasure.ref is not None:
            await conn.execute(self._sql["subject_lock"], lock_key(f"graphledger:subject:{erasure.ref}"))
            await conn.execute(self._sql["erase_data_key"], erasure.ref, erasure.tenant, erasure.kind)
            await conn.execute(self._sql["destroy_bound_fresh_keys"], erasure.ref)
        else:
            await conn.execute(self._sql["erase_hash_key"], erasure.tenant)  # locks the row: no new keys
            await conn.execute(self._sql["erase_tenant_data_keys"], erasure.tenant)
            await conn.execute(self._sql["destroy_tenant_fresh_keys"], erasure.tenant)
        await conn.execute(self._sql["record_erasure"], erasure.kind, erasure.ref, erasure.tenant, erased_by)

    async def rotate(self) -> int:
        """Rewrap every key not wrapped by the ring's active key-encryption key; returns how many."""
        active = self._ring.active
        count = 0
        async with self._pool.acquire(timeout=self._acquire_timeout_s) as conn:
            await self._ready(conn)
            for stale, rewrap, owner_of in (
                ("stale_data_keys", "rewrap_data_key", lambda owner: owner),
                ("stale_hash_keys", "rewrap_hash_key", _tenant_owner),
                ("stale_fresh_keys", "rewrap_fresh_key", _fresh_owner),
            ):
                for row in await conn.fetch(self._sql[stale], active):
                    owner = row[0]
                    key = self._ring.unwrap(Wrapped(row["kek_id"], row["wrapped"]), owner_of(owner))
                    wrapped = self._ring.wrap(key, owner_of(owner))
                    status = await conn.execute(self._sql[rewrap], owner, row["kek_id"], active, wrapped.data)
                    count += status == "UPDATE 1"  # 0: erased or rewrapped by another process meanwhile
        return count


def _tenant_owner(tenant: str) -> str:
    """The associated data of a tenant's wrapped hashing key (apart from every subject reference)."""
    return f"tenant:{tenant}"


def _fresh_owner(key_id: str) -> str:
    """The associated data of a wrapped fresh key (apart from subject references and tenants)."""
    return f"fresh:{key_id}"


_STATEMENTS = {
    "insert_hash_key": INSERT_HASH_KEY_SQL,
    "hash_key": HASH_KEY_SQL,
    "tenant_erased": TENANT_ERASED_SQL,
    "insert_data_keys": INSERT_DATA_KEYS_SQL,
    "data_keys": DATA_KEYS_SQL,
    "erase_data_key": ERASE_DATA_KEY_SQL,
    "erase_tenant_data_keys": ERASE_TENANT_DATA_KEYS_SQL,
    "erase_hash_key": ERASE_HASH_KEY_SQL,
    "record_erasure": RECORD_ERASURE_SQL,
    "thread_erasure_times": THREAD_ERASURE_TIMES_SQL,
    "recorded_erasures": RECORDED_ERASURES_SQL,
    "key_owners": KEY_OWNERS_SQL,
    "stale_data_keys": STALE_DATA_KEYS_SQL,
    "stale_hash_keys": STALE_HASH_KEYS_SQL,
    "rewrap_data_key": REWRAP_DATA_KEY_SQL,
    "rewrap_hash_key": REWRAP_HASH_KEY_SQL,
    "insert_fresh_keys": INSERT_FRESH_KEYS_SQL,
    "subject_lock": SUBJECT_LOCK_SQL,
    "bind_fresh_keys": BIND_FRESH_KEYS_SQL,
    "destroy_fresh_keys_of_erased": DESTROY_FRESH_KEYS_OF_ERASED_SQL,
    "fresh_keys": FRESH_KEYS_SQL,
    "destroy_bound_fresh_keys": DESTROY_BOUND_FRESH_KEYS_SQL,
    "destroy_tenant_fresh_keys": DESTROY_TENANT_FRESH_KEYS_SQL,
    "stale_fresh_keys": STALE_FRESH_KEYS_SQL,
    "rewrap_fresh_key": REWRAP_FRESH_KEY_SQL,
}
