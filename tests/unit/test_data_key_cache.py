"""The data keys a reader of the log opens sealed events with (`graphledger_server.keys.lookup`),
against an in-memory key store: fetched once, least recently used out first, erasures final; fresh keys
bound only to the subject of a record that opened with them (`opening/binding.py`)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, cast

import pytest

from graphledger.erasure.sealing import (
    ERASED,
    MISBOUND,
    UNCLAIMED,
    Erased,
    Misbound,
    SealedSubject,
    cipher_of,
    new_data_key,
    seal,
    unseal,
)
from graphledger.events import Event, envelope, to_envelope
from graphledger.events.checkpoint import ThreadDelete
from graphledger.log.records import LogRecord
from graphledger.opening.admission import admitted
from graphledger.opening.records import Classified, DeadLetter, Decoded, classify, key_name
from graphledger.opening.records import Erased as ErasedRecord
from graphledger_server.keys.key_store import IssuedFreshKey
from graphledger_server.keys.lookup import LOAD_TRIES, DataKeyCache, KeysDroppedError, name_opens
from graphledger_server.opening.binding import bind_opened
from graphledger_server.projection.checkpoints import CheckpointProjection
from projection_helpers import TOPIC, put

if TYPE_CHECKING:
    from graphledger_server.keys.key_store import KeyStore


class FakeKeyStore:
    """`KeyStore.find`: the keys that exist among the refs asked for, unwrapped, or `ERASED`."""

    def __init__(self, keys: dict[str, bytes | Erased], fresh: dict[str, bytes | Erased] | None = None) -> None:
        self.keys = keys
        self.asked: list[set[str]] = []
        self.issued = fresh or {}
        """Fresh keys by id (`ERASED`: destroyed); `bound` their subjects once bound."""
        self.bound: dict[str, str] = {}
        self.binds: list[set[tuple[str, str]]] = []
        """What each `bind_fresh` call was asked to bind."""
        self.owners_asked: list[tuple[set[str], set[str]]] = []
        self.meanwhile: list[Callable[[], None]] = []
        """What other readers of the cache do while a call's answer, made, travels back (one each call)."""

    def _await(self) -> None:
        if self.meanwhile:
            self.meanwhile.pop(0)()

    async def find(self, refs: Collection[str]) -> dict[str, bytes | Erased]:
        self.asked.append(set(refs))
        answer = {ref: self.keys[ref] for ref in refs if ref in self.keys}
        self._await()
        return answer

    async def owners(self, refs: Collection[str], key_ids: Collection[str]) -> tuple[dict[str, str], dict[str, str]]:
        """Every key is tenant acme's, but for a ref or id that starts with another tenant's name and a colon."""
        self.owners_asked.append((set(refs), set(key_ids)))
        self._await()
        return {ref: _tenant_of(ref) for ref in refs}, {key_id: _tenant_of(key_id) for key_id in key_ids}

    async def fresh(self, key_ids: Collection[str]) -> dict[str, IssuedFreshKey]:
        answer = {
            k: IssuedFreshKey(self.issued[k], self.bound.get(k), _tenant_of(k)) for k in key_ids if k in self.issued
        }
        self._await()
        return answer

    async def bind_fresh(self, opened: Collection[tuple[str, str]]) -> dict[tuple[str, str], bytes | Erased | Misbound]:
        self.binds.append(set(opened))
        found: dict[tuple[str, str], bytes | Erased | Misbound] = {}
        for ref, key_id in sorted(opened):
            if key_id not in self.issued:
                continue
            bound = self.bound.setdefault(key_id, ref)
            if self.keys.get(bound) is ERASED:
                self.issued[key_id] = ERASED  # binding to an erased subject destroys the key
            key = self.issued[key_id]
            found[(ref, key_id)] = MISBOUND if bound != ref else key
        self._await()
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


