"""How a client answers a read of one thread: from what it holds when the log allows, else the read API.

A read reflects every write to the thread acknowledged to any process before it began
(docs/architecture.md, "Consistency"). The client takes the thread's snapshot (`threads.Held`) and
asks the log, with a fetch sent after the read began, for the thread's partition from the
snapshot's `through` (from past the process's own records there, which their offsets clear): when
every record of the thread there is its own, the snapshot is the answer (no HTTP, no Postgres).
When the others' records of the thread there are puts and writes this process can open, it folds
them onto the snapshot as the projection applies them (`others_records.py`: a thread that moved between
pods), and the result is the answer. Otherwise, or when it holds no view of what is asked, the read API
answers (it waits for, or folds, every record the client does not name as its own) and the client folds
its named records onto that answer; it then seals the thread with the thread's own key
(`EventSealer.share`), which every process that reads the thread holds, so that they open each other's
records. When the fold cannot derive the answer (`thread.Underivable`), the
client asks once more naming nothing, and the read API then waits for every record of the thread.

A thread the process does not hold is most often a new one. Its read is answered here too when the log
proves it new: its key is not in its partition's key filter (`key_filters.py`), and no record from the
filter's `through` to the log's end has it. The thread is then held as new through that end.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple, Protocol

from aiokafka import TopicPartition
from aiokafka.errors import ClusterAuthorizationFailedError, TopicAuthorizationFailedError

from graphledger.answers import ChannelHistory, DeltaHistoryAnswer, GetAnswer, Holding
from graphledger.client.key_filters import KeyFilters
from graphledger.client.others_records import THREAD_KEY_NOT_HELD, Fallback, Opening, folded, others_of_thread
from graphledger.client.threads import Held, HeldThreads
from graphledger.errors import LogUnavailableError, ReadApiError
from graphledger.folds import thread
from graphledger.log.records import Tail
from graphledger.log.tail import LogTail
from graphledger.ownership import Ledger
from graphledger.telemetry import client as telemetry
from graphledger.tenancy import scoped_thread
from graphledger.wire import CACHED_THROUGH_HEADER, OWN_WRITES_HEADER, THREAD_KEY_HEADER, THREAD_KEY_WANTED

log = logging.getLogger(__name__)

GET_PATH = "/v1/checkpoints/get"
DELTA_PATH = "/v1/checkpoints/delta-history"

Read = Callable[[str, dict[str, Any], Mapping[str, str] | None], Awaitable[Any]]
"""A read API call: path, body, extra headers."""


class ThreadKeys(Protocol):
    """A sealing process's threads' own keys (`EventSealer`), which it seals a thread it did not write with,
    so that every process of the tenant opens the others' records of it (`others_records.py`)."""

    def wanted(self, thread_id: str) -> bool:
        """Whether a get should ask for the thread's key beside its answer (`THREAD_KEY_HEADER`)."""
        ...

    def adopt(self, thread_id: str, key: bytes) -> None:
        """Seal and open the thread with the key a get answered."""
        ...

    def share(self, thread_id: str) -> asyncio.Future[Any] | None:
        """Ask for the thread's key (`/v1/keys`), unless held; returns the ask in flight."""
        ...


class Answered(NamedTuple):
    """A get's answer, and what it was answered from."""

    answer: dict[str, Any] | None
    """The read API's get answer (wire form)."""
    source: Held | None
    """The thread as the answer found it: its view holds every record of the thread below `through` and no
    other (no own record past it), so it is the one-writer rule's state as of `through`, which a run that
    read the answer writes against (`ClientRuntime.marked_read`). None: an answer no run's mark takes (a
    checkpoint by id, an erased thread)."""


