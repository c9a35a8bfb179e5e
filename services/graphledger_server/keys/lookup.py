"""The data keys a reader of the log opens sealed events with (projector, replay, `dlq`).

A batch's keys are fetched from the key store before any record is decoded, by the references its
records' `gl-subject` headers name, and kept (least recently used first out) until an erasure of their
subject applies: from then on the subject's records are erased, whatever key was cached. Without a key
store (no key-encryption keys configured) no sealed event opens.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from graphledger.sealing import ERASED, DataKey, Erased, SealedSubject, cipher_of
from graphledger_server.keys.store import KeyStore

CAPACITY = 100_000
"""Keys kept: a cipher is about 1 KiB, so at most ~100 MiB."""


class DataKeyCache:
    def __init__(self, store: KeyStore | None, capacity: int = CAPACITY) -> None:
        self._store = store
        self._capacity = capacity
        self._keys: OrderedDict[str, DataKey] = OrderedDict()
        self._erased_tenants: set[str] = set()

    async def load(self, refs: Iterable[str]) -> None:
        """Fetch the keys of `refs` not held yet (raises what the key store raises: the batch retries)."""
        missing = {ref for ref in refs if ref not in self._keys}
        if missing and self._store is not None:
            for ref, key in (await self._store.find(missing)).items():
                self._hold(ref, ERASED if isinstance(key, Erased) else cipher_of(key))

    def get(self, ref: str) -> DataKey | None:
        key = self._keys.get(ref)
        if key is not None:
            self._keys.move_to_end(ref)
        return key

    def is_erased(self, subject: SealedSubject) -> bool:
        """Whether an erasure of the subject (or its tenant) applied since its event was decoded."""
        return self._keys.get(subject.ref) is ERASED or subject.tenant in self._erased_tenants

    def erase(self, ref: str) -> None:
        self._hold(ref, ERASED)

    def _hold(self, ref: str, key: DataKey) -> None:
        """Keep `key` as the most recently used, forgetting the least recently used beyond the capacity."""
        self._keys[ref] = key
        self._keys.move_to_end(ref)
        while len(self._keys) > self._capacity:
            self._keys.popitem(last=False)

    def erase_tenant(self, tenant: str) -> None:
        self._erased_tenants.add(tenant)
