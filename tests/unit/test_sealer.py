"""The client's sealing of events (`graphledger.erasure.sealer`) against an in-memory key source: keys
fetched once per subject and TTL, concurrent fetches coalesced, erased subjects refused, a bounded
cache."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from graphledger.erasure import sealer as sealer_module
from graphledger.erasure.fresh_keys import FreshKeyPool
from graphledger.erasure.sealer import EventSealer, TenantHashing
from graphledger.erasure.sealing import (
    ERASED,
    Cipher,
    DataKey,
    cipher_of,
    new_data_key,
    sealed_key_id,
    sealed_ref,
    unseal,
)
from graphledger.erasure.subjects import Subject, record_key, reference, thread_record_key, thread_subject
from graphledger.errors import SubjectErasedError
from graphledger.events.checkpoint import RunsDelete, ThreadDelete
from graphledger.events.envelope import Envelope
from manual_clock import ManualClock
from polling import wait_for

TENANT = "acme"
TTL_S = 60.0
HASH_KEY = b"\x07" * 32


class FakeKeySource:
    """Keys made on first use, as the key store does; `gate` holds data-key answers back while clear."""

    def __init__(self) -> None:
        self.keys: dict[str, DataKey] = {}
        self.erased_tenants: set[str] = set()
        self.tenant_calls = 0
        self.data_calls: list[list[str]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.asked = asyncio.Event()
        """Set once a data-key request came in."""
        self.failure: Exception | None = None

    async def tenant_hashing(self, tenant: str) -> TenantHashing:
        self.tenant_calls += 1
        if tenant in self.erased_tenants:
            raise SubjectErasedError(f"tenant {tenant!r} was erased")
        return TenantHashing(HASH_KEY, 2)

    async def data_keys(self, tenant: str, subjects: Sequence[tuple[str, Subject]]) -> dict[str, DataKey]:
        self.data_calls.append([ref for ref, _ in subjects])
        self.asked.set()
        await self.gate.wait()
        if self.failure is not None:
            raise self.failure
        return {ref: self.keys.setdefault(ref, cipher_of(new_data_key())) for ref, _ in subjects}


def ref_of(thread: str) -> str:
    return reference(HASH_KEY, thread_subject(TENANT, thread))


async def seal(sealer: EventSealer, thread: str) -> Envelope:
    return (await sealer.seal(ThreadDelete(thread), TENANT))[1]


async def asked(source: FakeKeySource) -> None:
    """Until the source was asked for data keys."""
    async with asyncio.timeout(5):
        await source.asked.wait()


async def test_a_sealed_event_carries_its_threads_record_key_and_opens_with_its_subjects_key() -> None:
    source = FakeKeySource()
    key, sealed = await EventSealer(source, TTL_S).seal(ThreadDelete("acme/t"), TENANT)
    assert key == thread_record_key(HASH_KEY, "acme/t")
    assert sealed_ref(sealed) == ref_of("acme/t")
    opened, subject = unseal(sealed, source.keys[ref_of("acme/t")])  # type: ignore[arg-type]
    assert opened.payload == {"thread_id": "acme/t"}
    assert (subject.kind, subject.tenant, subject.name) == ("thread", TENANT, "acme/t")


async def test_an_event_of_no_subject_is_left_in_the_clear_without_asking_for_a_key() -> None:
    source = FakeKeySource()
    key, env = await EventSealer(source, TTL_S).seal(RunsDelete(("run-1",)), TENANT)
    assert (key, sealed_ref(env), source.data_calls) == (None, None, [])
    assert key == record_key(HASH_KEY, RunsDelete(("run-1",)))


async def test_keys_are_fetched_once_within_their_ttl_and_again_after_it() -> None:
    source, clock = FakeKeySource(), ManualClock()
    sealer = EventSealer(source, TTL_S, clock)
    await seal(sealer, "acme/t")
    clock.now += TTL_S - 1
    await seal(sealer, "acme/t")
    assert (source.tenant_calls, len(source.data_calls)) == (1, 1)
    clock.now += 1
    await seal(sealer, "acme/t")
    assert (source.tenant_calls, source.data_calls) == (2, [[ref_of("acme/t")], [ref_of("acme/t")]])


async def test_the_subjects_missing_in_one_loop_turn_are_fetched_in_one_request() -> None:
    source = FakeKeySource()
    sealer = EventSealer(source, TTL_S)
    await sealer.tenant_hashing(TENANT)
    threads = ["acme/a"] * 5 + ["acme/b"] * 5
    sealed = await asyncio.gather(*(seal(sealer, thread) for thread in threads))
    assert len(source.data_calls) == 1
    assert sorted(source.data_calls[0]) == sorted({ref_of("acme/a"), ref_of("acme/b")})
    assert [sealed_ref(env) for env in sealed] == [ref_of(thread) for thread in threads]


async def test_a_seal_waiting_for_a_fetch_in_flight_shares_it() -> None:
    source = FakeKeySource()
    sealer = EventSealer(source, TTL_S)
    source.gate.clear()
    first = asyncio.create_task(seal(sealer, "acme/t"))
    await asked(source)
    second = asyncio.create_task(seal(sealer, "acme/t"))
    await asyncio.sleep(0)  # one loop turn: the second seal runs up to its wait for the key
    assert not second.done()
    source.gate.set()
    await asyncio.gather(first, second)
    assert source.data_calls == [[ref_of("acme/t")]]


async def test_a_failed_fetch_fails_every_waiter_and_the_next_seal_asks_again() -> None:
    source = FakeKeySource()
    sealer = EventSealer(source, TTL_S)
    await sealer.tenant_hashing(TENANT)
    source.failure = ConnectionError("key store down")
    results = await asyncio.gather(seal(sealer, "acme/t"), seal(sealer, "acme/t"), return_exceptions=True)
    assert [str(r) for r in results] == ["key store down"] * 2
    source.failure = None
    await seal(sealer, "acme/t")
    assert len(source.data_calls) == 2


async def test_a_subject_the_source_answers_erased_is_refused_from_then_on_without_asking() -> None:
    source, clock = FakeKeySource(), ManualClock()
    source.keys[ref_of("acme/t")] = ERASED
    sealer = EventSealer(source, TTL_S, clock)
    with pytest.raises(SubjectErasedError, match="thread 'acme/t' was erased"):
        await seal(sealer, "acme/t")
    clock.now += 10 * TTL_S
    with pytest.raises(SubjectErasedError):
        await seal(sealer, "acme/t")
    assert len(source.data_calls) == 1
    await seal(sealer, "acme/other")  # other subjects are unaffected


async def test_a_subject_marked_erased_is_refused_although_its_key_is_cached() -> None:
    source = FakeKeySource()
    sealer = EventSealer(source, TTL_S)
    await seal(sealer, "acme/t")
    sealer.erased(ref_of("acme/t"))
    with pytest.raises(SubjectErasedError, match="thread 'acme/t' was erased"):
        await seal(sealer, "acme/t")
    assert len(source.data_calls) == 1


async def test_a_subject_marked_erased_while_its_key_is_fetched_stays_erased() -> None:
    source = FakeKeySource()
    sealer = EventSealer(source, TTL_S)
    source.gate.clear()
    in_flight = asyncio.create_task(seal(sealer, "acme/t"))
    await asked(source)
    sealer.erased(ref_of("acme/t"))  # the key answered next was read before the erasure
    source.gate.set()
    with pytest.raises(SubjectErasedError):
        await in_flight
    with pytest.raises(SubjectErasedError):
        await seal(sealer, "acme/t")


async def test_a_forgotten_tenant_is_asked_for_again_and_an_erased_one_refused() -> None:
    source = FakeKeySource()
    sealer = EventSealer(source, TTL_S)
    assert sealer.record_key_of_thread(TENANT, "acme/t") is None
    await seal(sealer, "acme/t")
    assert sealer.record_key_of_thread(TENANT, "acme/t") == thread_record_key(HASH_KEY, "acme/t").encode()
    source.erased_tenants.add(TENANT)
    await seal(sealer, "acme/t")  # cached: the erasure is learned at the TTL, or told
    sealer.forget_tenant(TENANT)
    assert sealer.record_key_of_thread(TENANT, "acme/t") is None
    with pytest.raises(SubjectErasedError, match="tenant 'acme' was erased"):
        await seal(sealer, "acme/t")
    assert source.tenant_calls == 2


async def test_the_cache_keeps_at_most_max_cached_keys_dropping_the_longest_cached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sealer_module, "MAX_CACHED_KEYS", 2)
    source = FakeKeySource()
    sealer = EventSealer(source, TTL_S)
    for thread in ("acme/a", "acme/b", "acme/c", "acme/c", "acme/b"):
        await seal(sealer, thread)
    assert len(source.data_calls) == 3
    await seal(sealer, "acme/a")
    assert source.data_calls[-1] == [ref_of("acme/a")]


async def test_a_subject_marked_erased_is_asked_for_again_once_dropped_from_a_full_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sealer_module, "MAX_CACHED_KEYS", 2)
    source = FakeKeySource()
    sealer = EventSealer(source, TTL_S)
    sealer.erased(ref_of("acme/x"))
    for thread in ("acme/a", "acme/b"):
        await seal(sealer, thread)
    source.keys[ref_of("acme/x")] = ERASED
    with pytest.raises(SubjectErasedError):
        await seal(sealer, "acme/x")
    assert source.data_calls[-1] == [ref_of("acme/x")]


async def test_a_cancelled_fetch_fails_every_waiter_of_every_tenant_it_had_not_reached() -> None:
    source = FakeKeySource()
    source.gate.clear()
    sealer = EventSealer(source, TTL_S)
    first = asyncio.create_task(sealer.seal(ThreadDelete("acme/t"), TENANT))
    second = asyncio.create_task(sealer.seal(ThreadDelete("beta/t"), "beta"))
    await asked(source)
    (fetch,) = sealer._fetches
    fetch.cancel()
    async with asyncio.timeout(5):
        results = await asyncio.gather(first, second, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results), results
    assert not sealer._fetches


class PooledKeySource(FakeKeySource):
    """Also hands out fresh keys, bound to no subject, as the read API does."""

    def __init__(self) -> None:
        super().__init__()
        self.issued = 0

    async def fresh_keys(self, tenant: str, count: int) -> list[tuple[str, Cipher]]:
        self.issued += count
        return [(f"fresh-{self.issued - i}", cipher_of(new_data_key())) for i in range(count)]


async def pooled(clock: ManualClock | None = None) -> tuple[PooledKeySource, EventSealer]:
    source = PooledKeySource()
    pool = FreshKeyPool(source, TENANT, 8)
    sealer = EventSealer(source, TTL_S, clock or ManualClock(), pool=pool)
    await sealer.tenant_hashing(TENANT)
    pool.fill()
    await wait_for(lambda: len(pool), "fresh keys", timeout_s=5, poll_s=0)
    return source, sealer


async def test_a_shared_thread_is_sealed_and_opened_with_its_own_key_from_then_on() -> None:
    source, sealer = await pooled()
    fresh = await seal(sealer, "acme/t")
    key_id = sealed_key_id(fresh)
    assert key_id is not None and sealer.opening_key(ref_of("acme/t"), key_id) is not None  # a new thread's
    asking = sealer.share(TENANT, "acme/t")
    assert asking is not None
    await asking
    shared = await seal(sealer, "acme/t")
    assert sealed_key_id(shared) is None
    unseal(shared, source.keys[ref_of("acme/t")])  # type: ignore[arg-type]  # other pods ask for this key
    assert sealer.opening_key(ref_of("acme/t"), None) is source.keys[ref_of("acme/t")]
    assert sealer.opening_key(ref_of("acme/t"), key_id) is None
    assert sealer.share(TENANT, "acme/t") is None  # held: nothing to ask


async def test_a_write_waits_for_the_threads_key_asked_for_and_goes_on_without_it_when_the_ask_fails() -> None:
    source, sealer = await pooled()
    source.gate.clear()
    sealer.share(TENANT, "acme/t")
    waiting = asyncio.create_task(seal(sealer, "acme/t"))
    await asked(source)
    assert not waiting.done()
    source.gate.set()
    assert sealed_key_id(await waiting) is None  # the thread's own key, not a fresh one
    source.failure = ConnectionError("read API down")
    sealer.share(TENANT, "acme/u")
    assert sealed_key_id(await seal(sealer, "acme/u")) is not None  # a fresh key, at once
    source.failure = None
    assert sealer.share(TENANT, "acme/u") is not None  # asked again


async def test_a_key_a_read_brought_is_sealed_with_and_asked_for_no_more_until_its_ttl() -> None:
    """A get answers the thread's own key (`X-Graphledger-Thread-Key`): adopted, it is what `share` would
    have asked for, so nothing is asked; wanted again past its TTL; never over an erasure."""
    clock = ManualClock()
    source, sealer = await pooled(clock)
    await seal(sealer, "acme/t")
    assert sealer.thread_key_wanted(TENANT, "acme/t")  # sealed with a fresh key of this process's only
    own = new_data_key()
    sealer.adopt(TENANT, "acme/t", own)
    assert not sealer.thread_key_wanted(TENANT, "acme/t")
    assert sealer.share(TENANT, "acme/t") is None
    sealed = await seal(sealer, "acme/t")
    assert sealed_key_id(sealed) is None
    unseal(sealed, cipher_of(own))
    assert source.data_calls == []
    clock.now += TTL_S
    assert sealer.thread_key_wanted(TENANT, "acme/t")
    sealer.erased(ref_of("acme/u"))
    sealer.adopt(TENANT, "acme/u", own)
    assert not sealer.thread_key_wanted(TENANT, "acme/u")
    with pytest.raises(SubjectErasedError):
        await seal(sealer, "acme/u")


async def test_a_key_past_its_ttl_opens_while_asked_for_again_until_the_answer_is_erased() -> None:
    clock = ManualClock()
    source, sealer = await pooled(clock)
    asking = sealer.share(TENANT, "acme/t")
    assert asking is not None
    await asking
    key = sealer.opening_key(ref_of("acme/t"), None)
    clock.now += TTL_S
    source.keys[ref_of("acme/t")] = ERASED  # erased meanwhile, which the next ask learns
    calls = len(source.data_calls)
    assert sealer.opening_key(ref_of("acme/t"), None) is key  # in use while asked again (an outage)
    await wait_for(lambda: len(source.data_calls) > calls, "the key asked for again", timeout_s=5, poll_s=0)
    await wait_for(lambda: sealer.opening_key(ref_of("acme/t"), None) is None, "the erasure", timeout_s=5, poll_s=0)
