"""What a read must reflect, found in the log, and the waits for the projection to reflect it (invariant 5).

A read reflects every write acknowledged to any process before it began. The read API learns where
each partition's log ends with a fetch sent after the read arrived, and then:
- a read of one thread (or one store item) looks at the partition's records the projection has not
  applied yet, as the read API holds them (`unprojected.py`; without them, the keys of a scan of the
  tail): if none is the key's, the projection already holds everything the read must reflect; else,
  asked `through`, the read gets them to fold (`Settled.tail`, `read_through.py`) and waits only if it
  cannot (`wait`), and otherwise it waits until the projection has applied the last of them. Records
  without a key (`runs.delete`, erasures, published to every partition) count as the key's. The client
  may name its own records among them (`OwnWrites`): a read that waits does not wait for those, and the
  answer says from which offset on the projection may lack them (`own_writes_from`);
- a read across threads, or a store search or listing, waits until the projection has reached the end
  of every partition of the topic.
A consistency token the read also carries must name offsets within the log (`tokens.py`). When the
projection cannot get there within `consistency_timeout_s` the read fails with a retryable 503 saying
why it waited, never with an older answer. A keyed read whose key is parked (`log/parked.py`: a record of
it no projector version can apply holds it and its later records) fails with a retryable 503
`subject_parked` naming the parking, once its partition is applied as far as the read needs: the
projection lacks the records the subject holds, and nothing folded onto it can stand in for them. A
parked subject holds no other read: its partition's offset moves past its records.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

from aiokafka import TopicPartition

from graphledger.errors import LogUnavailableError
from graphledger.log.records import Tail
from graphledger.log.tail import LogTail
from graphledger.settings import Settings
from graphledger.wire import Token
from graphledger_server.api.consistency.applied_wait import await_applied
from graphledger_server.api.consistency.tokens import check_within_log, unapplied_parts
from graphledger_server.api.consistency.unprojected import Unprojected
from graphledger_server.api.consistency.wait_slots import WaitSlots
from graphledger_server.api.errors import ApiError
from graphledger_server.log.applied import AppliedOffsets


@dataclass(frozen=True, slots=True)
class OwnWrites:
    """The reading client's own acknowledged records of the thread: a partition and offsets on it."""

    partition: int
    offsets: frozenset[int]

    @classmethod
    def parse(cls, header: str) -> OwnWrites:
        """`<partition>:<offset>,<offset>,...`; raises ValueError naming what is malformed."""
        partition, _, offsets = header.partition(":")
        try:
            parsed = cls(int(partition), frozenset(int(o) for o in offsets.split(",") if o.strip()))
        except ValueError:
            raise ValueError(f"{header[:80]!r} is not <partition>:<offset>,<offset>,...") from None
        if parsed.partition < 0 or any(o < 0 for o in parsed.offsets):
            raise ValueError(f"{header[:80]!r} holds a negative partition or offset")
        return parsed


@dataclass(frozen=True, slots=True)
class KeyedRead:
    """A read of everything one record key addresses: a thread, or a store item."""

    topic: str
    key: bytes
    own: OwnWrites | None = None
    cached_through: int | None = None
    """With `own`: the client holds the answer as of this offset; if no record but its own came since,
    the read needs no answer from Postgres (`Settled.current`)."""


@dataclass(frozen=True, slots=True)
class Settled:
    """Where a keyed read's partition stood once the read could run."""

    partition: int
    applied: int
    """The projection's next offset on it: the read's answer holds every record below."""
    end: int
    """The log's end when the read arrived: the answer reflects every record of the key below it."""
    current: bool = False
    """Every record of the key since `cached_through` is the client's own: its kept answer is current."""
    tail: Tail | None = None
    """Asked `through`: the key's records below `end` that the read API holds; the read folds those the
    projection has not applied (`read_through.py`), or `wait`s for them (`need`)."""
    need: int | None = None
    """With `tail`: the last record of the key (less the client's own) the projection had not applied
    when the read arrived (None: none)."""
    deadline: float = 0.0
    """The read's deadline (`time.monotonic()`)."""
    key: bytes = b""
    """The read's record key."""