async def test_keys_dropped_by_another_reader_while_a_load_awaited_are_held_when_it_returns() -> None:
    """The read API's follow task restarts a partition (every key dropped) while a read awaits the key
    store: the read must not open its records without the keys it loaded (a dead letter to it)."""
    store = FakeKeyStore({"a": new_data_key()}, fresh={"k1": new_data_key()})
    cache = cache_of(store)
    names = [*own("a"), ("b", "k1")]
    store.meanwhile = [lambda: None, lambda: None, cache.forget_all]  # during the owners' query
    await cache.load(names)
    assert all(name_opens(cache.get(*name)) for name in names) and cache.is_candidate(("b", "k1"))
    store.meanwhile = [cache.forget_all] * LOAD_TRIES * 3
    cache.forget_all()
    with pytest.raises(KeysDroppedError):
        await cache.load(names)


async def test_a_fresh_key_dropped_while_its_binding_awaited_is_bound_not_lost() -> None:
    store = FakeKeyStore({}, fresh={"k1": new_data_key()})
    cache = cache_of(store)
    await cache.load([("a", "k1")])
    store.meanwhile = [cache.forget_all, cache.forget_all]  # while it is bound, and its owner asked again
    assert await cache.bind([("a", "k1")]) == set()
    assert store.bound == {"k1": "a"} and name_opens(cache.get("a", "k1")) and cache.owner(("a", "k1")) == "acme"


async def test_a_subject_erased_while_its_load_awaited_is_erased_when_it_returns() -> None:
    store = FakeKeyStore({"a": new_data_key(), "b": new_data_key()})
    cache = cache_of(store)

    def erased(ref: str) -> Callable[[], None]:
        def meanwhile() -> None:  # recorded in the key store, then its record read by another reader
            store.keys[ref] = ERASED
            cache.forget(ref)

        return meanwhile

    store.meanwhile = [erased("a")]  # the find's answer, the live key, predates the erasure
    await cache.load(own("a"))
    assert cache.get("a") is ERASED
    store.meanwhile = [lambda: None, erased("b")]  # during the owners' query
    await cache.load(own("b"))
    assert cache.get("b") is ERASED


async def test_another_subject_forgotten_while_a_load_awaited_asks_nothing_again() -> None:
    """An erasure read in the read API's follow task costs the reads of other subjects nothing."""
    store = FakeKeyStore({"a": new_data_key(), "b": new_data_key()})
    cache = cache_of(store)
    await cache.load(own("b"))
    store.meanwhile = [lambda: cache.forget("b")]
    await cache.load(own("a"))
    assert store.asked == [{"b"}, {"a"}] and name_opens(cache.get("a"))


async def test_a_fresh_key_whose_subject_was_erased_while_its_binding_awaited_opens_nothing() -> None:
    store = FakeKeyStore({"a": new_data_key()}, fresh={"k1": new_data_key()})
    cache = cache_of(store)
    await cache.load([("a", "k1")])

    def erased_meanwhile() -> None:  # binding answered the live key; then the erasure destroyed it, and was read
        store.keys["a"] = ERASED
        store.issued["k1"] = ERASED
        cache.forget("a")

    store.meanwhile = [erased_meanwhile]
    assert await cache.bind([("a", "k1")]) == {("a", "k1")}
    assert cache.get("a", "k1") is ERASED


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


async def test_a_fresh_key_is_fetched_as_a_candidate_binding_nothing_until_a_record_opened_with_it() -> None:
    raw = new_data_key()
    store = FakeKeyStore({}, fresh={"k1": raw})
    cache = cache_of(store)
    sealed = seal(to_envelope(ThreadDelete("acme/a")), subject("a"), cipher_of(raw), "k1")
    await cache.load([("a", "k1"), ("b", "k1")])  # two records name it, for two subjects
    assert (store.bound, store.binds) == ({}, [])
    assert cache.is_candidate(("a", "k1")) and cache.is_candidate(("b", "k1"))
    key = cache.get("a", "k1")
    assert key is not None and not isinstance(key, Erased | Misbound)
    assert unseal(sealed, key)[0].payload == {"thread_id": "acme/a"}
    assert await cache.bind([("a", "k1")]) == set()  # a's record opened with it
    assert store.bound == {"k1": "a"} and not cache.is_candidate(("a", "k1"))
    assert cache.owner(("a", "k1")) == "acme"
    assert cache.get("b", "k1") is MISBOUND  # the name beside another subject: the key is a's now
    assert await cache.bind([("b", "k1")]) == {("b", "k1")}  # had b's record opened too (its holder sealed both)
    assert await cache.bind([("a", "k1")]) == set() and len(store.binds) == 1  # settled: not asked again
    await cache.load([("c", "k1")])  # a record of another subject naming the key once it is bound
    assert cache.get("c", "k1") is MISBOUND


