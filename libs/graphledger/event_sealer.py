"""Events made ready for the log: record keys hashed and user content sealed with its subject's data
key (`subjects.py`, `sealing.py`), the keys fetched once and cached.

Clients fetch keys through the read API, services from the key store (`KeySource`). A key is used for
`ttl_s` and then fetched again, which is when a writer learns of an erasure it did not see otherwise;
a subject known to be erased is refused at once (`SubjectErasedError`). Concurrent fetches are
coalesced: the subjects missing in one loop turn go out in one request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from graphledger.errors import SubjectErasedError
from graphledger.events import Event, to_envelope
from graphledger.events.envelope import Envelope
from graphledger.sealing import ERASED, DataKey, SealedSubject, seal
from graphledger.subjects import Subject, record_key, reference, subject_of, thread_record_key

MAX_CACHED_KEYS = 100_000


@dataclass(frozen=True, slots=True)
class TenantKeys:
    """What a tenant's writers hash with, and the namespace depth of its store subjects."""

    hash_key: bytes
    namespace_depth: int


class KeySource(Protocol):
    async def tenant_keys(self, tenant: str) -> TenantKeys:
        """The tenant's hashing key (created on first use); `SubjectErasedError` for an erased tenant."""
        ...

    async def data_keys(self, tenant: str, subjects: Sequence[tuple[str, Subject]]) -> dict[str, DataKey]:
        """The data key of every `(reference, subject)` (created on first use), `ERASED` for erased ones."""
        ...


@dataclass(slots=True)
class _Cached:
    key: DataKey
    fresh_until: float


class EventSealer:
    """Seals events for one process, caching keys for `ttl_s` seconds (of `clock`). On one event loop."""

    def __init__(self, source: KeySource, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._source = source
        self._ttl_s = ttl_s
        self._clock = clock
        self._tenants: dict[str, tuple[TenantKeys, float]] = {}
        self._keys: dict[str, _Cached] = {}
        self._wanted: dict[str, dict[str, Subject]] = {}
        self._pending: dict[str, asyncio.Future[DataKey]] = {}
        self._flush: asyncio.Handle | None = None
        self._fetches: set[asyncio.Task[None]] = set()

    async def seal(self, event: Event, tenant: str, envelope: Envelope | None = None) -> tuple[str | None, Envelope]:
        """`event`'s record key and sealed envelope (names as stored, of `tenant`); `envelope`: the
        event's own, when it is not a new one (an import keeps the source's times)."""
        keys = await self.tenant_keys(tenant)
        envelope = envelope or to_envelope(event)
        subject = subject_of(event, tenant, keys.namespace_depth)
        if subject is None:
            return record_key(keys.hash_key, event), envelope
        ref = reference(keys.hash_key, subject)
        data_key = await self._data_key(tenant, ref, subject)
        sealed = seal(envelope, SealedSubject(ref, subject.kind, tenant, subject.name), data_key)
        return record_key(keys.hash_key, event), sealed

    async def tenant_keys(self, tenant: str) -> TenantKeys:
        cached = self._tenants.get(tenant)
        if cached is not None and self._clock() < cached[1]:
            return cached[0]
        keys = await self._source.tenant_keys(tenant)
        self._tenants[tenant] = (keys, self._clock() + self._ttl_s)
        return keys

    def thread_key(self, tenant: str, stored_thread_id: str) -> bytes | None:
        """The record key of a thread's records, if the tenant's hashing key is at hand."""
        cached = self._tenants.get(tenant)
        return None if cached is None else thread_record_key(cached[0].hash_key, stored_thread_id).encode()

    def erased(self, ref: str) -> None:
        """Learned elsewhere (an erase call, a read) that the subject `ref` was erased."""
        self._remember(ref, _Cached(ERASED, float("inf")))

    def forget_tenant(self, tenant: str) -> None:
        self._tenants.pop(tenant, None)

    async def _data_key(self, tenant: str, ref: str, subject: Subject) -> DataKey:
        cached = self._keys.get(ref)
        if cached is None or self._clock() >= cached.fresh_until:
            future = self._pending.get(ref)
            if future is None:
                loop = asyncio.get_running_loop()
                future = self._pending[ref] = loop.create_future()
                self._wanted.setdefault(tenant, {})[ref] = subject
                if self._flush is None:
                    self._flush = loop.call_soon(self._start_fetch, loop)
            key = await asyncio.shield(future)
        else:
            key = cached.key
        if key is ERASED:
            raise SubjectErasedError(f"{subject.kind} {subject.name!r} was erased: nothing more is written for it")
        return key

    def _start_fetch(self, loop: asyncio.AbstractEventLoop) -> None:
        task = loop.create_task(self._fetch())
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
                        self._pending.pop(ref).cancel()
                raise
            except Exception as exc:
                for ref in subjects:
                    future = self._pending.pop(ref)
                    if not future.done():
                        future.set_exception(exc)
                        future.exception()  # retrieved: callers re-raise it from their own await
                continue
            fresh_until = self._clock() + self._ttl_s
            for ref in subjects:
                future = self._pending.pop(ref)
                key = found.get(ref)
                if key is None:
                    future.set_exception(RuntimeError(f"the key source returned no key for subject {ref}"))
                    future.exception()
                    continue
                known = self._keys.get(ref)
                if known is not None and known.key is ERASED:  # told meanwhile (`erased`): an erasure is final
                    key = ERASED
                self._remember(ref, _Cached(key, float("inf") if key is ERASED else fresh_until))
                future.set_result(key)

    def _remember(self, ref: str, cached: _Cached) -> None:
        self._keys.pop(ref, None)
        self._keys[ref] = cached
        while len(self._keys) > MAX_CACHED_KEYS:
            del self._keys[next(iter(self._keys))]  # the longest cached (an erased one is asked again)
