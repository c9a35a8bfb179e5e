"""Events made ready for the log: record keys hashed and user content sealed with its subject's data
key (`subjects.py`, `sealing.py`), the keys fetched once and cached.

Clients fetch keys through the read API, services from the key store (`DataKeySource`). A key is asked
for again after `ttl_s`, which is when a writer learns of an erasure it did not see otherwise; a
subject known to be erased is refused at once (`SubjectErasedError`). Concurrent fetches are
coalesced: the subjects missing in one loop turn go out in one request.

With a `FreshKeyPool` (a client's), keys are off the write path: a new subject takes a fresh key from the
pool, and a key (or the tenant's hashing key) older than `ttl_s` stays in use while it is asked for
again in the background, so writes go on through an outage of the read API and Postgres. What a
writer publishes for a subject erased meanwhile is never readable (the projector skips it, and an
erasure destroys every key bound to the subject); it learns of the erasure at its next read of the
subject, or when the read API answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from graphledger.erasure.fresh_keys import FreshKeyPool
from graphledger.erasure.sealing import ERASED, Cipher, DataKey, Erased, SealedSubject, cipher_of, seal
from graphledger.erasure.subjects import Subject, record_key, reference, subject_of, thread_record_key, thread_subject
from graphledger.errors import SubjectErasedError
from graphledger.events import Event, to_envelope
from graphledger.events.envelope import Envelope

MAX_CACHED_KEYS = 100_000


@dataclass(frozen=True, slots=True)
class TenantHashing:
    """What a tenant's writers hash with, and the namespace depth of its store subjects."""

    hash_key: bytes
    namespace_depth: int


class DataKeySource(Protocol):
    async def tenant_hashing(self, tenant: str) -> TenantHashing:
        """The tenant's hashing key (created on first use); `SubjectErasedError` for an erased tenant."""
        ...

    async def data_keys(self, tenant: str, subjects: Sequence[tuple[str, Subject]]) -> dict[str, DataKey]:
        """The data key of every `(reference, subject)` (created on first use), `ERASED` for erased ones."""
        ...


@dataclass(slots=True)
class _Cached:
    key: DataKey
    fresh_until: float
    key_id: str | None = None
    """A fresh key from the pool, bound to the subject here (None: the subject's own key)."""
    asked_as: tuple[str, Subject] | None = None
    """The tenant and subject it is asked for again as, past its TTL."""


SHARE_WAIT_S = 1.0
"""How long a write of a thread waits for the thread's own key asked for by `share` before it seals with a
fresh key."""
RECHECK_S = 5.0
"""After a failed check of a key past its `ttl_s`, how long it is used before the next check."""