async def test_a_candidate_bound_to_another_subject_meanwhile_is_misbound_after_all() -> None:
    store = FakeKeyStore({}, fresh={"k1": new_data_key()})
    cache = cache_of(store)
    await cache.load([("a", "k1")])
    store.bound["k1"] = "b"  # another reader (a replay, the read API) bound it first
    assert await cache.bind([("a", "k1")]) == {("a", "k1")}
    assert cache.get("a", "k1") is MISBOUND and not cache.is_candidate(("a", "k1"))


async def test_a_candidate_of_a_subject_erased_meanwhile_is_destroyed_by_its_binding() -> None:
    store = FakeKeyStore({}, fresh={"k1": new_data_key()})
    cache = cache_of(store)
    await cache.load([("a", "k1")])
    store.keys["a"] = ERASED
    assert await cache.bind([("a", "k1")]) == {("a", "k1")}
    assert cache.get("a", "k1") is ERASED and store.issued["k1"] is ERASED


async def test_a_fresh_key_destroyed_unbound_is_unclaimed_and_binds_nothing() -> None:
    store = FakeKeyStore({}, fresh={"k1": ERASED})  # its tenant was erased before any record opened with it
    cache = cache_of(store)
    await cache.load([("a", "k1")])
    assert cache.get("a", "k1") is UNCLAIMED and not cache.is_candidate(("a", "k1"))
    record = _sealed_record(ThreadDelete("acme/a"), subject("a"), new_data_key(), "k1")
    found = classify(record, CheckpointProjection("gl").to_event, cache.get)
    assert isinstance(found, ErasedRecord) and found.kind is None  # skipped; it stands for no erasure
    assert store.bound == {}


def _sealed_record(
    event: Event, sealed_for: SealedSubject, raw: bytes, key_id: str | None, offset: int = 0
) -> LogRecord:
    env = seal(to_envelope(event), sealed_for, cipher_of(raw), key_id)
    headers = tuple(envelope.headers_for(env))
    return LogRecord(TOPIC, 0, offset, b"key", envelope.encode(env), headers, env.produced_ms)


async def _classified(cache: DataKeyCache, records: list[LogRecord]) -> list[Classified]:
    """What the projector's `BatchApplier.classify` does with a batch's keys: load, decode, bind."""
    to_event = CheckpointProjection("gl").to_event
    await cache.load({name for r in records if (name := key_name(r)) is not None})

    def again(i: int) -> Classified:
        return admitted(classify(records[i], to_event, cache.get), cache.owner)

    return await bind_opened([again(i) for i in range(len(records))], cache, again)


async def test_a_record_naming_a_fresh_key_it_does_not_open_with_binds_nothing_and_is_a_dead_letter() -> None:
    victim_key = new_data_key()
    store = FakeKeyStore({}, fresh={"k1": victim_key})
    cache = cache_of(store)
    forged = _sealed_record(put("evil/t", 1), subject("e", "evil"), new_data_key(), "k1")
    genuine = _sealed_record(put("acme/a", 1), subject("a"), victim_key, "k1", offset=1)
    [letter] = await _classified(cache, [forged])
    assert isinstance(letter, DeadLetter) and "does not open with fresh key k1" in letter.reason
    assert (store.bound, store.binds) == ({}, [])
    [applied] = await _classified(cache, [genuine])
    assert isinstance(applied, Decoded) and applied.key_id == "k1"
    assert store.bound == {"k1": "a"}
    [again] = await _classified(cache, [forged])  # once bound, a record naming it for another subject
    assert isinstance(again, DeadLetter) and "bound to another subject" in again.reason


