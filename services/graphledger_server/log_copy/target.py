"""The target: what earlier runs wrote to a new topic, from its records' `gl-copy-of` headers."""

from __future__ import annotations

import logging
from array import array
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord

from graphledger.errors import GraphledgerError
from graphledger.events.checkpoint import ThreadCopy
from graphledger.events.chunks import parse_header
from graphledger.events.envelope import HEADER_CHUNK, HEADER_TYPE, header
from graphledger.log.tail import LogTail
from graphledger.settings import Settings
from graphledger_server.log_copy.source import FETCH_WAIT_MS, Position

log = logging.getLogger(__name__)

HEADER_COPY_OF = "gl-copy-of"
"""On every record the copy writes: `<partition>:<offset>` of the event's (last) record in the
source topic of the same name, which tells a later run what is copied already."""


@dataclass(slots=True)
class _Written:
    copy_of: Position
    count: int
    indexes: set[int]
    key: bytes | None
    event_type: bytes | None
    last: Position


class Copied:
    """What earlier runs wrote to one target topic, from its records' `gl-copy-of` headers."""

    def __init__(self, ends: dict[int, int]) -> None:
        self._ends = ends
        self._keyed = {p: array("H", bytes(2 * end)) for p, end in ends.items()}
        """Per source partition and offset: 1 + the target partition holding the keyed event there, whole
        (0: none). Two bytes per source record."""
        self.broadcasts: dict[Position, set[int]] = {}
        """Keyless events: the target partitions holding each."""
        self.torn: set[Position] = set()
        """Events only some of whose chunks are in the target: written again under a new chunk id."""
        self.copies: dict[Position, Position] = {}
        """Where each `thread.copy` was written: source position -> target position of its last record."""

    def keyed_in(self, source: Position) -> int | None:
        """The target partition holding the keyed event at `source`, whole; None when it is not there."""
        p, o = source
        q = self._keyed[p][o] - 1 if p in self._keyed and 0 <= o < len(self._keyed[p]) else -1
        return None if q < 0 else q

    def _mark(self, source: Position, target: Position, key: bytes | None, event_type: bytes | None) -> None:
        p, o = source
        if not 0 <= o < self._ends.get(p, 0):
            raise GraphledgerError(
                f"the target holds a copy of source position {p}@{o}, which the source does not hold: "
                "it is the copy of another log; choose another --to-prefix"
            )
        if key is None:
            self.broadcasts.setdefault(source, set()).add(target[0])
        else:
            self._keyed[p][o] = target[0] + 1
        if event_type == ThreadCopy.TYPE.encode():
            self.copies[source] = target

    @classmethod
    async def read(
        cls,
        consumer: AIOKafkaConsumer,
        tail: LogTail,
        topic: str,
        partitions: list[int],
        source_ends: dict[int, int],
        settings: Settings,
    ) -> Copied:
        """Read `topic` (the target) to its end; refuses a record this command did not write."""
        copied = cls(source_ends)
        ends = await tail.ends({TopicPartition(topic, p): 0 for p in partitions}, settings.consistency_timeout_s)
        wanted = {tp: end for tp, end in ends.items() if end > 0}
        if not wanted:
            return copied
        consumer.assign(list(wanted))
        await consumer.seek_to_beginning(*wanted)
        chunked: dict[tuple[int, str], _Written] = {}
        left = dict(wanted)
        while left:
            fetched = await consumer.getmany(*left, timeout_ms=FETCH_WAIT_MS)
            for tp, records in fetched.items():
                for r in records:
                    if r.offset < wanted[tp]:
                        copied._add(r, chunked)
            for tp in list(left):
                if await consumer.position(tp) >= wanted[tp]:
                    del left[tp]
        partial = []
        for written in chunked.values():
            if len(written.indexes) == written.count:
                copied._mark(written.copy_of, written.last, written.key, written.event_type)
            else:
                partial.append(written.copy_of)
        # An event a later run wrote whole, after an earlier one wrote some of its chunks, is copied.
        copied.torn = {s for s in partial if copied.keyed_in(s) is None and s not in copied.broadcasts}
        log.info("%s holds %d records of an earlier run", topic, sum(wanted.values()))
        return copied

    def _add(self, r: ConsumerRecord[bytes, bytes], chunked: dict[tuple[int, str], _Written]) -> None:
        headers = list(r.headers or ())
        raw = header(headers, HEADER_COPY_OF)
        try:
            p, o = (int(part) for part in (raw or b"").decode().split(":"))
        except ValueError:
            raise GraphledgerError(
                f"{r.topic}:{r.partition}@{r.offset} holds a record the copy did not write (no {HEADER_COPY_OF} "
                "header): the target topics are in use; choose another --to-prefix"
            ) from None
        event_type = header(headers, HEADER_TYPE)
        chunk_header = header(headers, HEADER_CHUNK)
        if chunk_header is None:
            self._mark((p, o), (r.partition, r.offset), r.key, event_type)
            return
        ref = parse_header(chunk_header)
        written = chunked.setdefault(
            (r.partition, ref.event_id), _Written((p, o), ref.count, set(), r.key, event_type, (r.partition, r.offset))
        )
        written.indexes.add(ref.index)
        written.last = (r.partition, r.offset)
