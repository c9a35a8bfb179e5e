"""The data keys a reader of the log opens sealed events with (projector, replay, `dlq`, `encrypt-log`).

A batch's keys are fetched from the key store before any record is decoded, by the references its
records' `gl-subject` headers name (and the fresh keys their `gl-key` headers name), and kept (least
recently used first out) until an erasure of their subject applies: from then on the subject's records
are erased, whatever key was cached. Each key is held with its owner: the tenant it was made for and
that tenant's hashing key, so the projector can check that a record's subject is its key's
(`projection/admission.py`).

A fresh key bound to another subject opens nothing (`MISBOUND`). One bound to no subject yet opens the
records sealed with it, and is bound (`bind`, in the projector's batch) to the subject of the first one
that opened and was admitted: only a holder of the key can seal such a record, so a record that merely
names someone's fresh key in its headers cannot take it. Without a key store (no key-encryption keys
configured) no sealed event opens, and no erasure is confirmed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass

import asyncpg

from graphledger.erasure.sealing import ERASED, MISBOUND, DataKey, Erased, Misbound, SealedSubject, cipher_of
from graphledger_server.keys.store import KeyStore

KeyName = tuple[str, str | None]
"""A sealed record's key: its subject's reference, and the fresh key it names (None: the subject's own)."""

CAPACITY = 100_000
"""Keys kept: a cipher is about 1 KiB, so at most ~100 MiB."""


@dataclass(frozen=True, slots=True)
class KeyOwner:
    """Whose a key is: the tenant it was made for (or issued to, a fresh key) and that tenant's hashing
    key (None: unknown, or the tenant erased)."""

    tenant: str
    hash_key: bytes | None


@dataclass(frozen=True, slots=True)
class _Held:
    key: DataKey | Misbound
    tenant: str | None = None
    unbound: bool = False
    """A fresh key bound to no subject yet: it opens records, and `bind` binds it."""


class DataKeyCache:
    def __init__(self, store: KeyStore | None, capacity: int = CAPACITY) -> None:
        self._store = store
        self._capacity = capacity
        self._keys: OrderedDict[KeyName, _Held] = OrderedDict()
        self._hash_keys: dict[str, bytes | Erased] = {}
        self._erased_tenants: set[str] = set()

    async def load(self, names: Iterable[KeyName]) -> None:
        """Fetch the keys of `names` not held yet, and their tenants' hashing keys (raises what the key
        store raises: the batch retries). Nothing is bound here."""
        missing = {name for name in names if name not in self._keys}
        if not missing or self._store is None:
            return
        tenants = set()
        if own := {ref for ref, key_id in missing if key_id is None}:
            for ref, (key, tenant) in (await self._store.owned(own)).items():
                self._hold((ref, None), _Held(ERASED if isinstance(key, Erased) else cipher_of(key), tenant))
                tenants.add(tenant)
        if fresh := {(ref, key_id) for ref, key_id in missing if key_id is not None}:
            rows = await self._store.fresh_found({key_id for _, key_id in fresh})
            for ref, key_id in fresh:
                row = rows.get(key_id)
                if row is None:
                    continue  # never issued: the record does not open
                if row.ref is not None and row.ref != ref:
                    self._hold((ref, key_id), _Held(MISBOUND))
                elif isinstance(row.key, Erased):
                    self._hold((ref, key_id), _Held(ERASED))
                else:
                    self._hold((ref, key_id), _Held(cipher_of(row.key), row.tenant, unbound=row.ref is None))
                    tenants.add(row.tenant)
        if tenants := tenants - self._hash_keys.keys():
            self._hash_keys.update(await self._store.hash_keys(tenants))

    def get(self, ref: str, key_id: str | None = None) -> DataKey | Misbound | None:
        own = self._keys.get((ref, None))
        if own is not None and own.key is ERASED:
            return ERASED  # the subject's erasure applied: every key of it is gone
        held = self._keys.get((ref, key_id))
        if held is None:
            return None
        self._keys.move_to_end((ref, key_id))
        return held.key

    def owner(self, ref: str, key_id: str | None = None) -> KeyOwner | None:
        """Whose the key `(ref, key_id)` is, if it is held."""
        held = self._keys.get((ref, key_id))
        if held is None or held.tenant is None:
            return None
        hash_key = self._hash_keys.get(held.tenant)
        return KeyOwner(held.tenant, hash_key if isinstance(hash_key, bytes) else None)

    def unbound(self, ref: str, key_id: str | None) -> bool:
        """Whether `(ref, key_id)` is a fresh key no subject is bound to yet."""
        held = self._keys.get((ref, key_id)) if key_id is not None else None
        return held is not None and held.unbound

    async def bind(
        self, conn: asyncpg.Connection, names: Collection[tuple[str, str]]
    ) -> dict[KeyName, DataKey | Misbound]:
        """Bind each fresh key `(ref, key_id)` to the subject of a record that opened with it, in `conn`'s
        transaction: the key, or `MISBOUND` (another subject took it meanwhile) or `ERASED` (the subject
        is erased, which destroys the key)."""
        if not names or self._store is None:
            return {}
        bound: dict[KeyName, DataKey | Misbound] = {}
        found = await self._store.bind_fresh(names, conn)
        for name in names:
            key = found.get(name, MISBOUND)
            held = self._keys.get(name)
            if isinstance(key, bytes):
                cipher = (
                    held.key if held is not None and not isinstance(held.key, Erased | Misbound) else cipher_of(key)
                )
                self._hold(name, _Held(cipher, held.tenant if held is not None else None))
                bound[name] = cipher
            else:
                self._hold(name, _Held(key))
                bound[name] = key
        return bound

    async def recorded_erasures(
        self, conn: asyncpg.Connection, refs: Collection[str], tenants: Collection[str]
    ) -> tuple[set[str], set[str]]:
        """Which of the subjects `refs` and `tenants` the key store recorded as erased (none without one)."""
        if self._store is None or not (refs or tenants):
            return set(), set()
        return await self._store.recorded_erasures(refs, tenants, conn)

    def is_erased(self, subject: SealedSubject) -> bool:
        """Whether an erasure of the subject (or its tenant) applied since its event was decoded."""
        own = self._keys.get((subject.ref, None))
        return (own is not None and own.key is ERASED) or subject.tenant in self._erased_tenants

    def erase(self, ref: str) -> None:
        self._hold((ref, None), _Held(ERASED))

    def forget(self, ref: str) -> None:
        """Drop what is held of the subject `ref`: its next `load` asks the key store again."""
        for name in [name for name in self._keys if name[0] == ref]:
            del self._keys[name]

    def forget_tenant(self, tenant: str) -> None:
        """Drop what is held of the tenant's keys and its hashing key: the next `load` asks again."""
        for name in [name for name, held in self._keys.items() if held.tenant == tenant]:
            del self._keys[name]
        self._hash_keys.pop(tenant, None)

    def erase_tenant(self, tenant: str) -> None:
        self._erased_tenants.add(tenant)

    def _hold(self, name: KeyName, held: _Held) -> None:
        """Keep `held` as the most recently used, forgetting the least recently used beyond the capacity."""
        self._keys[name] = held
        self._keys.move_to_end(name)
        while len(self._keys) > self._capacity:
            self._keys.popitem(last=False)