async def test_in_one_batch_a_forged_record_before_the_genuine_one_changes_nothing() -> None:
    victim_key = new_data_key()
    store = FakeKeyStore({}, fresh={"k1": victim_key})
    cache = cache_of(store)
    forged = _sealed_record(put("acme/a", 9), subject("e"), new_data_key(), "k1")
    genuine = _sealed_record(put("acme/a", 1), subject("a"), victim_key, "k1", offset=1)
    letter, applied = await _classified(cache, [forged, genuine])
    assert isinstance(letter, DeadLetter) and isinstance(applied, Decoded)
    assert store.binds == [{("a", "k1")}] and store.bound == {"k1": "a"}


async def test_records_that_opened_with_a_key_another_subject_won_are_decoded_again() -> None:
    key = new_data_key()
    store = FakeKeyStore({}, fresh={"k1": key})
    cache = cache_of(store)
    first = _sealed_record(put("acme/a", 1), subject("a"), key, "k1")
    second = _sealed_record(put("acme/b", 1), subject("b"), key, "k1", offset=1)  # its holder sealed both
    one, other = await _classified(cache, [first, second])
    assert store.bound == {"k1": "a"}  # the key store's first binding wins (here: the first asked)
    assert isinstance(one, Decoded)
    assert isinstance(other, DeadLetter) and "bound to another subject than b" in other.reason


async def test_admission_asks_the_owner_of_the_key_a_record_opened_with_not_the_one_its_headers_name() -> None:
    store = FakeKeyStore({"evil:e": new_data_key()}, fresh={"acme-key": new_data_key()})
    cache = cache_of(store)
    raw = store.keys["evil:e"]
    assert isinstance(raw, bytes)
    env = seal(to_envelope(put("acme/a", 1)), SealedSubject("evil:e", "thread", "acme", "acme/a"), cipher_of(raw))
    headers = ((envelope.HEADER_SUBJECT, b"a"), (envelope.HEADER_KEY, b"acme-key"))  # an acme key's name
    record = LogRecord(TOPIC, 0, 0, b"key", envelope.encode(env), headers, env.produced_ms)
    await cache.load([("evil:e", None)])  # held from an earlier record of evil's
    [refused] = await _classified(cache, [record])
    assert isinstance(refused, DeadLetter) and "another tenant than its key's" in refused.reason


async def test_an_erased_subject_erases_its_fresh_keys_too() -> None:
    store = FakeKeyStore({"a": ERASED}, fresh={"k1": new_data_key()})
    cache = cache_of(store)
    await cache.load([("a", None), ("a", "k1")])
    assert cache.get("a", "k1") is ERASED
    cache = cache_of(FakeKeyStore({}, fresh={"k2": new_data_key()}))
    await cache.load([("c", "k2")])
    cache.erase("c")  # the erasure applied after the key was loaded
    assert cache.get("c", "k2") is ERASED


async def test_a_fresh_keys_owner_comes_with_it_and_costs_no_query_of_its_own() -> None:
    """A batch of new threads opens with fresh keys: their owners come with the keys (`KeyStore.fresh`),
    one key-store round trip fewer per batch than asking `owners` after."""
    store = FakeKeyStore({"own": new_data_key()}, fresh={"k1": new_data_key(), "evil:k2": new_data_key()})
    cache = cache_of(store)
    await cache.load([("a", "k1"), ("b", "evil:k2"), ("own", None)])
    assert cache.owner(("a", "k1")) == "acme" and cache.owner(("b", "evil:k2")) == "evil"
    assert cache.owner(("own", None)) == "acme"
    assert store.owners_asked == [({"own"}, set())], "asked only for the key that is not fresh"