class ThreadReads:
    """Answers `get_tuple` for one client; on the client's event loop."""

    def __init__(
        self,
        threads: HeldThreads,
        topic: str,
        read: Read,
        log_tail: Callable[[], LogTail | None],
        record_key_of_thread: Callable[[str], bytes | None],
        timeout_s: float,
        on_erased: Callable[[str], None],
        on_log_denied: Callable[[], None],
        key_filters: KeyFilters | None = None,
        partition_of: Callable[[bytes], Awaitable[int | None]] | None = None,
        opening: Opening | None = None,
        keys: ThreadKeys | None = None,
    ) -> None:
        self._threads = threads
        self._topic = topic
        self._read = read
        self._log_tail = log_tail
        self._record_key_of_thread = record_key_of_thread
        self._timeout_s = timeout_s
        self._on_erased = on_erased
        self._on_log_denied = on_log_denied
        self.key_filters = key_filters
        """The partitions' key filters; None: no proofs of new threads (`ClientRuntime._proves_new_threads`
        says for which clients)."""
        self._partition_of = partition_of
        self._opening = opening
        """What the process opens other processes' records with (None: it folds none)."""
        self._keys = keys
        """The threads' own keys, for a process that seals (None: it seals nothing)."""
        self.answered: Counter[str] = Counter()
        """Reads answered from what the process holds (`held`), with other processes' records folded onto it
        (`folded`), for a thread proved new (`new`), and by the read API (`read_api`)."""
        self.fell_back: Counter[str] = Counter()
        """Why a read went to the read API: `not_held`, `not_local` (only own records known), `underivable` (the
        view does not hold what is asked), `incomplete_tail` (more records since than one look scans),
        `log_unreadable`, `no_hashing_key`, `not_folded`, or why the others' records did not fold
        (`others_records.Fallback`)."""

    async def get(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None) -> Answered:
        """The read API's get answer (wire form) for the thread namespace's newest checkpoint, or for
        `checkpoint_id`, and what it was answered from."""
        await self._threads.settled(thread_id)
        held = self._threads.get(thread_id)
        if held is None and (new := await self._proved_new(thread_id)) is not None:
            self._count("new")
            return Answered(None, new)
        if held is not None and held.view.erased:
            return Answered(None, None)
        reason = _not_local(held)
        if held is not None and reason is None:
            answer = held.view.answer(thread_id, checkpoint_ns, checkpoint_id)
            if isinstance(answer, thread.Underivable):
                current: Held | Fallback = Fallback("underivable")  # no look at the log for it
            else:
                current = await self._current(thread_id, held)
            if isinstance(current, Held):
                if current.view is not held.view:
                    answer = current.view.answer(thread_id, checkpoint_ns, checkpoint_id)
                if not isinstance(answer, thread.Underivable):
                    self._count("held" if current.view is held.view else "folded")
                    return Answered(answer, current if checkpoint_id is None else None)
                current = Fallback("underivable")
            reason = current.reason
        self._count("read_api", reason)
        answered = await self._from_api(thread_id, checkpoint_ns, checkpoint_id, held)
        if answered.answer is not None and self._keys is not None:
            self._keys.share(thread_id)  # unless the answer brought the key: then there is nothing to ask
        return answered

    async def history(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None, channels: list[str]
    ) -> dict[str, ChannelHistory]:
        """`get_delta_channel_history` as the read API answers it: from what the process holds when the log
        allows, else the read API's, which the process then holds (when its view is current)."""
        await self._threads.settled(thread_id)
        held = self._threads.get(thread_id)
        if (held is not None and held.view.erased) or (held is None and await self._proved_new(thread_id) is not None):
            return {channel: ChannelHistory([]) for channel in channels}
        reason = _not_local(held) or (None if _namespace(held, checkpoint_ns) is not None else "underivable")
        current: Held | Fallback | None = None
        if held is not None and reason is None:
            current = await self._current(thread_id, held)
        ns = _namespace(current, checkpoint_ns) if isinstance(current, Held) else None
        if isinstance(current, Held) and ns is not None:
            answer = ns.delta_history(checkpoint_id, channels)
            if not isinstance(answer, thread.Underivable):
                self._count("held" if held is not None and current.view is held.view else "folded")
                return answer
        self._count("read_api", current.reason if isinstance(current, Fallback) else reason or "underivable")
        body: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id}
        body["channels"] = channels
        newest = ns.newest.checkpoint_id if ns is not None and ns.newest is not None else None
        if isinstance(current, Held) and newest is not None and checkpoint_id in (None, newest):
            # The view is current: ask for its newest checkpoint by id, and hold the answer.
            by_id = {**body, "checkpoint_id": newest}
            answered = DeltaHistoryAnswer.from_wire(await self._read(DELTA_PATH, by_id, None)).history
            self._threads.learn_history(thread_id, current, checkpoint_ns, newest, answered)
            return answered
        return DeltaHistoryAnswer.from_wire(await self._read(DELTA_PATH, body, None)).history

    def _count(self, answered: str, fell_back: str | None = None) -> None:
        self.answered[answered] += 1
        if fell_back is not None:
            self.fell_back[fell_back] += 1
        telemetry.count_thread_read(answered, fell_back)

    async def _proved_new(self, thread_id: str) -> Held | None:
        """The thread as new, if the log held no record of it when this read began (its key is in neither its
        partition's key filter nor the partition's records since); it is then held so."""
        log_tail, key = self._log_tail(), self._record_key_of_thread(thread_id)
        if self.key_filters is None or self._partition_of is None or log_tail is None or key is None:
            return None
        partition = await self._partition_of(key)
        if partition is None:
            return None
        copy = await self.key_filters.of(partition)
        if copy is None or copy.may_hold(key):
            return None
        tp, start = TopicPartition(self._topic, partition), copy.through
        tail = await self._tail(tp, start)
        if tail is None:
            return None
        if not tail.complete:
            self.key_filters.drop(partition, copy)  # far behind: a fresh copy starts nearer the end
            return None
        copy.extend(start, (k for _, k in tail.keys), tail.end)
        # A record without a key (`runs.delete`, a tenant's erasure: never the unnamed tenant's) changes
        # nothing of a thread with no records.
        if any(k == key for _, k in tail.keys):
            return None
        # Never written: no operation and every namespace open, for the one-writer rule.
        new = thread.view({}, True, ledger=Ledger())
        return self._threads.install(thread_id, None, partition, new, tail.end, tail.end)

    async def _tail(self, tp: TopicPartition, start: int) -> Tail | None:
        """The partition's tail from `start`, by a fetch sent now; None when the log cannot be read (a client
        without READ on the topic stops looking at it)."""
        log_tail = self._log_tail()
        if log_tail is None:
            return None
        try:
            return (await log_tail.tails({tp: start}, self._timeout_s))[tp]
        except LogUnavailableError as exc:
            if isinstance(exc.__cause__, TopicAuthorizationFailedError | ClusterAuthorizationFailedError):
                log.warning("no READ on %s for this client (%s): reads go to the read API", tp.topic, exc.__cause__)
                self._on_log_denied()
            return None

    async def _current(self, thread_id: str, held: Held) -> Held | Fallback:
        """The snapshot as of the log's end, when the log's records of the thread since its `through` are its
        own, or others' that this process folds onto it (`others_records.py`); that is then held. A
        `Fallback`: the read API answers."""
        key = self._record_key_of_thread(thread_id)
        if key is None or held.through is None:
            return Fallback("no_hashing_key")
        tp = TopicPartition(self._topic, held.partition)
        tail = await self._tail(tp, self._threads.first_unknown(thread_id, held))
        if tail is None:
            return Fallback("log_unreadable")
        if not tail.complete:
            # The records the scan did not reach may all be this process's own (of any thread): then the
            # offsets decide, without their keys.
            if not self._threads.unchanged_by_others(thread_id, held, tail.end):
                return Fallback("incomplete_tail")
            return self._threads.advance(thread_id, held, tail.end)
        others = others_of_thread(held, tail.records, key, tail.end)
        if not others:
            return self._threads.advance(thread_id, held, tail.end)
        if self._opening is None:
            return Fallback("not_folded")
        stored = scoped_thread(self._opening.tenant, thread_id)
        view = folded(held, others, stored, self._opening)
        if view == Fallback(THREAD_KEY_NOT_HELD) and await self._thread_key(thread_id):
            view = folded(held, others, stored, self._opening)  # one ask of the key instead of the read API's get
        if isinstance(view, Fallback):
            return view
        return self._threads.folded(thread_id, held, view, tail.end)

    async def _thread_key(self, thread_id: str) -> bool:
        """Ask for the thread's own key, to seal and open its records with (`EventSealer.share`); whether the
        ask answered (within the read's deadline)."""
        asked = self._keys.share(thread_id) if self._keys is not None else None
        if asked is None:
            return False
        try:
            await asyncio.wait_for(asyncio.shield(asked), self._timeout_s)
        except Exception:  # the read API away or the subject erased: the read API's get says which
            return False
        return True

    async def _from_api(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None, held: Held | None
    ) -> Answered:
        body = {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id}
        named = held.named() if held is not None else None
        headers: dict[str, str] = {}
        if held is not None and named is not None:
            headers[OWN_WRITES_HEADER] = f"{held.partition}:{','.join(map(str, sorted(named)))}"
            if held.local and checkpoint_id is None and self._log_tail() is None:
                headers[CACHED_THROUGH_HEADER] = str(held.through)  # the read API looks at the log instead
        if self._keys is not None and self._keys.wanted(thread_id):
            headers[THREAD_KEY_HEADER] = THREAD_KEY_WANTED  # saves the ask of `share` after the answer
        answer = GetAnswer.from_wire(await self._read(GET_PATH, body, headers or None))
        if answer.thread_key is not None and self._keys is not None:
            self._keys.adopt(thread_id, answer.thread_key)
        answered = self._answered(thread_id, checkpoint_ns, checkpoint_id, held if named is not None else None, answer)
        if isinstance(answered, thread.Underivable):
            # The named records do not fold onto the answer: one naming nothing holds them all.
            answer = GetAnswer.from_wire(await self._read(GET_PATH, body, None))
            answered = self._answered(thread_id, checkpoint_ns, checkpoint_id, None, answer)
        if isinstance(answered, thread.Underivable):
            raise ReadApiError(
                200, "bad_response", f"{GET_PATH} answered what the client cannot read: {answered.reason}"
            )
        return answered

    def _answered(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str | None,
        named: Held | None,
        answer: GetAnswer,
    ) -> Answered | thread.Underivable:
        """The read API's `answer` with the named own records it lacks folded in (unless they do not fold
        onto it); holds the thread when the answer is of its newest checkpoint."""
        if answer.erased:
            self._on_erased(thread_id)
            self._threads.erased(thread_id)
            return Answered(None, None)
        partition, end = answer.log_partition, answer.log_end
        if named is not None and named.partition != partition:
            named = None  # named on another partition: the read API heeded none of them
        if answer.current and named is not None:
            current = self._threads.advance(thread_id, named, end)
            return _answered_from(current, thread_id, checkpoint_ns, checkpoint_id)
        # Naming nothing, the answer holds every record of the thread below the log's end.
        applied = answer.own_writes_from if named is not None and answer.own_writes_from is not None else end
        if checkpoint_id is not None:
            older = _older(named, answer.tuple, thread_id, checkpoint_ns, checkpoint_id, applied)
            return older if isinstance(older, thread.Underivable) else Answered(older, None)
        holding = answer.holding if answer.holding is not None else Holding({})
        later, ceilings = holding.later_writes, holding.blob_ceilings
        view = thread.from_answer(checkpoint_ns, answer.tuple, holding.namespaces, later, ceilings, answer.basis)
        # Too many writes of newer checkpoints to send: the answer stands, the thread is not held.
        installed = self._threads.install(thread_id, named, partition, view, applied, end, hold=later is not None)
        return _answered_from(installed, thread_id, checkpoint_ns, None)


