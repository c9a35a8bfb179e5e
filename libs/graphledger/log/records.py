"""A Kafka record, and a partition's records from an offset to its end: the one record type and the one tail
type of every reader of the log (client, projector, replay, read API, log copier)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphledger.quick_init import quick_init

Header = tuple[str, bytes]


@quick_init
@dataclass(frozen=True, slots=True)
class LogRecord:
    """One Kafka record: where it is in the log and what it carries."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    timestamp: int = -1
    """The record's Kafka timestamp in ms (-1: none): the broker's append time on the source topics
    (`message.timestamp.type=LogAppendTime`), so its event's time (`append_time_ms`); the
    write-to-visible metric starts here too."""

    @classmethod
    def consumed(cls, record: Any) -> LogRecord:
        """A record as aiokafka's consumer gives it (`ConsumerRecord`)."""
        headers = tuple(record.headers or ())
        return cls(record.topic, record.partition, record.offset, record.key, record.value, headers, record.timestamp)

    @property
    def size(self) -> int:
        """Bytes of its key and value."""
        return len(self.value or b"") + len(self.key or b"")


@dataclass(frozen=True, slots=True)
class Tail:
    """What the log of one partition holds from `start` to its end, `end` (the high watermark): its
    records (all of them, or a key's and the keyless ones), in offset order."""

    start: int
    end: int
    records: tuple[LogRecord, ...]
    complete: bool = True
    """Whether `records` covers all of `[start, end)` (a scan stops at a bound)."""

    @property
    def keys(self) -> tuple[tuple[int, bytes | None], ...]:
        """`(offset, key)` of each record: what a look at who wrote since needs."""
        return tuple((r.offset, r.key) for r in self.records)
