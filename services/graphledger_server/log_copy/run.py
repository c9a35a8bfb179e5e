"""Copying a log written in the clear into sealed topics (`graphledger encrypt-log --to-prefix NEW`), and
copying a log into topics of another partition count (`graphledger repartition --to-prefix NEW --partitions N`).

A deployment that ran with `GRAPHLEDGER_ENCRYPT_EVENTS` off has events whose payloads are in the clear
and whose record keys are thread ids and store keys, which no erasure can reach. This copies the
checkpoint and store topics of `GRAPHLEDGER_TOPIC_PREFIX` into `NEW.checkpoints` and `NEW.store`,
each event sealed with its subject's data key and keyed by its keyed hash, as a client with encryption
on would have written it (`EventSealer` on the key store, as `graphledger import` seals). Writers must
be stopped for the copy; the operator then switches to the new topics (docs/operations.md).

The rules it keeps:
- Each event keeps its envelope (type, event id, producer time), only its payload is sealed, and its
  time: its records carry `gl-appended-ms`, the time of its first append to a log (its source record's
  Kafka timestamp, or the time a source that is itself a copy carries), which store items' timestamps
  and threads' activity come from, rather than the copy's. Events already sealed (written by clients
  with encryption on) are copied as they are. An event of an erased subject is left out: nothing of it
  may be written again. A record that does not decode or validate (the projector dead-lettered it) is
  left out and listed, since its payload may hold anything in the clear, and so are chunks of an event
  whose other chunks the log lacks.
- Order. A record goes to the partition the producers' partitioner gives its new key (murmur2 of the
  key modulo the new topic's partitions), where a client's later writes of the same thread or item go:
  never the source partition, whose number means nothing for a hashed key. Each source partition is
  read in offset order, chunked events reassembled (an event sits at its last chunk, where the
  projector applies it) and re-framed, and the partitions are merged by event time, the smaller
  partition first on a tie. So one thread's (one item's) events keep their log order, and a thread
  whose events sit on two source partitions (in the clear, then sealed by clients that turned
  encryption on before this copy) keeps them in the order they were written.
- `thread.copy.barrier` names the position of its copy's record in the source topic. The copy is
  merged before its barrier (a barrier waits in the merge until its copy's partition has passed that
  position: the copy was acknowledged before the barrier was written, so this never deadlocks on a
  consistent log), and the barrier is rewritten, sealed again if it was sealed, to the copy's
  position in the new topic as the broker acknowledged it. A barrier naming no copy is left out.
- Keyless events (`runs.delete`, `namespace.erase`, `tenant.erase`) were written to every partition,
  each copy applying to the threads or items of its own partition. Each source copy is written to every
  new partition at its place in the merge: the threads of its source partition are spread over all
  the new ones, and its place among each new partition's records is after their earlier events and
  before their later ones, as it was in its source partition.
- The copy reads each source partition up to its end as of the start (the high watermark of a fetch,
  as the read API learns it: tansu's ListOffsets runs low). Every record written carries `gl-copy-of:
  <source partition>:<source offset>`, so a second run reads the new topics first and writes only what
  is missing: each new partition holds a prefix of what the merge, which is the same on every run,
  sends to it, and a run that finds anything else refuses. A finished copy run again writes nothing.

A repartition is the same copy with two differences: the new topics get the partition count asked for
(the only way to change it: a thread's records must stay on one partition, `graphledger.log.layout`),
and events are written as they are, in the clear or sealed; only copy barriers are rewritten (a sealed
one opened and sealed again with its key). With encryption on, an event in the clear (written before it
was turned on) goes to the partition of the keyed hash its subject is written under now, where its
sealed events go, instead of its own key's: one thread's records of both eras stay on one partition, in
the order the merge gives them. So the key store is needed with encryption on, or for a sealed barrier.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from graphledger.erasure.sealer import EventSealer
from graphledger.errors import GraphledgerError
from graphledger.log.tail import LogTail
from graphledger.settings import Settings
from graphledger.tenancy import check_tenant_name
from graphledger_server.api.credentials import token_entries
from graphledger_server.keys.key_store import key_store_for
from graphledger_server.keys.lookup import DataKeyCache
from graphledger_server.keys.source import StoreKeySource
from graphledger_server.log.clients import new_consumer, new_producer
from graphledger_server.log.topics import ensure_topics, source_topics
from graphledger_server.log_copy.copier import Copier, Sealing
from graphledger_server.log_copy.report import TopicReport
from graphledger_server.log_copy.source import Merge, SourceEvent
from graphledger_server.log_copy.target import Copied
from graphledger_server.replay.preflight import inspect_sources, refuse_losses

log = logging.getLogger(__name__)

WINDOW_EVENTS = 512
"""Events sealed together (their keys fetched in one request), written in order, then acknowledged."""
PROGRESS_EVENTS = 50_000
"""How often (in events) the copy logs its progress."""
FETCH_BYTES = 8 * 1024 * 1024
TOPIC_PREFIX = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


async def encrypt_log(
    settings: Settings, to_prefix: str, *, extra_tenants: Iterable[str] = (), accept_loss: bool = False
) -> list[TopicReport]:
    """Copy both source topics into `to_prefix`'s, sealed; see the module docstring."""
    return await _copy_log(settings, to_prefix, None, extra_tenants=extra_tenants, accept_loss=accept_loss)


