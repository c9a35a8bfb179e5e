"""The services' `DataKeySource`: the key store itself, with tenants' hashing keys cached for
`key_cache_ttl_s` (the read API hashes a thread's id on every read of it)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from graphledger.erasure.sealer import TenantHashing
from graphledger.erasure.sealing import ERASED, DataKey, Erased, cipher_of
from graphledger.erasure.subjects import Subject, item_record_key, thread_record_key
from graphledger.settings import Settings
from graphledger_server.keys.key_store import KeyStore


class StoreKeySource:
    def __init__(self, store: KeyStore, settings: Settings) -> None:
        self.store = store
        self._depth = settings.erasure_namespace_depth
        self._ttl_s = settings.key_cache_ttl_s
        self._tenants: dict[str, tuple[TenantHashing, float]] = {}

    async def tenant_hashing(self, tenant: str) -> TenantHashing:
        cached = self._tenants.get(tenant)
        if cached is not None and time.monotonic() < cached[1]:
            return cached[0]
        keys = TenantHashing(await self.store.hash_key(tenant), self._depth)
        self._tenants[tenant] = (keys, time.monotonic() + self._ttl_s)
        return keys

    async def data_keys(self, tenant: str, subjects: Sequence[tuple[str, Subject]]) -> dict[str, DataKey]:
        found = await self.store.data_keys(subjects)
        return {ref: ERASED if isinstance(key, Erased) else cipher_of(key) for ref, key in found.items()}

    def forget_tenant(self, tenant: str) -> None:
        self._tenants.pop(tenant, None)

    async def record_key_of_thread(self, tenant: str, stored_thread_id: str) -> bytes:
        """The record key of the thread's records."""
        return thread_record_key((await self.tenant_hashing(tenant)).hash_key, stored_thread_id).encode()

    async def item_key(self, tenant: str, stored_namespace: tuple[str, ...], item_key: str) -> bytes:
        return item_record_key((await self.tenant_hashing(tenant)).hash_key, stored_namespace, item_key).encode()
