"""The data keys a reader of the log opens sealed events with (`graphledger_server.keys.lookup`),
against an in-memory key store: fetched once, least recently used out first, erasures final."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, cast

from graphledger.erasure.sealing import (
    ERASED,
    MISBOUND,
    Erased,
    Misbound,
    SealedSubject,
    cipher_of,
    new_data_key,
    seal,
    unseal,
)
from graphledger.events import to_envelope
from graphledger.events.checkpoint import ThreadDelete
from graphledger_server.keys.lookup import DataKeyCache

if TYPE_CHECKING:
    from graphledger_server.keys.store import KeyStore


class FakeKeyStore:
    """`KeyStore.find`: the keys that exist among the refs asked for, unwrapped, or `ERASED`."""

    def __init__(self, keys: dict[str, bytes | Erased], fresh: dict[str, bytes] | None = None) -> None:
        self.keys = keys
        self.asked: list[set[str]] = []
        self.fresh = fresh or {}
        """`bind_fresh`: fresh keys by id; `bound` their subjects once bound."""
        self.bound: dict[str, str] = {}

    async def find(self, refs: Collection[str]) -> dict[str, bytes | Erased]:
        self.asked.append(set(refs))
        return {ref: self.keys[ref] for ref in refs if ref in self.keys}

    async def owners(self, refs: Collection[str], key_ids: Collection[str]) -> tuple[dict[str, str], dict[str, str]]:
        """Every key is tenant acme's, but for a ref or id that starts with another tenant's name and a colon."""
        return {ref: _tenant_of(ref) for ref in refs}, {key_id: _tenant_of(key_id) for key_id in key_ids}

    async def bind_fresh(self, named: Collection[tuple[str, str]]) -> dict[tuple[str, str], bytes | Erased | Misbound]:
        found: dict[tuple[str, str], bytes | Erased | Misbound] = {}
        for ref, key_id in named:
            if key_id not in self.fresh:
                continue
            bound = self.bound.setdefault(key_id, ref)
            if bound != ref:
                found[(ref, key_id)] = MISBOUND
            elif self.keys.get(ref) is ERASED:
                found[(ref, key_id)] = ERASED
            else:
                found[(ref, key_id)] = self.fresh[key_id]
        return found


def _tenant_of(name: str) -> str:
    return name.split(":", 1)[0] if ":" in name else "acme"


def own(*refs: str) -> list[tuple[str, None]]:
    """Key names of records sealed with their subjects' own keys."""
    return [(ref, None) for ref in refs]


def cache_of(store: FakeKeyStore, capacity: int = 100) -> DataKeyCache:
    return DataKeyCache(cast("KeyStore", store), capacity)


def subject(ref: str, tenant: str = "acme") -> SealedSubject:
    return SealedSubject(ref, "thread", tenant, f"{tenant}/{ref}")


async def test_a_loaded_key_opens_what_its_raw_key_sealed() -> None:
    raw = new_data_key()
    cache = cache_of(FakeKeyStore({"a": raw}))
    await cache.load(own("a"))
    sealed = seal(to_envelope(ThreadDelete("acme/a")), subject("a"), cipher_of(raw))
    key = cache.get("a")
    assert key is not None and not isinstance(key, Erased)
    assert unseal(sealed, key)[0].payload == {"thread_id": "acme/a"}


async def test_load_asks_the_store_only_for_the_refs_not_held() -> None:
    store = FakeKeyStore({ref: new_data_key() for ref in "abc"})
    cache = cache_of(store)
    await cache.load(own("a", "b", "a"))
    await cache.load(own("a", "b", "c"))
    await cache.load(own("c", "a"))
    assert store.asked == [{"a", "b"}, {"c"}]


