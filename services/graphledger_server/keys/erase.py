"""Erasing a thread, a store namespace or a tenant (docs/security.md), for the read API and the CLI.

In this order, each step idempotent, so an erase that fails half way is simply asked again:
1. the key store destroys the subject's data key (or every key of the tenant) and records who asked:
   from then on no reader can open the subject's events, wherever they are in the log;
2. an erasure event is published behind the subject's events (`thread.erase` on the thread's
   partition, `namespace.erase` and `tenant.erase` on every partition), and the projector drops the
   subject's rows, dead letters and chunks when it applies it;
3. a thread's copies (`copy_thread`) hold its data, so once the projector applied the thread's erasure
   (every copy from it before that point is in `graphledger_thread_copies`, recorded at the copy's
   record whether or not its barrier has landed the rows yet; later copies copy nothing), each copy is
   erased the same way, with what is still staged for it. A replay opens none of their events either, so it
   rebuilds exactly what the live projection holds. A copy's erasure passes its own copies on to its
   source's lineage, so an erase asked again after `ErasureIncompleteError` still finds the copies of the
   copies the failed attempt erased.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import asyncpg

from graphledger.client.publisher import EventPublisher
from graphledger.erasure.subjects import (
    LABEL_SEPARATOR,
    Subject,
    namespace_subject,
    namespace_subject_depth,
    reference,
    thread_subject,
)
from graphledger.errors import GraphledgerError
from graphledger.events import Event, to_envelope
from graphledger.events.erasure import NamespaceErase, TenantErase, ThreadErase
from graphledger.settings import Settings
from graphledger_server.keys.key_store import Erasure
from graphledger_server.keys.source import StoreKeySource
from graphledger_server.log.applied import AppliedOffsets
from graphledger_server.sql import render

log = logging.getLogger(__name__)

# $1 thread id: the threads copied from it.
COPIES_SQL = "SELECT target_thread_id FROM {schema}.graphledger_thread_copies WHERE source_thread_id = $1::text"
# $1 tenant, $2 a namespace subject's name and the label separator: the namespace subjects below it.
SUBJECTS_BELOW_SQL = """
SELECT name FROM {schema}.graphledger_subjects
WHERE kind = 'namespace' AND tenant = $1::text AND starts_with(name, $2::text)
"""

Position = tuple[str, int, int]


class ErasureIncompleteError(GraphledgerError):
    """A subject was erased, but the projector did not apply its erasure in time to tell what else
    must go with it (a thread's copies, the namespaces below a short one): erase it again once the
    projector has caught up."""

    retryable = True


class NotASubjectError(GraphledgerError):
    """What was asked to be erased is not an erasure subject (e.g. a namespace deeper than the subjects)."""


@dataclass
class ErasureReport:
    erased: list[tuple[str, str]] = field(default_factory=list)
    """`(kind, reference)` of every subject erased (a thread's copies included)."""
    positions: list[Position] = field(default_factory=list)
    """Where the erasure events landed in the log."""


class Eraser:
    def __init__(
        self, settings: Settings, keys: StoreKeySource, projection: asyncpg.Pool, applied: AppliedOffsets
    ) -> None:
        self._settings = settings
        self._keys = keys
        self._projection = projection
        self._applied = applied
        self._copies_sql = render(COPIES_SQL, settings.postgres_schema)
        self._subjects_below_sql = render(SUBJECTS_BELOW_SQL, settings.postgres_schema)
        self._publisher: EventPublisher | None = None

    async def close(self) -> None:
        if self._publisher is not None:
            await self._publisher.stop()

    async def erase_thread(self, tenant: str, stored_thread_id: str, erased_by: str) -> ErasureReport:
        """Erase the thread and, transitively, every thread copied from it."""
        report = ErasureReport()
        hash_key = (await self._keys.tenant_hashing(tenant)).hash_key
        todo, seen = [stored_thread_id], set()
        while todo:
            thread_id = todo.pop()
            if thread_id in seen:
                continue
            seen.add(thread_id)
            ref = reference(hash_key, thread_subject(tenant, thread_id))
            positions = await self._erase_subject(Erasure("thread", tenant, ref), ThreadErase(ref), erased_by, report)
            await self._applied_or_incomplete(positions, f"thread {thread_id!r}", "its copies")
            async with self._projection.acquire() as conn:
                todo.extend(r["target_thread_id"] for r in await conn.fetch(self._copies_sql, thread_id))
        return report

    async def erase_namespace(self, tenant: str, stored_labels: tuple[str, ...], erased_by: str) -> ErasureReport:
        """Erase the store subject `stored_labels` names: at most `erasure_namespace_depth` labels (after the
        tenant's), as the subjects are; a deeper namespace is refused, since erasing it would erase more.
        A shorter one is a subject of its own (the items right in it), and the subjects below it that
        the projection knows once its erasure applied are erased with it."""
        depth = self._settings.erasure_namespace_depth
        subject = namespace_subject(tenant, stored_labels, depth)
        if subject.name != LABEL_SEPARATOR.join(stored_labels):
            raise NotASubjectError(
                f"namespace {stored_labels!r} is deeper than the erasure subjects ({depth} labels, "
                "GRAPHLEDGER_ERASURE_NAMESPACE_DEPTH): erase its first labels, which erases every namespace below"
            )
        report = ErasureReport()
        names = [subject.name]
        if len(stored_labels) < namespace_subject_depth(tenant, depth):
            ref = await self._ref(tenant, subject)
            positions = await self._erase_subject(
                Erasure("namespace", tenant, ref), NamespaceErase(ref), erased_by, report
            )
            await self._applied_or_incomplete(positions, f"namespace {stored_labels!r}", "the namespaces below it")
            async with self._projection.acquire() as conn:
                below = await conn.fetch(self._subjects_below_sql, tenant, subject.name + LABEL_SEPARATOR)
            names = [r["name"] for r in below]
        for name in names:
            ref = await self._ref(tenant, Subject("namespace", tenant, name))
            await self._erase_subject(Erasure("namespace", tenant, ref), NamespaceErase(ref), erased_by, report)
        return report

    async def erase_tenant(self, tenant: str, erased_by: str) -> ErasureReport:
        if not tenant:
            raise NotASubjectError("the unnamed tenant (no tokens, or a single one) cannot be erased; erase subjects")
        report = ErasureReport()
        await self._keys.store.erase(Erasure("tenant", tenant), erased_by)
        self._keys.forget_tenant(tenant)
        report.erased.append(("tenant", tenant))
        event = TenantErase(tenant)
        for topic in (self._settings.checkpoint_topic, self._settings.store_topic):
            report.positions.extend(await self._broadcast(topic, event))
        log.warning("erased tenant %r (by %s)", tenant, erased_by)
        return report

    async def _ref(self, tenant: str, subject: Subject) -> str:
        return reference((await self._keys.tenant_hashing(tenant)).hash_key, subject)

    async def _erase_subject(
        self, erasure: Erasure, event: ThreadErase | NamespaceErase, erased_by: str, report: ErasureReport
    ) -> list[Position]:
        assert erasure.ref is not None
        await self._keys.store.erase(erasure, erased_by)
        report.erased.append((erasure.kind, erasure.ref))
        if isinstance(event, ThreadErase):
            positions = await self._publish(self._settings.checkpoint_topic, event, event.key)
        else:
            positions = await self._broadcast(self._settings.store_topic, event)
        report.positions.extend(positions)
        return positions

    async def _applied_or_incomplete(self, positions: list[Position], erased: str, cascade: str) -> None:
        """Wait until the projector applied the erasure events at `positions`, or raise
        `ErasureIncompleteError` naming what could not be looked up yet."""
        wanted = {(topic, partition): offset for topic, partition, offset in positions}
        timeout_s = self._settings.consistency_timeout_s
        if await self._applied.wait(wanted, timeout_s):
            raise ErasureIncompleteError(
                f"{erased} is erased, but the projector has not applied its erasure after {timeout_s:g}s, so "
                f"{cascade} are not known yet: erase it again"
            )

    async def _publish(self, topic: str, event: Event, key: str | None, partition: int | None = None) -> list[Position]:
        publisher = await self._started()
        return await publisher.publish(topic, key, to_envelope(event), partition=partition)

    async def _broadcast(self, topic: str, event: Event) -> list[Position]:
        publisher = await self._started()
        positions: list[Position] = []
        for partition in await publisher.partitions(topic):
            positions.extend(await self._publish(topic, event, None, partition))
        return positions

    async def _started(self) -> EventPublisher:
        if self._publisher is None:
            publisher = EventPublisher(self._settings)
            await publisher.start()
            self._publisher = publisher
        return self._publisher