def _answered_from(
    source: Held, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
) -> Answered | thread.Underivable:
    answer = source.view.answer(thread_id, checkpoint_ns, checkpoint_id)
    if isinstance(answer, thread.Underivable):
        return answer
    return Answered(answer, source if checkpoint_id is None else None)


def _not_local(held: Held | None) -> str | None:
    """Why a look at the log cannot decide a read of the thread (None: it may)."""
    if held is None:
        return "not_held"
    return None if held.local else "not_local"


def _namespace(held: Held | None, checkpoint_ns: str) -> thread.Namespace | None:
    """The namespace as held (None: not held)."""
    if held is None:
        return None
    ns = held.view.namespace(checkpoint_ns)
    return None if isinstance(ns, thread.Underivable) else ns


def _older(
    named: Held | None,
    tuple_: dict[str, Any] | None,
    thread_id: str,
    checkpoint_ns: str,
    checkpoint_id: str,
    applied: int,
) -> dict[str, Any] | thread.Underivable | None:
    """The answer for one checkpoint (not the thread's newest), with the named own records the read API's
    answer lacks applied as the projection applies them to it (`thread.apply_to_checkpoint`)."""
    view = thread.from_answer(checkpoint_ns, tuple_)
    for _, event in named.own_since(applied) if named is not None else ():
        view = thread.apply_to_checkpoint(view, event, checkpoint_ns, checkpoint_id)
    return view.answer(thread_id, checkpoint_ns, checkpoint_id)
