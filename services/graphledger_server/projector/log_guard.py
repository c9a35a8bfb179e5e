"""Notice that the log lost records the projection already applied, instead of silently moving on.

A broker that loses its log (tansu keeps it in memory; an unclean leader election; a deleted and
recreated topic) starts the partition again at offset 0, while `graphledger_offsets` still says the
projection applied up to N. Resetting to the log's beginning, as a consumer does by default, would
skip the new records below N as "applied before": silent loss. So a worker stops such a partition,
logs why with the command that resumes it, and reports it in `graphledger.projector.partitions.stopped`.

Two signals, because brokers differ:
- Kafka answers a fetch beyond the log end with OFFSET_OUT_OF_RANGE; the consumer runs with
  `auto_offset_reset="none"`, so that surfaces as `OffsetOutOfRangeError` (`out_of_range`).
- tansu answers it with an empty fetch and no error, but its fetch responses carry a correct high
  watermark (its ListOffsets answer runs low, so it is not used): a position beyond the high
  watermark, still there in fetch responses `confirm_s` apart, means the same (`beyond_end`). The
  wait lets a new partition leader's high watermark catch up before anything is stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition

log = logging.getLogger(__name__)

CONFIRM_S = 2.0
"""How long a position beyond the high watermark must persist before the partition is stopped."""


@dataclass
class LogGuard:
    """Per worker: positions it fetches from, suspicions, and the partitions it stopped (at which offset)."""

    confirm_s: float = CONFIRM_S
    positions: dict[TopicPartition, int] = field(default_factory=dict)
    """Next offset each partition fetches from, as far as the worker set or consumed it."""
    stopped: dict[TopicPartition, int] = field(default_factory=dict)
    _suspect_since_ms: dict[TopicPartition, int] = field(default_factory=dict)

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """Partitions revoked or sought anew: whatever was known about them is stale."""
        for tp in partitions:
            self.positions.pop(tp, None)
            self.stopped.pop(tp, None)
            self._suspect_since_ms.pop(tp, None)

    def beyond_end(self, consumer: AIOKafkaConsumer) -> dict[TopicPartition, tuple[int, int]]:
        """Partitions whose position has stayed beyond the fetched high watermark for `confirm_s`:
        `{tp: (position, high watermark)}`."""
        lost = {}
        for tp in consumer.assignment():
            position = self.positions.get(tp)
            high = consumer.highwater(tp)
            seen_ms = consumer.last_poll_timestamp(tp)
            if tp in self.stopped or position is None or high is None or seen_ms is None or position <= high:
                self._suspect_since_ms.pop(tp, None)
                continue
            since = self._suspect_since_ms.setdefault(tp, seen_ms)
            if seen_ms - since >= self.confirm_s * 1000:
                lost[tp] = (position, high)
        return lost

    def stop(self, tp: TopicPartition, position: int, evidence: str, group: str) -> None:
        self.stopped[tp] = position
        self._suspect_since_ms.pop(tp, None)
        log.error(
            "stopping partition %s:%d: the projection applied up to offset %d but %s; the broker lost records "
            "(restarted without its log, or the topic was recreated). Nothing after it is applied until an "
            "operator decides: `graphledger offsets reset --group %s --topic %s --partition %d --to earliest "
            "--yes` re-applies the log as it is now (see docs/operations-faults.md)",
            tp.topic, tp.partition, position, evidence, group, tp.topic, tp.partition,
        )  # fmt: skip

    def reset(self, stored: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Stopped partitions whose stored offset an operator changed: `{tp: new offset}`, unstopped."""
        moved = {tp: offset for tp, offset in stored.items() if tp in self.stopped and offset != self.stopped[tp]}
        for tp, offset in moved.items():
            del self.stopped[tp]
            self.positions[tp] = offset
        return moved