async def test_a_held_key_says_which_tenant_the_key_store_made_it_for_until_it_is_dropped() -> None:
    store = FakeKeyStore({"a": new_data_key(), "evil:b": new_data_key(), "c": new_data_key()}, {"k": new_data_key()})
    cache = cache_of(store, capacity=3)
    await cache.load(own("a"))
    await cache.load([*own("evil:b"), ("evil:b", "k")])
    owners = [cache.owner(name) for name in [*own("a", "evil:b"), ("evil:b", "k")]]
    assert owners == ["acme", "evil", "acme"]  # a fresh key is its issuer's, whatever subject it names
    await cache.load(own("c"))  # beyond the capacity: the least recently used key goes, with its owner
    assert cache.owner(("a", None)) is None and cache.owner(("c", None)) == "acme"
    cache.forget("evil:b")
    assert cache.owner(("evil:b", None)) is None


async def test_a_ref_the_store_does_not_know_has_no_key_and_is_asked_for_again() -> None:
    store = FakeKeyStore({})
    cache = cache_of(store)
    await cache.load(own("unknown"))
    assert cache.get("unknown") is None
    await cache.load(own("unknown"))
    assert store.asked == [{"unknown"}, {"unknown"}]


async def test_a_key_the_store_holds_erased_is_erased() -> None:
    cache = cache_of(FakeKeyStore({"a": ERASED}))
    await cache.load(own("a"))
    assert cache.get("a") is ERASED
    assert cache.is_erased(subject("a"))


async def test_the_cache_keeps_its_capacity_dropping_the_least_recently_used_key() -> None:
    store = FakeKeyStore({ref: new_data_key() for ref in "abc"})
    cache = cache_of(store, capacity=2)
    await cache.load(own("a", "b"))
    assert cache.get("a") is not None  # a is now used more recently than b
    await cache.load(own("c"))
    assert cache.get("b") is None
    assert cache.get("a") is not None and cache.get("c") is not None
    await cache.load(own("b"))
    assert store.asked[-1] == {"b"}


async def test_an_applied_erasure_erases_its_subject_whatever_key_was_cached() -> None:
    cache = cache_of(FakeKeyStore({"a": new_data_key(), "b": new_data_key()}))
    await cache.load(own("a", "b"))
    assert not cache.is_erased(subject("a"))
    cache.erase("a")
    assert cache.get("a") is ERASED
    assert cache.is_erased(subject("a"))
    assert not cache.is_erased(subject("b"))
    cache.erase("never-loaded")
    assert cache.is_erased(subject("never-loaded"))


async def test_an_applied_tenant_erasure_erases_every_subject_of_the_tenant_alone() -> None:
    cache = cache_of(FakeKeyStore({"a": new_data_key()}))
    await cache.load(own("a"))
    cache.erase_tenant("acme")
    assert cache.is_erased(subject("a"))
    assert cache.is_erased(subject("not-loaded"))
    assert not cache.is_erased(subject("a", tenant="other"))


async def test_without_a_key_store_no_key_is_found() -> None:
    cache = DataKeyCache(None)
    await cache.load(own("a"))
    assert cache.get("a") is None


async def test_a_fresh_key_opens_the_records_of_the_subject_it_was_first_named_for() -> None:
    raw = new_data_key()
    store = FakeKeyStore({}, fresh={"k1": raw})
    cache = cache_of(store)
    sealed = seal(to_envelope(ThreadDelete("acme/a")), subject("a"), cipher_of(raw), "k1")
    await cache.load([("a", "k1")])
    key = cache.get("a", "k1")
    assert key is not None and not isinstance(key, Erased | Misbound)
    assert unseal(sealed, key)[0].payload == {"thread_id": "acme/a"}
    await cache.load([("b", "k1")])  # a record of another subject naming the same key
    assert cache.get("b", "k1") is MISBOUND


async def test_an_erased_subject_erases_its_fresh_keys_too() -> None:
    store = FakeKeyStore({"a": ERASED}, fresh={"k1": new_data_key()})
    cache = cache_of(store)
    await cache.load([("a", None), ("a", "k1")])
    assert cache.get("a", "k1") is ERASED
    cache = cache_of(FakeKeyStore({}, fresh={"k2": new_data_key()}))
    await cache.load([("c", "k2")])
    cache.erase("c")  # the erasure applied after the key was loaded
    assert cache.get("c", "k2") is ERASED
