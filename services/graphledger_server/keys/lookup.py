"""The data keys a reader of the log opens sealed events with (projector, replay, `dlq`).

A batch's keys are fetched from the key store before any record is decoded, by the references its
records' `gl-subject` headers name (and the fresh keys their `gl-key` headers name, which the key store
binds to that subject on first sight), and kept (least recently used first out) until an erasure of
their subject applies: from then on the subject's records are erased, whatever key was cached. A fresh
key bound to another subject opens nothing (`MISBOUND`). Without a key store (no key-encryption keys
configured) no sealed event opens. Each key is held with its owner, the tenant the key store made it
for, so a reader can refuse a record sealed for a subject of another tenant (`projection/admission.py`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable

from graphledger.erasure.sealing import ERASED, DataKey, Erased, Misbound, SealedSubject, cipher_of
from graphledger_server.keys.store import KeyStore

KeyName = tuple[str, str | None]
"""A sealed record's key: its subject's reference, and the fresh key it names (None: the subject's own)."""

CAPACITY = 100_000
"""Keys kept: a cipher is about 1 KiB, so at most ~100 MiB."""


class DataKeyCache:
    def __init__(self, store: KeyStore | None, capacity: int = CAPACITY) -> None:
        self._store = store
        self._capacity = capacity
        self._keys: OrderedDict[KeyName, DataKey | Misbound] = OrderedDict()
        self._owners: dict[KeyName, str] = {}
        self._erased_tenants: set[str] = set()

    async def load(self, names: Iterable[KeyName]) -> None:
        """Fetch the keys of `names` not held yet, binding fresh ones, and the owners of those held without
        one (raises what the key store raises: the batch retries)."""
        names = set(names)
        missing = {name for name in names if name not in self._keys}
        if self._store is None:
            return
        if own := {ref for ref, key_id in missing if key_id is None}:
            for ref, key in (await self._store.find(own)).items():
                self._hold((ref, None), ERASED if isinstance(key, Erased) else cipher_of(key))
        if fresh := {(ref, key_id) for ref, key_id in missing if key_id is not None}:
            for name, found in (await self._store.bind_fresh(fresh)).items():
                self._hold(name, found if isinstance(found, Erased | Misbound) else cipher_of(found))
        opened = [
            name
            for name in names
            if name not in self._owners and not isinstance(self._keys.get(name, ERASED), Erased | Misbound)
        ]
        if not opened:
            return
        by_ref, by_id = await self._store.owners(
            {ref for ref, key_id in opened if key_id is None}, {key_id for _, key_id in opened if key_id is not None}
        )
        for ref, key_id in opened:
            owner = by_ref.get(ref) if key_id is None else by_id.get(key_id)
            if owner is not None:
                self._owners[(ref, key_id)] = owner

    def owner(self, name: KeyName) -> str | None:
        """The tenant the held key `name` was made for (None: not held, or unknown)."""
        return self._owners.get(name)

    async def recorded_erasures(
        self, refs: Collection[str], tenants: Collection[str]
    ) -> tuple[set[str], set[str]] | None:
        """Which of the subjects `refs` and the `tenants` the key store recorded as erased (None: there is no
        key store to ask)."""
        if self._store is None:
            return None
        if not refs and not tenants:
            return set(), set()
        return await self._store.recorded_erasures(refs, tenants)

    async def thread_erasure_times(self, refs: Collection[str]) -> dict[str, int]:
        """When each erased thread among `refs` was erased (ms), from the key store (none without one)."""
        if not refs or self._store is None:
            return {}
        return await self._store.thread_erasure_times(refs)

    def get(self, ref: str, key_id: str | None = None) -> DataKey | Misbound | None:
        if self._keys.get((ref, None)) is ERASED:
            return ERASED  # the subject's erasure applied: every key of it is gone
        key = self._keys.get((ref, key_id))
        if key is not None:
            self._keys.move_to_end((ref, key_id))
        return key

    def is_erased(self, subject: SealedSubject) -> bool:
        """Whether an erasure of the subject (or its tenant) applied since its event was decoded."""
        return self._keys.get((subject.ref, None)) is ERASED or subject.tenant in self._erased_tenants

    def erase(self, ref: str) -> None:
        self._hold((ref, None), ERASED)

    def forget(self, ref: str) -> None:
        """Drop what is held of the subject `ref`: its next `load` asks the key store again."""
        for name in [name for name in self._keys if name[0] == ref]:
            del self._keys[name]
            self._owners.pop(name, None)

    def forget_tenant(self, tenant: str) -> None:
        """Drop every key held (they do not say their tenant): the next `load` asks the key store again.
        A tenant's erasure is rare; a cache refilled is cheap."""
        self._keys.clear()
        self._owners.clear()

    def _hold(self, name: KeyName, key: DataKey | Misbound) -> None:
        """Keep `key` as the most recently used, forgetting the least recently used beyond the capacity."""
        self._keys[name] = key
        self._keys.move_to_end(name)
        while len(self._keys) > self._capacity:
            forgotten, _ = self._keys.popitem(last=False)
            self._owners.pop(forgotten, None)

    def erase_tenant(self, tenant: str) -> None:
        self._erased_tenants.add(tenant)
