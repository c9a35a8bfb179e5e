"""The data keys a reader of the log opens sealed events with (`graphledger_server.keys.lookup`),
against an in-memory key store: fetched once, least recently used out first, erasures final."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, cast

from graphledger.events import to_envelope
from graphledger.events.checkpoint import ThreadDelete
from graphledger.sealing import ERASED, Erased, SealedSubject, cipher_of, new_data_key, seal, unseal
from graphledger_server.keys.lookup import DataKeyCache

if TYPE_CHECKING:
    from graphledger_server.keys.store import KeyStore


class FakeKeyStore:
    """`KeyStore.find`: the keys that exist among the refs asked for, unwrapped, or `ERASED`."""

    def __init__(self, keys: dict[str, bytes | Erased]) -> None:
        self.keys = keys
        self.asked: list[set[str]] = []

    async def find(self, refs: Collection[str]) -> dict[str, bytes | Erased]:
        self.asked.append(set(refs))
        return {ref: self.keys[ref] for ref in refs if ref in self.keys}


def cache_of(store: FakeKeyStore, capacity: int = 100) -> DataKeyCache:
    return DataKeyCache(cast("KeyStore", store), capacity)


def subject(ref: str, tenant: str = "acme") -> SealedSubject:
    return SealedSubject(ref, "thread", tenant, f"{tenant}/{ref}")


async def test_a_loaded_key_opens_what_its_raw_key_sealed() -> None:
    raw = new_data_key()
    cache = cache_of(FakeKeyStore({"a": raw}))
    await cache.load(["a"])
    sealed = seal(to_envelope(ThreadDelete("acme/a")), subject("a"), cipher_of(raw))
    key = cache.get("a")
    assert key is not None and not isinstance(key, Erased)
    assert unseal(sealed, key)[0].payload == {"thread_id": "acme/a"}


async def test_load_asks_the_store_only_for_the_refs_not_held() -> None:
    store = FakeKeyStore({ref: new_data_key() for ref in "abc"})
    cache = cache_of(store)
    await cache.load(["a", "b", "a"])
    await cache.load(["a", "b", "c"])
    await cache.load(["c", "a"])
    assert store.asked == [{"a", "b"}, {"c"}]


async def test_a_ref_the_store_does_not_know_has_no_key_and_is_asked_for_again() -> None:
    store = FakeKeyStore({})
    cache = cache_of(store)
    await cache.load(["unknown"])
    assert cache.get("unknown") is None
    await cache.load(["unknown"])
    assert store.asked == [{"unknown"}, {"unknown"}]


async def test_a_key_the_store_holds_erased_is_erased() -> None:
    cache = cache_of(FakeKeyStore({"a": ERASED}))
    await cache.load(["a"])
    assert cache.get("a") is ERASED
    assert cache.is_erased(subject("a"))


async def test_the_cache_keeps_its_capacity_dropping_the_least_recently_used_key() -> None:
    store = FakeKeyStore({ref: new_data_key() for ref in "abc"})
    cache = cache_of(store, capacity=2)
    await cache.load(["a", "b"])
    assert cache.get("a") is not None  # a is now used more recently than b
    await cache.load(["c"])
    assert cache.get("b") is None
    assert cache.get("a") is not None and cache.get("c") is not None
    await cache.load(["b"])
    assert store.asked[-1] == {"b"}


async def test_an_applied_erasure_erases_its_subject_whatever_key_was_cached() -> None:
    cache = cache_of(FakeKeyStore({"a": new_data_key(), "b": new_data_key()}))
    await cache.load(["a", "b"])
    assert not cache.is_erased(subject("a"))
    cache.erase("a")
    assert cache.get("a") is ERASED
    assert cache.is_erased(subject("a"))
    assert not cache.is_erased(subject("b"))
    cache.erase("never-loaded")
    assert cache.is_erased(subject("never-loaded"))


async def test_an_applied_tenant_erasure_erases_every_subject_of_the_tenant_alone() -> None:
    cache = cache_of(FakeKeyStore({"a": new_data_key()}))
    await cache.load(["a"])
    cache.erase_tenant("acme")
    assert cache.is_erased(subject("a"))
    assert cache.is_erased(subject("not-loaded"))
    assert not cache.is_erased(subject("a", tenant="other"))


async def test_without_a_key_store_no_key_is_found() -> None:
    cache = DataKeyCache(None)
    await cache.load(["a"])
    assert cache.get("a") is None