async def repartition(
    settings: Settings, to_prefix: str, partitions: int, *, accept_loss: bool = False
) -> list[TopicReport]:
    """Copy both source topics into `to_prefix`'s with `partitions` partitions each, every event as it
    is (in the clear or sealed), at the partition its key gives with the new count (with encryption on,
    an event in the clear at its keyed hash's); the merge, the re-pointed barriers, the keyless events and
    the resumption are encrypt-log's."""
    if partitions < 1:
        raise GraphledgerError(f"--partitions {partitions}: a topic has at least one partition")
    return await _copy_log(settings, to_prefix, partitions, accept_loss=accept_loss)


async def _copy_log(
    settings: Settings,
    to_prefix: str,
    partitions: int | None,
    *,
    extra_tenants: Iterable[str] = (),
    accept_loss: bool = False,
) -> list[TopicReport]:
    """The copy: sealing what is in the clear into the source's partition count (`partitions` None), or
    keeping every event as it is into `partitions`."""
    if not TOPIC_PREFIX.match(to_prefix):
        raise GraphledgerError(f"--to-prefix {to_prefix!r} is not a topic prefix (1-200 of A-Z a-z 0-9 . _ -)")
    if to_prefix == settings.topic_prefix:
        raise GraphledgerError(
            f"--to-prefix {to_prefix!r} is GRAPHLEDGER_TOPIC_PREFIX, the source: the copy goes to new topics"
        )
    refuse_losses(await inspect_sources(settings), accept_loss=accept_loss)
    target = settings.model_copy(update={"topic_prefix": to_prefix})
    pool = await asyncpg.create_pool(settings.postgres_dsn, min_size=0, max_size=2)
    tail = LogTail(settings)
    consumer = new_consumer(settings, fetch_bytes=FETCH_BYTES)
    producer: AIOKafkaProducer | None = None
    try:
        seal_clear = partitions is None
        sealing = _sealing(settings, pool, extra_tenants, required=seal_clear or settings.encrypt_events)
        await tail.start()
        await consumer.start()
        await consumer.topics()
        counts = {t: _partition_count(consumer, t) for t in source_topics(settings)}
        ends = await _ends(tail, counts, settings)
        wanted = partitions if partitions is not None else counts[settings.checkpoint_topic]
        await ensure_topics(target.model_copy(update={"topic_partitions": wanted}))
        producer = new_producer(target)
        await producer.start()
        reports = []
        for source_topic, target_topic in zip(source_topics(settings), source_topics(target), strict=True):
            written_to = sorted(await producer.partitions_for(target_topic))
            copied = await Copied.read(consumer, tail, target_topic, written_to, ends[source_topic], settings)
            report = TopicReport(source_topic, target_topic, len(written_to))
            copier = Copier(report, producer, sealing, copied, settings, seal_clear=seal_clear)
            await _copy_topic(Merge(consumer, source_topic, ends[source_topic], copier.classify), copier, report)
            reports.append(report)
        await _refuse_growth(tail, counts, ends, settings, reports)
        return reports
    finally:
        if producer is not None:
            await producer.stop()
        await consumer.stop()
        await tail.stop()
        await pool.close()


