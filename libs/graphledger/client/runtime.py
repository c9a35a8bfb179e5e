"""What a client object runs on: its loop (`loop.py`), the Kafka publisher and the read API client.

A client opened with `async with` starts on the caller's loop, whose calls then run without a hop
(writes and reads alike); other loops and plain threads hop onto it. A client used without
`async with` starts lazily on first use (thread-safe) on a background loop of its own, so
constructing a saver costs nothing and LangGraph can build it at import time. The caller's trace
context is captured in the caller's thread, before any hop, so the producer and HTTP client spans
(graphledger.telemetry.client) continue the caller's trace.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections import Counter
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, Self, TypeVar, assert_never

from aiokafka import TopicPartition
from opentelemetry.context import Context

from graphledger.client.asked_verdicts import PUT_WAIT_S, AskedVerdicts
from graphledger.client.key_filters import KeyFilters
from graphledger.client.loop import BackgroundLoop, HomeLoop
from graphledger.client.others_records import Opening
from graphledger.client.ownership import (
    UNSENT,
    IntentNames,
    Mark,
    Run,
    RunMarks,
    in_run,
    window_start,
    window_verdict,
)
from graphledger.client.publisher import EventPublisher
from graphledger.client.put_riders import PutRiders
from graphledger.client.reader import ReadApiClient
from graphledger.client.tenant import scope_event
from graphledger.client.thread_reads import Answered, ThreadReads
from graphledger.client.threads import Acked, HeldThreads
from graphledger.client.tokens import AckedOffsets
from graphledger.erasure.fresh_keys import FreshKeyPool
from graphledger.erasure.read_api_keys import ReadApiKeySource
from graphledger.erasure.sealer import EventSealer
from graphledger.errors import LogUnavailableError, ReadApiError, SubjectErasedError, ThreadWriteRefusedError
from graphledger.events import Event, checkpoint, to_envelope
from graphledger.events.checkpoint import ThreadCopy, ThreadCopyBarrier
from graphledger.events.envelope import Envelope
from graphledger.folds import thread
from graphledger.log.tail import LogTail
from graphledger.ownership import Counted, Refused, Verdict
from graphledger.settings import Settings
from graphledger.telemetry.propagation import caller_context
from graphledger.tenancy import scoped_thread

log = logging.getLogger(__name__)
T = TypeVar("T")
ERASE_PATH = "/v1/erase"
Headers = Mapping[str, str] | None
CheckpointData = checkpoint.CheckpointPut | checkpoint.CheckpointWrites


class ClientRuntime:
    def __init__(self, settings: Settings, name: str) -> None:
        self._settings = settings
        self._name = name
        self._lock = threading.Lock()
        self._loop: BackgroundLoop | HomeLoop | None = None
        self.publisher = EventPublisher(settings)
        self.acked = AckedOffsets()
        self.threads = HeldThreads(settings.client_thread_memory_bytes)
        """What this process holds of each thread (on the runtime's loop)."""
        self._riders = PutRiders(self.threads)
        self.marks = RunMarks()
        """What each LangGraph run read of each thread, for its writes' intents (`client/ownership.py`)."""
        self.verdicts: Counter[str] = Counter()
        """This client's own protected writes by what it learned of them: `counted`, `refused`, `unknown`."""
        self.log: LogTail | None = None
        """The client's own look at the log's tail (`client_log_reads`), on the producer's connection."""
        self.thread_reads: ThreadReads | None = None
        self._reader: ReadApiClient | None = None
        self._asked: AskedVerdicts | None = None
        """The verdicts asked of the read API, by a client that does not read the log."""
        self.sealer: EventSealer | None = None
        """Hashes record keys and seals events with their subjects' keys (`encrypt_events`)."""
        self.tenant = ""
        """The read API's tenant for this client's token, which its writes are prefixed with."""

    # -- lifecycle -----------------------------------------------------------------------------

    def _started_loop(self) -> BackgroundLoop | HomeLoop:
        loop = self._loop
        if loop is not None:
            return loop
        with self._lock:
            if self._loop is None:
                loop = BackgroundLoop(self._name)
                try:
                    loop.run(self._start())
                except BaseException:
                    loop.stop()
                    raise
                self._loop = loop
            return self._loop

    async def _start(self) -> None:
        self._reader = ReadApiClient(self._settings)
        try:
            if self._settings.api_token is not None:
                self.tenant = await self._reader.whoami()
            if self._settings.encrypt_events:
                keys = ReadApiKeySource(self._reader)
                pool = FreshKeyPool(keys, self.tenant, self._settings.client_fresh_keys)
                self.sealer = EventSealer(keys, self._settings.key_cache_ttl_s, pool=pool)
                await self._prefetch_keys(self.sealer, pool)
            await self.publisher.start()
            # With a tenant, the partition's records of other tenants are not this client's to fetch.
            log_reads = self._settings.client_log_reads
            if log_reads or (log_reads is None and not self.tenant):
                self.log = LogTail(self._settings, self.publisher.kafka_client)
            self._asked = AskedVerdicts(self._reader.call)
            self.thread_reads = ThreadReads(
                self.threads,
                self._settings.checkpoint_topic,
                self._reader.call,
                lambda: self.log,
                self.record_key_of_thread,
                self._settings.consistency_timeout_s,
                self.thread_erased,
                self._log_denied,
                KeyFilters(self._reader.call) if self._proves_new_threads() else None,
                self._partition_of_thread_key,
                self._opening(),
                _SealerThreadKeys(self.sealer, self.tenant) if self.sealer is not None else None,
            )
        except BaseException:
            await self._reader.close()
            raise

    def _opening(self) -> Opening:
        """What this client opens other processes' records of its threads with: the keys its sealer holds."""
        sealer = self.sealer
        keys = sealer.opening_key if sealer is not None else (lambda ref, key_id: None)
        return Opening(keys, self.tenant, self._settings.clear_events_refused)

    def _proves_new_threads(self) -> bool:
        """Whether this client's reads may prove a thread new from the log (`thread_reads.py`): it reads the
        log, is the unnamed tenant's (whose the key filters are), and every record of a thread has the key it
        computes: not so for a log with a clear era under encryption, whose clear records are keyed by the
        plain thread id (often on another partition)."""
        clear_era = self._settings.encrypt_events and self._settings.accept_clear_events
        return self.log is not None and not self.tenant and not clear_era

    async def _prefetch_keys(self, sealer: EventSealer, pool: FreshKeyPool) -> None:
        """The tenant's hashing key and a batch of fresh keys, so that no write waits for a key. A client
        started while the read API is away still starts: its writes then wait for the read API."""
        try:
            await sealer.tenant_hashing(self.tenant)
        except (ReadApiError, SubjectErasedError) as exc:
            log.warning("no keys from the read API at start (%s): writes and reads wait for it", exc)
            return
        pool.fill()

    def ensure_started(self) -> None:
        self._started_loop()

    async def aopen(self) -> None:
        """Start on the calling loop (`async with`), unless started already: its calls then run there."""
        with self._lock:
            if self._loop is not None:
                return  # started before, from a thread or another loop: calls hop onto that loop
            home = self._loop = HomeLoop(asyncio.get_running_loop())
        try:
            await self._start()
        except BaseException as exc:
            with self._lock:
                self._loop = None
            home.started.set_exception(exc)
            home.started.exception()  # retrieved: only calls that waited for the start see it
            raise
        home.started.set_result(None)

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None or loop.loop.is_closed():
            return
        loop.run(self._stop())
        loop.stop()

    async def aclose(self) -> None:
        loop = self._loop
        if isinstance(loop, HomeLoop) and loop.loop is asyncio.get_running_loop():
            with self._lock:
                self._loop = None
            await self._stop()
        else:
            await asyncio.to_thread(self.close)

    async def _stop(self) -> None:
        if self._asked is not None:
            await self._asked.close()
        if self.sealer is not None and self.sealer.pool is not None:
            await self.sealer.pool.close()
        await self.publisher.stop()
        if self._reader is not None:
            await self._reader.close()

    # -- calls ---------------------------------------------------------------------------------

    async def _envelope(self, event: Event) -> tuple[str | None, Envelope]:
        """The record key and envelope of `event` as this client publishes it: under its tenant, sealed."""
        scoped = scope_event(event, self.tenant)
        if self.sealer is None:
            return scoped.key, to_envelope(scoped)
        return await self.sealer.seal(scoped, self.tenant)

    def record_key_of_thread(self, thread_id: str) -> bytes | None:
        """The record key of the thread's records (None: not known yet, nothing written here)."""
        if self.sealer is None:
            return scoped_thread(self.tenant, thread_id).encode()
        return self.sealer.record_key_of_thread(self.tenant, scoped_thread(self.tenant, thread_id))

    async def _partition_of_thread_key(self, key: bytes) -> int | None:
        return await self.publisher.partition_of(self._settings.checkpoint_topic, key)

    def protects(self, config: Any) -> bool:
        """Whether a call with `config` is a LangGraph run's whose writes this client protects."""
        return self._settings.write_ownership == "refuse" and in_run(config)

    def marked_read(self, config: Any, thread_id: str, checkpoint_ns: str, read: Answered) -> Run | None:
        """A LangGraph run read the namespace's newest checkpoint (`read`): its mark, from the view the answer
        came from (None: not a run's call, writes not protected, or no rule's state known).

        Not from what the process holds of the thread once the read is done: that may have folded an own
        record acknowledged meanwhile onto a view that lacks another process's record before it, so it is
        the rule's state of no log position (or a later read's), and the run's writes would be decided
        against a lead the log never had there."""
        if self._settings.write_ownership != "refuse":
            return None
        source = read.source
        basis = None if source is None else thread.basis_of(source.view, checkpoint_ns)
        if source is None or source.through is None or basis is None:
            return None
        head = read.answer["config"]["checkpoint_id"] if read.answer else None
        return self.marks.read(config, thread_id, checkpoint_ns, (source.partition, source.through), basis, head)

    def thread_erased(self, thread_id: str) -> None:
        """A read found the thread erased: its writes are refused from now on."""
        self.threads.erased(thread_id)
        key = self.record_key_of_thread(thread_id) if self.sealer is not None else None
        if self.sealer is not None and key is not None:
            self.sealer.erased(key.decode())  # a thread's reference is its record key

    def _log_denied(self) -> None:
        self.log = None

    async def _publish(
        self, topic: str, event: Event, context: Context, config: Any = None
    ) -> list[tuple[str, int, int]]:
        mark = self._mark_of(config, event)
        names = None
        if mark is not None:
            assert isinstance(event, checkpoint.CheckpointPut | checkpoint.CheckpointWrites)
            if mark.names is None:
                mark.names = await self._intent_names(event.thread_id)
            names = mark.names
            event = self._stamped(mark, names, event)
        key, envelope = await self._envelope(event)
        thread = _thread_of(event)
        if thread is not None:
            self.threads.sending(thread)
        try:
            if isinstance(event, checkpoint.CheckpointPut):
                put = await self._riders.before_put(event)
                try:
                    acked = await self.publisher.publish(topic, key, envelope, context=context)
                finally:
                    self._riders.put_done(put)
            else:
                if isinstance(event, checkpoint.CheckpointWrites):
                    await self._riders.before_writes(event)
                acked = await self.publisher.publish(topic, key, envelope, context=context)
        finally:
            if thread is not None:
                self.threads.sent(thread)
        self._acked(topic, acked, key)
        _, partition, _ = acked[0]
        if thread is not None:
            offsets = tuple(offset for _, _, offset in acked)
            decided = self.threads.acked(thread, partition, offsets, event)  # type: ignore[arg-type]  # a thread's: a checkpoint event
            if mark is not None:
                assert names is not None and isinstance(event, checkpoint.CheckpointPut | checkpoint.CheckpointWrites)
                await self._learn_verdict(mark, names, event, key, acked, decided)
        elif isinstance(event, checkpoint.RunsDelete):
            self.threads.acked_everywhere(partition, acked[-1][2], event)
        return acked

    # -- one writer per thread (client/ownership.py) ------------------------------------------------

    def _mark_of(self, config: Any, event: Event) -> Mark | None:
        """The mark of the run a put or writes belongs to, when this client protects its writes."""
        if config is None or not self._settings.write_ownership == "refuse":
            return None
        if not isinstance(event, checkpoint.CheckpointPut | checkpoint.CheckpointWrites):
            return None
        mark = self.marks.of(config, event.thread_id, event.checkpoint_ns)
        if mark is not None and mark.refusal is not None:
            raise mark.refusal
        return mark

    async def _intent_names(self, thread_id: str) -> IntentNames:
        hash_key = None if self.sealer is None else (await self.sealer.tenant_hashing(self.tenant)).hash_key
        return IntentNames(hash_key, scoped_thread(self.tenant, thread_id))

    def _stamped(self, mark: Mark, names: IntentNames, event: CheckpointData) -> CheckpointData:
        """`event` with its run's intent, the mark moved past a put (on this loop, in the order sent)."""
        if isinstance(event, checkpoint.CheckpointPut):
            if mark.expects_id is not None and event.checkpoint_id <= mark.expects_id:
                reason = (
                    f"its checkpoint id {event.checkpoint_id} is not above {mark.expects_id}, the one it follows: "
                    "this process's clock is behind another writer's"
                )
                mark.refusal = ThreadWriteRefusedError(event.thread_id, event.checkpoint_ns, reason)
                raise mark.refusal
            intent = mark.intent(names, event.checkpoint_id)
            stamped = dataclasses.replace(event, intent=intent.header())
            mark.sent_put(intent, event.checkpoint_id, thread.run_of(event) if mark.run_id is UNSENT else mark.run_id)
            return stamped
        return dataclasses.replace(event, intent=mark.intent(names, event.checkpoint_id).header())

    async def _learn_verdict(
        self,
        mark: Mark,
        names: IntentNames,
        event: CheckpointData,
        key: str | None,
        acked: Sequence[tuple[str, int, int]],
        decided: Acked | None,
    ) -> None:
        """Raise `ThreadWriteRefusedError` when the log refused the run's write: decided from what the process
        holds when its own records account for every record before the write; else from the log's records
        since the run's read, by their headers (`ownership.window_verdict`). A client that does not read the
        log asks the read API (`asked_verdicts.py`): a put waits for the answer a short while, and a refusal
        learned later is raised by the run's next saver call."""
        verdict = decided.verdict if decided is not None and decided.settled else None
        if verdict is None and self.log is not None:
            verdict = await self._verdict_from_log(mark, names, key, acked)
        elif verdict is None and self._asked is not None and not self._asked.unsupported:
            _, partition, last = acked[-1]
            asked = self._asked.ask(
                event.thread_id, partition, last, lambda told: self._decided(mark, event, told, learned_late=True)
            )
            if isinstance(event, checkpoint.CheckpointPut):
                await asyncio.wait([asked], timeout=PUT_WAIT_S)
            if asked.done() and mark.refusal is not None:
                raise mark.refusal
            return
        refusal = self._decided(mark, event, verdict)
        if refusal is not None:
            raise refusal

    def _decided(
        self, mark: Mark, event: CheckpointData, verdict: Verdict | None, *, learned_late: bool = False
    ) -> ThreadWriteRefusedError | None:
        """Count a write's verdict; a refusal goes on the run's mark, so every later call of the run raises it."""
        match verdict:
            case None:
                self.verdicts["unknown"] += 1
            case Counted():
                self.verdicts["counted"] += 1
            case Refused(reason=reason, superseded_by=by):
                self.verdicts["refused"] += 1
                superseded = None if by is None else f"hash {by.hex()}"
                if mark.refusal is None:
                    mark.refusal = ThreadWriteRefusedError(event.thread_id, event.checkpoint_ns, reason, superseded)
                    self.threads.forget(event.thread_id)  # its next read asks the read API
                    log.warning("%s%s", mark.refusal, " (learned from the read API)" if learned_late else "")
                return mark.refusal
            case _:
                assert_never(verdict)
        return None

    async def _verdict_from_log(
        self, mark: Mark, names: IntentNames, key: str | None, acked: Sequence[tuple[str, int, int]]
    ) -> Verdict | None:
        """The write's verdict from the thread's records in the log since the run's read (None: the log
        cannot be read, or the scan stopped short of the write)."""
        _, partition, last = acked[-1]
        if self.log is None or key is None or partition != mark.partition:
            return None
        tp = TopicPartition(self._settings.checkpoint_topic, partition)
        start = window_start(mark, names, last)
        try:
            tail = (await self.log.tails({tp: start.through}, self._settings.consistency_timeout_s))[tp]
        except LogUnavailableError:
            return None
        write = next((r for r in tail.records if r.offset == last), None)
        if write is None:
            return None  # the scan stopped short of it
        return window_verdict(mark, names, tail.records, key.encode(), write, start)

    def _acked(self, topic: str, acked: Sequence[tuple[str, int, int]], key: str | None) -> None:
        """Records of this process, with their record key, acknowledged at `acked`."""
        self.acked.record(acked)
        if self.log is not None:  # its look at the log then expects these records
            for acked_topic, partition, offset in acked:
                self.log.note_end(TopicPartition(acked_topic, partition), offset + 1)
        filters = self.thread_reads.key_filters if self.thread_reads is not None else None
        if filters is not None and topic == self._settings.checkpoint_topic:
            key_bytes = key.encode() if key is not None else None
            for _, partition, offset in acked:
                filters.written(partition, offset, key_bytes)

    async def _publish_copy(self, topic: str, copy: ThreadCopy, context: Context) -> None:
        """The copy, then, once acknowledged, the barrier that orders the target's events after it."""
        _, partition, offset = (await self._publish(topic, copy, context))[-1]
        await self._publish(topic, ThreadCopyBarrier(copy.target_thread_id, partition, offset), context)

    async def _publish_many(self, topic: str, events: Sequence[Event], context: Context) -> None:
        # Concurrently, so the producer batches them; callers pass events with distinct keys, whose
        # relative order does not matter.
        await asyncio.gather(*(self._publish(topic, event, context) for event in events))

    async def _broadcast(self, topic: str, event: Event, context: Context) -> None:
        # One copy per partition, so the event takes its place among every thread's writes.
        for partition in await self.publisher.partitions(topic):
            _, envelope = await self._envelope(event)
            acked = await self.publisher.publish(topic, None, envelope, context=context, partition=partition)
            self._acked(topic, acked, None)
            if isinstance(event, checkpoint.RunsDelete):
                self.threads.acked_everywhere(partition, acked[-1][2], event)

    async def _read(self, path: str, body: dict[str, Any], headers: Headers, context: Context) -> Any:
        assert self._reader is not None
        return await self._reader.call(path, body, headers, context)

    def publish(self, topic: str, event: Event, config: Any = None) -> None:
        """Publish `event`; `config`: the LangGraph call's, whose run's intent a put or writes carries."""
        self._started_loop().run(self._publish(topic, event, caller_context(), config))

    async def apublish(self, topic: str, event: Event, config: Any = None) -> None:
        await self._arun(self._publish(topic, event, caller_context(), config))

    def publish_many(self, topic: str, events: Sequence[Event]) -> None:
        """Publish events with distinct keys together; returns once every one is acknowledged."""
        if events:
            self._started_loop().run(self._publish_many(topic, events, caller_context()))

    async def apublish_many(self, topic: str, events: Sequence[Event]) -> None:
        if events:
            await self._arun(self._publish_many(topic, events, caller_context()))

    def publish_copy(self, topic: str, copy: ThreadCopy) -> None:
        self._started_loop().run(self._publish_copy(topic, copy, caller_context()))

    async def apublish_copy(self, topic: str, copy: ThreadCopy) -> None:
        await self._arun(self._publish_copy(topic, copy, caller_context()))

    def broadcast(self, topic: str, event: Event) -> None:
        self._started_loop().run(self._broadcast(topic, event, caller_context()))

    async def abroadcast(self, topic: str, event: Event) -> None:
        await self._arun(self._broadcast(topic, event, caller_context()))

    async def _erase(self, body: dict[str, Any], context: Context) -> None:
        """Ask the read API to erase (`POST /v1/erase`); the erased subjects are refused here from now on,
        and this client's next reads wait for the erasure events."""
        assert self._reader is not None
        answer = await self._reader.call(ERASE_PATH, body, None, context)
        if "thread_id" in body:
            self.threads.erased(body["thread_id"])
        if body.get("tenant"):
            self.threads.clear()
        if self.sealer is not None:
            for erased in answer.get("erased", ()):
                self.sealer.erased(erased["ref"])
            if body.get("tenant"):
                self.sealer.forget_tenant(self.tenant)
        self.acked.record(tuple(position) for position in answer.get("positions", ()))

    def erase(self, body: dict[str, Any]) -> None:
        self._started_loop().run(self._erase(body, caller_context()))

    async def aerase(self, body: dict[str, Any]) -> None:
        await self._arun(self._erase(body, caller_context()))

    def read(self, path: str, body: dict[str, Any], headers: Headers = None) -> Any:
        """One read API call, with `headers` besides the client's own."""
        return self._started_loop().run(self._read(path, body, headers, caller_context()))

    async def aread(self, path: str, body: dict[str, Any], headers: Headers = None) -> Any:
        return await self._arun(self._read(path, body, headers, caller_context()))

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the client's loop (it may use the publisher, the reader and the log)."""
        try:
            loop = self._started_loop()
        except BaseException:
            coro.close()
            raise
        return loop.run(coro)

    async def acall(self, coro: Coroutine[Any, Any, T]) -> T:
        return await self._arun(coro)

    async def _arun(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await `coro` on the runtime's loop, starting the runtime first (off the caller's loop)."""
        try:
            loop = self._loop if self._loop is not None else await asyncio.to_thread(self._started_loop)
        except BaseException:
            coro.close()
            raise
        return await loop.arun(coro)


class _SealerThreadKeys:
    """`thread_reads.ThreadKeys` of the client's sealer, by the client's unscoped thread ids."""

    def __init__(self, sealer: EventSealer, tenant: str) -> None:
        self._sealer, self._tenant = sealer, tenant

    def wanted(self, thread_id: str) -> bool:
        return self._sealer.thread_key_wanted(self._tenant, scoped_thread(self._tenant, thread_id))

    def adopt(self, thread_id: str, key: bytes) -> None:
        self._sealer.adopt(self._tenant, scoped_thread(self._tenant, thread_id), key)

    def share(self, thread_id: str) -> asyncio.Future[Any] | None:
        return self._sealer.share(self._tenant, scoped_thread(self._tenant, thread_id))


def _thread_of(event: Event) -> str | None:
    """The thread an event is a record of, as the caller names it (the event is not scoped yet): a checkpoint
    event's key. Store events, `runs.delete` (every partition) and erasures are no thread's records."""
    return event.key if isinstance(event, checkpoint.ThreadEvent) else None


class ClientLifecycle:
    """Context-manager and `close()` plumbing shared by `KafkaSaver` and `KafkaStore`."""

    _runtime: ClientRuntime

    def close(self) -> None:
        self._runtime.close()

    def __enter__(self) -> Self:
        self._runtime.ensure_started()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        await self._runtime.aopen()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runtime.aclose()

    @property
    def consistency_token(self) -> dict[tuple[str, int], int]:
        """The newest acknowledged offset per partition of this client's writes."""
        return self._runtime.acked.token()
