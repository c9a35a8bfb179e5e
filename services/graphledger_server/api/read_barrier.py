"""What the projection must have applied before a read runs, found in the log (invariant 5).

A read reflects every write acknowledged to any process before it began. The read API learns where
each partition's log ends with a fetch sent after the read arrived (`log_tail`), and then:
- a read of one thread (or one store item) looks at the keys of the partition's records the projection
  has not applied yet: if none is the thread's, the projection already holds everything the read must
  reflect and it runs at once; else it waits until the projection has applied the last of them.
  Records without a key (`runs.delete`, published to every partition) count as the thread's.
  The client may name its own records among them (`OwnWrites`): those it adds to the answer itself,
  so only the others are waited for, and the answer says from which offset on the projection may lack
  the client's own writes (`own_writes_from`);
- a read across threads, or a store search or listing, waits until the projection has reached the end
  of every partition of the topic.
A consistency token the read also carries must name offsets within the log (`token_bounds`). When the
projection cannot get there within `consistency_timeout_s` the read fails with a retryable 503, never
with an older answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiokafka import TopicPartition

from graphledger.errors import LogUnavailableError
from graphledger.log_tail import LogTail
from graphledger.settings import Settings
from graphledger_server.api.consistency import await_applied
from graphledger_server.api.token_bounds import check_within_log, unapplied_parts
from graphledger_server.api.wait_slots import WaitSlots
from graphledger_server.log.applied import AppliedOffsets

Token = dict[tuple[str, int], int]


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


class ReadBarrier:
    """Holds reads until the projection reflects what the log held when they began."""

    def __init__(self, settings: Settings, log: LogTail, offsets: AppliedOffsets, slots: WaitSlots) -> None:
        self._settings = settings
        self._log = log
        self._offsets = offsets
        self._slots = slots

    async def before_keyed(
        self, reads: list[KeyedRead], token: Token | None = None, *, tenant: str
    ) -> dict[KeyedRead, Settled]:
        """Wait, in one of `tenant`'s wait slots, until the projection reflects every record of the reads'
        keys now in the log (less each read's `own`); returns where each read's partition stood then."""
        deadline = time.monotonic() + self._settings.consistency_timeout_s
        async with _log_deadline(deadline):
            partitions = {read: TopicPartition(read.topic, await self._log.partition_of(read.topic, read.key))
                          for read in reads}  # fmt: skip
            applied = self._positions(partitions.values())
            starts = dict(applied)
            for read, tp in partitions.items():
                if read.cached_through is not None:
                    starts[tp] = min(starts[tp], read.cached_through)
            pending = await unapplied_parts(token or {}, self._settings, self._offsets, self._log)
            # The token's other partitions' ends come in the same fetch round as the tails.
            tails, other_ends = await asyncio.gather(
                self._log.tails(starts, self._remaining(deadline)),
                self._log.ends(self._positions(pending.keys() - starts.keys()), self._remaining(deadline)),
            )
        check_within_log(pending, {**{tp: tail.end for tp, tail in tails.items()}, **other_ends})
        need: Token = dict(token or {})
        current: dict[KeyedRead, bool] = {}
        for read, tp in partitions.items():
            tail = tails[tp]
            own = read.own.offsets if read.own is not None and read.own.partition == tp.partition else frozenset()
            keyed = [o for o, key in tail.keys if key == read.key or key is None]
            since = read.cached_through
            current[read] = (
                tail.complete
                and since is not None
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
            if others:
                _require(need, tp, max(others))
        await await_applied(need, self._offsets, self._settings, self._remaining(deadline), self._slots, tenant)
        return {
            read: Settled(tp.partition, self._offsets.applied(tp.topic, tp.partition), tails[tp].end, current[read])
            for read, tp in partitions.items()
        }

    async def before_topic(self, topic: str, token: Token | None = None, *, tenant: str) -> None:
        """Wait, in one of `tenant`'s wait slots, until the projection has reached the end every partition
        of `topic` had on arrival."""
        deadline = time.monotonic() + self._settings.consistency_timeout_s
        async with _log_deadline(deadline):
            count = await self._log.partition_count(topic)
            starts = self._positions(TopicPartition(topic, p) for p in range(count))
            pending = await unapplied_parts(token or {}, self._settings, self._offsets, self._log)
            ends = await self._log.ends({**starts, **self._positions(pending)}, self._remaining(deadline))
        check_within_log(pending, ends)
        need: Token = dict(token or {})
        for tp, start in starts.items():
            if ends[tp] > start:
                _require(need, tp, ends[tp] - 1)
        await await_applied(need, self._offsets, self._settings, self._remaining(deadline), self._slots, tenant)

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


def _require(need: Token, tp: TopicPartition, offset: int) -> None:
    """Record that the projection must apply `tp` up to and including `offset`."""
    key = (tp.topic, tp.partition)
    need[key] = max(need.get(key, -1), offset)
