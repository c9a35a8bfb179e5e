"""Offsets a fetch passes over are fetched again, not read past (`graphledger/log/gaps.py`): in the
projector's batches and in the log tail's pages."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from graphledger.log.gaps import GapWatch
from graphledger.log.tail import LogRecord, LogTail
from graphledger.settings import Settings
from graphledger_server.projector.worker import ProjectorWorker
from manual_clock import ManualClock

TP = TopicPartition("t.checkpoints", 0)


def test_a_gap_is_fetched_again_until_it_has_persisted_then_read_past() -> None:
    clock = ManualClock()
    told: list[bool] = []
    gaps = GapWatch(confirm_s=2.0, clock=clock, on_gap=told.append)
    assert not gaps.may_pass(TP, 5, 7)
    clock.now += 1.9
    assert not gaps.may_pass(TP, 5, 7)
    assert told == [False]  # once when met, not at every fetch again
    clock.now += 0.2
    assert gaps.may_pass(TP, 5, 7)
    assert told == [False, True]
    assert not gaps.may_pass(TP, 5, 7)  # a new gap at the same place waits again
    gaps.forget(TP)
    clock.now += 5
    assert not gaps.may_pass(TP, 5, 7)


def _record(offset: int) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(TP.topic, TP.partition, offset, 0, 0, b"k", b"v", None, 1, 1, ())


class _Consumer:
    """Answers each `getmany` with the next scripted offsets, or those from where it was sought."""

    def __init__(self, answers: list[list[int]]) -> None:
        self.answers = answers
        self.seeks: list[int] = []

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[TopicPartition, Any]:
        if not self.answers:
            return {}
        return {TP: [_record(o) for o in self.answers.pop(0)]}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append(offset)

    def assignment(self) -> set[TopicPartition]:
        return {TP}

    def paused(self) -> set[TopicPartition]:
        return set()

    def highwater(self, tp: TopicPartition) -> int:
        return 100

    def last_poll_timestamp(self, tp: TopicPartition) -> int:
        return 0


async def test_the_projector_fetches_again_from_the_first_offset_a_fetch_passed_over() -> None:
    """tansu can answer a fetch near a partition's end with a later batch before an earlier one is readable:
    taking it would lose the earlier records for good."""
    worker = ProjectorWorker(Settings(batch_max_wait_ms=50))
    consumer = _Consumer([[5, 6, 8, 9], [7, 8, 9]])
    worker.consumer = consumer  # type: ignore[assignment]
    worker.guard.positions[TP] = 5
    worker._parked_checked = time.monotonic()  # no parked subjects to count here
    records = await worker.next_batch(asyncio.Event())
    assert [r.offset for r in records] == [5, 6, 7, 8, 9]
    assert consumer.seeks == [7]


def test_a_log_tail_page_ends_where_the_fetch_passed_over_offsets() -> None:
    tail = LogTail(Settings())
    records = [LogRecord(TP.topic, TP.partition, o, b"k", b"v", (), 0) for o in (3, 4, 5, 7, 8)]
    assert [r.offset for r in tail._contiguous(TP, 4, records)] == [3, 4, 5]
    assert [r.offset for r in tail._contiguous(TP, 7, records[3:])] == [7, 8]