def _sealing(settings: Settings, pool: asyncpg.Pool, extra_tenants: Iterable[str], *, required: bool) -> Sealing | None:
    key_store = key_store_for(settings, pool)
    if key_store is None and not required:
        return None
    if key_store is None:
        raise GraphledgerError(
            "encrypt-log seals with the key store: set GRAPHLEDGER_KEY_ENCRYPTION_KEYS (the services' key-encryption "
            "keys) and the key store's database (GRAPHLEDGER_POSTGRES_DSN)"
        )
    tenants = frozenset(check_tenant_name(t) for t in extra_tenants) | {
        e.tenant.name for e in token_entries(settings) or () if e.tenant.name
    }
    sealer = EventSealer(StoreKeySource(key_store, settings), settings.key_cache_ttl_s)
    return Sealing(sealer, DataKeyCache(key_store), tenants)


async def _copy_topic(merge: Merge, copier: Copier, report: TopicReport) -> None:
    """Copy the merged events a window at a time, then count the chunked events the source lacks parts of."""
    window: list[SourceEvent] = []
    async for event in merge.events():
        window.append(event)
        if len(window) >= WINDOW_EVENTS:
            await copier.copy(window)
            window = []
            if report.events % PROGRESS_EVENTS < WINDOW_EVENTS:
                log.info("%s: %d events copied, %d records written", report.source, report.events, report.records)
    await copier.copy(window)
    for position, why in merge.incomplete():
        report.events += 1
        report.leave_out(position, why)


async def _refuse_growth(
    tail: LogTail,
    counts: dict[str, int],
    ends: dict[str, dict[int, int]],
    settings: Settings,
    reports: list[TopicReport],
) -> None:
    """Fail when the source grew during the copy: a writer still runs, and its writes are not copied."""
    now = await _ends(tail, counts, settings)
    grown = {f"{t}:{p}": end - ends[t][p] for t, of in now.items() for p, end in of.items() if end > ends[t][p]}
    if grown:
        for report in reports:
            for line in report.describe():
                log.warning("%s", line)
        raise GraphledgerError(
            f"the source grew while it was copied ({', '.join(f'{tp} by {n}' for tp, n in sorted(grown.items()))}): "
            "writers are still running, and what they wrote is not copied. Stop them and run encrypt-log again: it "
            "writes only what is missing"
        )


def _partition_count(consumer: AIOKafkaConsumer, topic: str) -> int:
    partitions = consumer.partitions_for_topic(topic)
    if not partitions:
        raise GraphledgerError(f"source topic {topic} does not exist: is GRAPHLEDGER_TOPIC_PREFIX the log to copy?")
    return len(partitions)


async def _ends(tail: LogTail, counts: dict[str, int], settings: Settings) -> dict[str, dict[int, int]]:
    """Each partition's high watermark, from fetches (tansu's ListOffsets answers low)."""
    starts = {TopicPartition(t, p): 0 for t, n in counts.items() for p in range(n)}
    found = await tail.ends(starts, settings.consistency_timeout_s)
    ends: dict[str, dict[int, int]] = {t: {} for t in counts}
    for tp, end in found.items():
        ends[tp.topic][tp.partition] = end
    return ends
