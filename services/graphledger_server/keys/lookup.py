"""The data keys a reader of the log opens sealed events with (projector, replay, read API, `dlq`).

A batch's keys are fetched from the key store before any record is decoded, by the references its
records' `gl-subject` headers name (and the fresh keys their `gl-key` headers name), and kept (least
recently used first out) until an erasure of their subject applies: from then on the subject's records
are erased, whatever key was cached. Without a key store (no key-encryption keys configured) no sealed
event opens. Each key is held with its owner, the tenant the key store made it for, so a reader can
refuse a record sealed for a subject of another tenant (`opening/admission.py`).

Fetching a fresh key binds nothing: anyone who reads the log sees the key ids its headers name, and
anyone who can produce can name one beside any subject. A fresh key bound to no subject yet is held as a
*candidate* of the `(reference, key id)` that named it: it opens that subject's records, and the reader
binds it (`bind`, one key store call for a batch) only for the names a record actually opened with
(`opening/binding.py`); a record that named it and did not open binds nothing and is dead-lettered.
The key store's first binding wins, so a candidate that lost a race (bound meanwhile to another
subject, or destroyed with an erased one) opens nothing after all and its records are decoded again. A
fresh key bound to another subject opens nothing (`MISBOUND`); one destroyed before any record opened
with it (its tenant erased) is `UNCLAIMED`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from graphledger.erasure.sealing import (
    ERASED,
    MISBOUND,
    UNCLAIMED,
    DataKey,
    Erased,
    Misbound,
    SealedSubject,
    cipher_of,
)
from graphledger_server.keys.key_store import KeyStore

KeyName = tuple[str, str | None]
"""A sealed record's key: its subject's reference, and the fresh key it names (None: the subject's own)."""

CAPACITY = 100_000
"""Keys kept: a cipher is about 1 KiB, so at most ~100 MiB."""
LOAD_TRIES = 5
"""Loads in a row that may each see held keys dropped while they awaited the key store."""


class KeysDroppedError(RuntimeError):
    """Held keys were dropped during every try of a load (erasures or restarts read meanwhile, non-stop)."""


def name_opens(key: DataKey | Misbound | None) -> bool:
    """Whether a held key opens records (a key, not `ERASED`, `MISBOUND` or nothing)."""
    return key is not None and not isinstance(key, Erased | Misbound)


@dataclass(eq=False)
class _Asking:
    """The subjects of one load or bind awaiting the key store; `dropped` once a reader forgot one of them."""

    refs: frozenset[str]
    dropped: bool = False


class DataKeyCache:
    def __init__(self, store: KeyStore | None, capacity: int = CAPACITY) -> None:
        self._store = store
        self._capacity = capacity
        self._keys: OrderedDict[KeyName, DataKey | Misbound] = OrderedDict()
        self._owners: dict[KeyName, str] = {}
        self._candidates: set[KeyName] = set()
        """Names held with a fresh key bound to no subject yet: bound once a record opens with it (`bind`)."""
        self._erased_tenants: set[str] = set()
        self._asking: set[_Asking] = set()
        """The loads and binds awaiting the key store. Readers share the cache (the read API's reads and its
        follow task), so one may forget keys (`forget`, `forget_all`) while another awaits an answer that
        may predate the erasure that made it forget: a load or bind whose subjects' keys were dropped
        meanwhile fetches them again (`_fetch_settled`), so no record is opened with a key dropped
        meanwhile, nor without the key it loaded (that would dead-letter it)."""

    async def load(self, names: Iterable[KeyName]) -> None:
        """Fetch the keys of `names` not held yet, binding none, and the owners of those held without one;
        on return they are held as the key store has them (raises what the key store raises, and
        KeysDroppedError: the batch retries)."""
        if self._store is None:
            return
        names = set(names)
        await self._fetch_settled(names, {name for name in names if name not in self._keys})

    async def _fetch_settled(self, names: set[KeyName], fetch: set[KeyName]) -> None:
        """Fetch the keys of `fetch` and the owners of `names`; again, with the names of `names` dropped
        meanwhile, while a reader forgot a subject of `names` (or every key) during the key store's answer."""
        with self._asking_for(names) as asking:
            for _ in range(LOAD_TRIES):
                asking.dropped = False
                await self._fetch(fetch)
                await self._load_owners(names)
                if not asking.dropped:
                    return
                fetch |= {name for name in names if name not in self._keys}
        raise KeysDroppedError(f"held data keys were dropped during each of {LOAD_TRIES} loads in a row")

    async def _fetch(self, names: set[KeyName]) -> None:
        """Hold the key store's answer for each of `names` (a name it does not know: not held)."""
        assert self._store is not None
        if own := {ref for ref, key_id in names if key_id is None}:
            found_own = await self._store.find(own)
            for ref in own:
                if (key := found_own.get(ref)) is None:
                    self._drop((ref, None))
                else:
                    self._keep((ref, None), ERASED if isinstance(key, Erased) else cipher_of(key))
        if fresh := {(ref, key_id) for ref, key_id in names if key_id is not None}:
            issued = await self._store.fresh({key_id for _, key_id in fresh})
            for ref, key_id in fresh:
                self._candidates.discard((ref, key_id))
                if (found := issued.get(key_id)) is None:
                    self._drop((ref, key_id))
                    continue
                self._owners[(ref, key_id)] = found.tenant  # as `owners` answers: no query of its own
                if found.ref is None:
                    self._keep((ref, key_id), UNCLAIMED if isinstance(found.key, Erased) else cipher_of(found.key))
                    if not isinstance(found.key, Erased):
                        self._candidates.add((ref, key_id))
                elif found.ref != ref:
                    self._keep((ref, key_id), MISBOUND)
                else:
                    self._keep((ref, key_id), ERASED if isinstance(found.key, Erased) else cipher_of(found.key))

    async def _load_owners(self, names: Iterable[KeyName]) -> None:
        assert self._store is not None
        opened = [name for name in names if name not in self._owners and name_opens(self._keys.get(name))]
        if not opened:
            return
        by_ref, by_id = await self._store.owners(
            {ref for ref, key_id in opened if key_id is None}, {key_id for _, key_id in opened if key_id is not None}
        )
        for ref, key_id in opened:
            owner = by_ref.get(ref) if key_id is None else by_id.get(key_id)
            if owner is not None:
                self._owners[(ref, key_id)] = owner

    def is_candidate(self, name: KeyName) -> bool:
        """Whether `name` is held with a fresh key bound to no subject yet (a record opening with it binds it)."""
        return name in self._candidates

    async def bind(self, opened: Collection[KeyName]) -> set[KeyName]:
        """Bind the fresh keys of `opened`, names a record OPENED with (never names records merely carry),
        to their subjects, unless they are bound already; returns the names whose key is not theirs after
        all (bound meanwhile to another subject, destroyed with an erased one, or unknown): the records
        that opened with them must be decoded again. Raises what the key store raises."""
        unsettled: set[tuple[str, str]] = {
            (ref, key_id)
            for ref, key_id in opened
            if key_id is not None and ((ref, key_id) in self._candidates or (ref, key_id) not in self._keys)
        }
        if unsettled and self._store is not None:
            with self._asking_for(opened) as asking:
                await self._bind(unsettled)
            if asking.dropped:  # the answers may predate what made another reader drop keys: ask again
                await self._fetch_settled(set(opened), unsettled | {name for name in opened if name not in self._keys})
        return {name for name in opened if name[1] is not None and not name_opens(self._keys.get(name))}

    async def _bind(self, unsettled: set[tuple[str, str]]) -> None:
        """Bind `unsettled` in the key store and hold what it answers for each."""
        assert self._store is not None
        bound = await self._store.bind_fresh(unsettled)
        for name in unsettled:
            self._candidates.discard(name)
            found = bound.get(name)
            if found is None:
                self._drop(name)
            else:
                self._keep(name, found if isinstance(found, Erased | Misbound) else cipher_of(found))
        won = {key_id: ref for ref, key_id in unsettled if name_opens(self._keys.get((ref, key_id)))}
        for other in [(ref, key_id) for ref, key_id in self._candidates if key_id in won and won[key_id] != ref]:
            self._candidates.discard(other)  # named beside another subject than the one it is bound to now
            self._keep(other, MISBOUND)
        await self._load_owners(unsettled)

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
        self._keep((ref, None), ERASED)

    def forget(self, ref: str) -> None:
        """Drop what is held of the subject `ref`: its next `load` asks the key store again."""
        for asking in self._asking:
            asking.dropped = asking.dropped or ref in asking.refs
        for name in [name for name in self._keys if name[0] == ref]:
            self._drop(name)

    def forget_tenant(self, tenant: str) -> None:
        """Drop every key held (they do not say their tenant): the next `load` asks the key store again.
        A tenant's erasure is rare; a cache refilled is cheap."""
        self.forget_all()

    def forget_all(self) -> None:
        """Drop every key held: the next `load` asks the key store again."""
        for asking in self._asking:
            asking.dropped = True
        self._keys.clear()
        self._owners.clear()
        self._candidates.clear()

    @contextmanager
    def _asking_for(self, names: Iterable[KeyName]) -> Iterator[_Asking]:
        asking = _Asking(frozenset(ref for ref, _ in names))
        self._asking.add(asking)
        try:
            yield asking
        finally:
            self._asking.discard(asking)

    def _keep(self, name: KeyName, key: DataKey | Misbound) -> None:
        """Keep `key` as the most recently used, forgetting the least recently used beyond the capacity."""
        self._keys[name] = key
        self._keys.move_to_end(name)
        while len(self._keys) > self._capacity:
            forgotten, _ = self._keys.popitem(last=False)
            self._owners.pop(forgotten, None)
            self._candidates.discard(forgotten)

    def _drop(self, name: KeyName) -> None:
        self._keys.pop(name, None)
        self._owners.pop(name, None)
        self._candidates.discard(name)

    def erase_tenant(self, tenant: str) -> None:
        self._erased_tenants.add(tenant)