class EventSealer:
    """Seals events for one process, caching keys for `ttl_s` seconds (of `clock`). On one event loop."""

    def __init__(
        self,
        source: DataKeySource,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        pool: FreshKeyPool | None = None,
    ) -> None:
        self._source = source
        self.pool = pool
        self._ttl_s = ttl_s
        self._clock = clock
        self._tenants: dict[str, tuple[TenantHashing, float]] = {}
        self._keys: dict[str, _Cached] = {}
        self._wanted: dict[str, dict[str, Subject]] = {}
        self._pending: dict[str, asyncio.Future[DataKey]] = {}
        self._flush: asyncio.Handle | None = None
        self._fetches: set[asyncio.Task[None]] = set()
        self._sharing: set[str] = set()
        """Subjects whose own key is asked for to seal with from now on (`share`)."""

    async def seal(self, event: Event, tenant: str, envelope: Envelope | None = None) -> tuple[str | None, Envelope]:
        """`event`'s record key and sealed envelope (names as stored, of `tenant`); `envelope`: the
        event's own, when it is not a new one (an import keeps the source's times)."""
        keys = await self.tenant_hashing(tenant)
        envelope = envelope or to_envelope(event)
        subject = subject_of(event, tenant, keys.namespace_depth)
        if subject is None:
            return record_key(keys.hash_key, event), envelope
        ref = reference(keys.hash_key, subject)
        data_key, key_id = await self._data_key(tenant, ref, subject)
        sealed = seal(envelope, SealedSubject(ref, subject.kind, tenant, subject.name), data_key, key_id)
        return record_key(keys.hash_key, event), sealed

    async def tenant_hashing(self, tenant: str) -> TenantHashing:
        cached = self._tenants.get(tenant)
        if cached is not None and self._clock() < cached[1]:
            return cached[0]
        if cached is not None and self.pool is not None:
            self._recheck_tenant(tenant, cached[0])  # in use meanwhile: keys are off the write path
            return cached[0]
        keys = await self._source.tenant_hashing(tenant)
        self._tenants[tenant] = (keys, self._clock() + self._ttl_s)
        return keys

    def _recheck_tenant(self, tenant: str, keys: TenantHashing) -> None:
        self._tenants[tenant] = (keys, self._clock() + RECHECK_S)  # one check at a time

        async def recheck() -> None:
            try:
                fresh = await self._source.tenant_hashing(tenant)
            except SubjectErasedError:
                self._tenants.pop(tenant, None)  # the next seal asks, and is refused
            except Exception:  # the read API away: go on with the key held, ask again later
                pass
            else:
                self._tenants[tenant] = (fresh, self._clock() + self._ttl_s)

        self._background(recheck())

    def record_key_of_thread(self, tenant: str, stored_thread_id: str) -> bytes | None:
        """The record key of a thread's records, if the tenant's hashing key is at hand."""
        cached = self._tenants.get(tenant)
        return None if cached is None else thread_record_key(cached[0].hash_key, stored_thread_id).encode()

    def share(self, tenant: str, stored_thread_id: str) -> asyncio.Future[DataKey] | None:
        """Seal the thread with its own key from now on (asked for in the background), not with a fresh key
        of this process's: the other processes of the tenant that read the thread hold that key too, so each
        opens the others' records of it (`client/others_records.py`). A new thread keeps its fresh key until
        a process that did not write it reads it. Returns the ask in flight (None: nothing to wait for)."""
        named = self._thread_named(tenant, stored_thread_id)
        if named is None:
            return None
        ref, subject = named
        known = self._keys.get(ref)
        if known is not None and isinstance(known.key, Erased):
            return None
        if ref in self._sharing:
            return self._pending.get(ref)
        if known is not None and known.key_id is None and self._clock() < known.fresh_until:
            return None
        self._sharing.add(ref)
        return self._asked(tenant, ref, subject)

    def thread_key_wanted(self, tenant: str, stored_thread_id: str) -> bool:
        """Whether a read of the thread should ask for its own key beside its answer (`adopt`): `share` would
        ask for it (no key of the thread held, a fresh key of this process's, or one past its TTL)."""
        named = self._thread_named(tenant, stored_thread_id)
        if named is None:
            return False
        known = self._keys.get(named[0])
        if known is None:
            return True
        return not isinstance(known.key, Erased) and (known.key_id is not None or self._clock() >= known.fresh_until)

    def adopt(self, tenant: str, stored_thread_id: str, key: bytes) -> None:
        """The thread's own key as the read API answered it beside a read (`X-Graphledger-Thread-Key`): held and
        sealed with from now on, as `share` would."""
        named = self._thread_named(tenant, stored_thread_id)
        if named is None:
            return
        ref, subject = named
        known = self._keys.get(ref)
        if known is not None and isinstance(known.key, Erased):
            return
        self._sharing.discard(ref)  # an ask in flight answers the same key; writes need not wait for it
        self._remember(ref, _Cached(cipher_of(key), self._clock() + self._ttl_s, asked_as=(tenant, subject)))

    def _thread_named(self, tenant: str, stored_thread_id: str) -> tuple[str, Subject] | None:
        """The thread's subject and its reference, if the tenant's hashing key is at hand."""
        hashing = self._tenants.get(tenant)
        if hashing is None:
            return None
        subject = thread_subject(tenant, stored_thread_id)
        return reference(hashing[0].hash_key, subject), subject

    def opening_key(self, ref: str, key_id: str | None) -> Cipher | None:
        """The key a record of subject `ref` sealed with `key_id` (None: the subject's own) opens with, if this
        process holds it: checked within `ttl_s`, or, with a pool (a client's), past it while it is asked for
        again in the background, as writes use it (the answer `ERASED` ends its use)."""
        cached = self._keys.get(ref)
        if cached is None or isinstance(cached.key, Erased) or cached.key_id != key_id:
            return None
        now = self._clock()
        if now < cached.fresh_until:
            return cached.key
        if self.pool is None or cached.asked_as is None:
            return None
        cached.fresh_until = now + RECHECK_S  # one check at a time; in use meanwhile
        self._asked(cached.asked_as[0], ref, cached.asked_as[1])
        return cached.key

    def erased(self, ref: str) -> None:
        """Learned elsewhere (an erase call, a read) that the subject `ref` was erased."""
        self._remember(ref, _Cached(ERASED, float("inf")))

    def forget_tenant(self, tenant: str) -> None:
        self._tenants.pop(tenant, None)

    async def _data_key(self, tenant: str, ref: str, subject: Subject) -> tuple[Cipher, str | None]:
        """The key to seal the subject's event with, and the id of the fresh key it is (None: its own)."""
        if ref in self._sharing and (sharing := self._pending.get(ref)) is not None:
            # Its own key is on its way (`share`): wait for it rather than seal with a key of this process's
            # alone (the read API just answered), for at most `SHARE_WAIT_S`: writes go on through an outage.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(sharing), SHARE_WAIT_S)
        cached = self._keys.get(ref)
        now = self._clock()
        if cached is not None and not isinstance(cached.key, Erased) and self.pool is not None:
            if now >= cached.fresh_until:
                cached.fresh_until = now + RECHECK_S  # one check at a time; in use meanwhile
                self._asked(tenant, ref, subject)
            return cached.key, cached.key_id
        if cached is None and self.pool is not None and (fresh := self.pool.take()) is not None:
            key_id, key = fresh
            self._remember(ref, _Cached(key, now + self._ttl_s, key_id, (tenant, subject)))
            return key, key_id
        if cached is None or now >= cached.fresh_until:
            fetched = await asyncio.shield(self._asked(tenant, ref, subject))
        else:
            fetched = cached.key
        if fetched is ERASED or isinstance(fetched, Erased):
            raise SubjectErasedError(f"{subject.kind} {subject.name!r} was erased: nothing more is written for it")
        held = self._keys.get(ref)
        return fetched, held.key_id if held is not None and held.key is fetched else None

    def _asked(self, tenant: str, ref: str, subject: Subject) -> asyncio.Future[DataKey]:
        """The subject's key, asked for in this loop turn's request (coalesced)."""
        future = self._pending.get(ref)
        if future is None:
            loop = asyncio.get_running_loop()
            future = self._pending[ref] = loop.create_future()
            self._wanted.setdefault(tenant, {})[ref] = subject
            if self._flush is None:
                self._flush = loop.call_soon(self._start_fetch, loop)
        return future

    def _start_fetch(self, loop: asyncio.AbstractEventLoop) -> None:
        self._background(self._fetch())

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._fetches.add(task)  # held until done: the loop keeps only a weak reference to a task
        task.add_done_callback(self._fetches.discard)

    async def _fetch(self) -> None:
        self._flush = None
        wanted, self._wanted = self._wanted, {}
        for i, (tenant, subjects) in enumerate(wanted.items()):
            try:
                found = await self._source.data_keys(tenant, list(subjects.items()))
            except asyncio.CancelledError:
                for _, later in list(wanted.items())[i:]:  # this tenant's and those not reached: no waiter hangs
                    for ref in later:
                        self._sharing.discard(ref)
                        self._pending.pop(ref).cancel()
                raise
            except Exception as exc:
                for ref in subjects:
                    self._sharing.discard(ref)
                    future = self._pending.pop(ref)
                    if not future.done():
                        future.set_exception(exc)
                        future.exception()  # retrieved: callers re-raise it from their own await
                continue
            fresh_until = self._clock() + self._ttl_s
            for ref in subjects:
                future = self._pending.pop(ref)
                sharing = ref in self._sharing
                self._sharing.discard(ref)
                key = found.get(ref)
                if key is None:
                    future.set_exception(RuntimeError(f"the key source returned no key for subject {ref}"))
                    future.exception()
                    continue
                known = self._keys.get(ref)
                if known is not None and known.key is ERASED:  # told meanwhile (`erased`): an erasure is final
                    key = ERASED
                if key is ERASED:
                    self._remember(ref, _Cached(ERASED, float("inf")))
                elif known is not None and known.key_id is not None and not sharing:
                    known.fresh_until = fresh_until  # checked: the fresh key bound here stays in use
                    key = known.key
                else:
                    self._remember(ref, _Cached(key, fresh_until, asked_as=(tenant, subjects[ref])))
                future.set_result(key)

    def _remember(self, ref: str, cached: _Cached) -> None:
        self._keys.pop(ref, None)
        self._keys[ref] = cached
        while len(self._keys) > MAX_CACHED_KEYS:
            del self._keys[next(iter(self._keys))]  # the longest cached (an erased one is asked again)