class ReadBarrier:
    """Holds reads until the projection reflects what the log held when they began."""

    def __init__(
        self,
        settings: Settings,
        log: LogTail,
        offsets: AppliedOffsets,
        slots: WaitSlots,
        unprojected: Unprojected | None = None,
    ) -> None:
        self._settings = settings
        self._log = log
        self._offsets = offsets
        self._slots = slots
        self._unprojected = unprojected

    async def before_keyed(
        self, reads: list[KeyedRead], token: Token | None = None, *, tenant: str, through: bool = False
    ) -> dict[KeyedRead, Settled]:
        """Wait, in one of `tenant`'s wait slots, until the projection reflects every record of the reads'
        keys now in the log (less each read's `own`); returns where each read's partition stood then.

        `through`: a read whose key's unprojected records the read API holds does not wait for them; its
        `Settled` carries them (`tail`, `need`), and the caller folds them or `wait`s."""
        deadline = time.monotonic() + self._settings.consistency_timeout_s
        async with _log_deadline(deadline):
            partitions = {read: TopicPartition(read.topic, await self._log.partition_of(read.topic, read.key))
                          for read in reads}  # fmt: skip
            applied = self._positions(partitions.values())
            pending = await unapplied_parts(token or {}, self._settings, self._offsets, self._log)
            # The token's other partitions' ends are fetched while the reads' records are.
            elsewhere = self._positions(pending.keys() - set(partitions.values()))
            kept_tails, other_ends = await asyncio.gather(
                self._kept_tails(partitions, deadline),
                self._log.ends(elsewhere, self._remaining(deadline)) if elsewhere else _none(),
            )
            starts = {tp: applied[tp] for read, tp in partitions.items() if kept_tails[read] is None}
            for read, tp in partitions.items():
                if kept_tails[read] is None and read.cached_through is not None:
                    starts[tp] = min(starts[tp], read.cached_through)
            tails = await self._log.tails(starts, self._remaining(deadline)) if starts else {}
        ends = {**{tp: h.end for read, tp in partitions.items() if (h := kept_tails[read]) is not None}}
        check_within_log(pending, {**ends, **{tp: tail.end for tp, tail in tails.items()}, **other_ends})
        need: Token = dict(token or {})
        current: dict[KeyedRead, bool] = {}
        folded: dict[KeyedRead, int | None] = {}
        for read, tp in partitions.items():
            kept = kept_tails[read]
            tail = kept if kept is not None else tails[tp]
            own = read.own.offsets if read.own is not None and read.own.partition == tp.partition else frozenset()
            keyed = [o for o, key in tail.keys if key == read.key or key is None]
            since = read.cached_through
            current[read] = (
                tail.complete
                and since is not None
                and since >= tail.start
                and read.own is not None
                and read.own.partition == tp.partition
                and since <= tail.end
                and all(o in own for o in keyed if o >= since)
            )
            if current[read]:
                continue
            if tail.complete:
                others = [o for o in keyed if o >= applied[tp] and o not in own]
            else:  # too far behind to look at every key: the whole tail counts
                others = [tail.end - 1]
            if through and kept is not None:
                folded[read] = max(others, default=None)  # the caller folds them, or waits for them
            elif others:
                _require(need, tp, max(others))
        unkept = through and any(kept_tails[read] is None for read in partitions)
        await self._await(need, deadline, tenant, why=self._unkept_reason() if unkept else None)
        for read, tp in partitions.items():
            self._refuse_parked(tp, read.key)
        return {
            read: Settled(
                tp.partition,
                self._offsets.applied(tp.topic, tp.partition),
                kept.end if (kept := kept_tails[read]) is not None else tails[tp].end,
                current[read],
                kept_tails[read] if read in folded else None,
                folded.get(read),
                deadline,
                read.key,
            )
            for read, tp in partitions.items()
        }

    async def partition_of(self, topic: str, key: bytes) -> int:
        return await self._log.partition_of(topic, key)

    async def wait(self, settled: Settled, topic: str, *, tenant: str) -> Settled:
        """Wait until the projection applied what a read `through` found unapplied (`settled.need`)."""
        if settled.need is None:
            return settled
        why = (
            "a record of it needs rows only the projection holds (a copy onto it, delete_for_runs, prune, an expiry: "
            "docs/architecture.md, Consistency)"
        )
        await self._await({(topic, settled.partition): settled.need}, settled.deadline, tenant, why=why)
        self._refuse_parked(TopicPartition(topic, settled.partition), settled.key)
        return replace(settled, applied=self._offsets.applied(topic, settled.partition), tail=None, need=None)

    async def applied_through(self, topic: str, partition: int, offset: int, key: bytes, *, tenant: str) -> None:
        """Wait until the projection applied `topic:partition:offset`; a 400 when the offset is at or beyond
        the log's end (no record of the caller's is there: it could never be applied), a 503 when `key`'s
        records are parked there (the record at `offset` is then undecided)."""
        deadline = time.monotonic() + self._settings.consistency_timeout_s
        tp = TopicPartition(topic, partition)
        if self._offsets.applied(topic, partition) <= offset:
            async with _log_deadline(deadline):
                end = (await self._log.ends(self._positions((tp,)), self._remaining(deadline)))[tp]
            if offset >= end:
                why = f"{topic}:{partition}:{offset} is beyond the log's end ({end}): it names no record"
                raise ApiError(400, "beyond_log_end", why)
        await self._await({(topic, partition): offset}, deadline, tenant, why=None)
        self._refuse_parked(tp, key)

    def _refuse_parked(self, tp: TopicPartition, key: bytes) -> None:
        """A 503 `subject_parked` when `key`'s records on `tp` are parked (as the offsets watcher last read)."""
        subject = self._offsets.parked(tp.topic, tp.partition, key)
        if subject is not None:
            raise ApiError(
                503,
                "subject_parked",
                f"the subject read is parked at {subject}: a record of it no projector version can apply holds "
                "it and its later records until an operator releases or drops it (`graphledger parked list`), so "
                "no answer would reflect them; retry once it is released",
                retryable=True,
            )

    async def _await(self, need: Token, deadline: float, tenant: str, *, why: str | None) -> None:
        """`await_applied` within the read's deadline; a timeout says `why` the read waited at all."""
        try:
            await await_applied(need, self._offsets, self._settings, self._remaining(deadline), self._slots, tenant)
        except ApiError as exc:
            if why is not None and exc.code == "consistency_timeout":
                exc.message += f"; the read waited for the projector because {why}"
            raise

    def _unkept_reason(self) -> str:
        unprojected = self._unprojected
        if unprojected is None or not unprojected.enabled:
            return "read-through is off (GRAPHLEDGER_API_READ_THROUGH_MAX_BYTES 0)"
        if unprojected.full:
            return (
                f"the read API holds GRAPHLEDGER_API_READ_THROUGH_MAX_BYTES ({unprojected.max_bytes}) of unprojected "
                "records and reads no more until the projector applies them"
            )
        if not unprojected.offsets_known:
            return "the read API does not know the projection's applied offsets yet (its watcher is connecting)"
        return "the read API could not read the unprojected records up to the log's end"

    async def _kept_tails(
        self, partitions: dict[KeyedRead, TopicPartition], deadline: float
    ) -> dict[KeyedRead, Tail | None]:
        """Each read's key's records as the read API keeps them up to the log's end (None: not all kept)."""
        unprojected = self._unprojected
        if unprojected is None or not unprojected.enabled:
            return dict.fromkeys(partitions)
        found = await asyncio.gather(
            *(unprojected.tail(tp, read.key, self._remaining(deadline)) for read, tp in partitions.items())
        )
        return dict(zip(partitions, found, strict=True))

    async def positions(self, topic: str) -> dict[TopicPartition, int]:
        """Where the projection stands on every partition of `topic` now (`before_topic`'s `since`)."""
        count = await self._log.partition_count(topic)
        return self._positions(TopicPartition(topic, p) for p in range(count))

    async def before_topic(
        self, topic: str, token: Token | None = None, *, tenant: str, since: dict[TopicPartition, int] | None = None
    ) -> bool:
        """Wait, in one of `tenant`'s wait slots, until the projection has reached the end every partition
        of `topic` had on arrival; returns whether it had already reached it at `since` (`positions` taken
        before the call; by default, when it began): then a read of the projection that began after
        `since` was taken reflects the log's end as well."""
        deadline = time.monotonic() + self._settings.consistency_timeout_s
        async with _log_deadline(deadline):
            starts = since if since is not None else await self.positions(topic)
            pending = await unapplied_parts(token or {}, self._settings, self._offsets, self._log)
            ends = await self._log.ends({**starts, **self._positions(pending)}, self._remaining(deadline))
        check_within_log(pending, ends)
        need: Token = dict(token or {})
        behind = False
        for tp, start in starts.items():
            if ends[tp] > start:
                _require(need, tp, ends[tp] - 1)
                behind = True
        await self._await(need, deadline, tenant, why=None)
        return not behind

    def _positions(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Where the projection stands on each partition: the offsets to fetch from."""
        return {tp: self._offsets.applied(tp.topic, tp.partition) for tp in partitions}

    @staticmethod
    def _remaining(deadline: float) -> float:
        return max(0.001, deadline - time.monotonic())


@asynccontextmanager
async def _log_deadline(deadline: float) -> AsyncIterator[None]:
    """The log's part of a read within its deadline: a broker that does not answer is a retryable 503."""
    try:
        async with asyncio.timeout_at(asyncio.get_running_loop().time() + (deadline - time.monotonic())):
            yield
    except TimeoutError:
        raise LogUnavailableError("Kafka did not tell where the log ends before the read's deadline; retry") from None


async def _none() -> dict[TopicPartition, int]:
    return {}


def _require(need: Token, tp: TopicPartition, offset: int) -> None:
    """Record that the projection must apply `tp` up to and including `offset`."""
    key = (tp.topic, tp.partition)
    need[key] = max(need.get(key, -1), offset)
