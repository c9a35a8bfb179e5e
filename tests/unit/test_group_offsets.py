"""`GroupOffsetMirror`: the applied offsets reach the group in Kafka newest first, one commit at a time,
and a commit that fails or hangs is counted and logged without holding anything up. A stand-in
consumer records the commits; tests/integration/test_kafka_group_offsets.py does it against tansu."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError

from graphledger_server.projector import group_offsets
from graphledger_server.projector.group_offsets import GroupOffsetMirror

T0, T1, OTHER = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("t", 2)


class Consumer:
    """What the mirror uses of an AIOKafkaConsumer: `assignment()` and `commit(offsets)`."""

    def __init__(self, assigned: set[TopicPartition]) -> None:
        self.assigned = assigned
        self.commits: list[dict[TopicPartition, int]] = []
        self.gate: asyncio.Event | None = None  # set: commits wait for it
        self.fail: BaseException | None = None
        self.entered = asyncio.Event()

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits.append(dict(offsets))
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail


@pytest.fixture
def failures(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    counted: list[str] = []
    monkeypatch.setattr(group_offsets, "offset_commit_failed", lambda exc: counted.append(type(exc).__name__))
    return counted


async def test_offsets_are_coalesced_while_a_commit_is_in_flight_and_only_assigned_ones_go(
    failures: list[str],
) -> None:
    consumer = Consumer({T0, T1})
    consumer.gate = asyncio.Event()
    mirror = GroupOffsetMirror(consumer)
    mirror.submit({("t", 0): 5})
    await consumer.entered.wait()  # the first commit is in flight, held at the gate
    mirror.submit({("t", 0): 7, ("t", 2): 3})
    mirror.submit({("t", 0): 9, ("t", 1): 4})
    mirror.forget({T1})  # revoked before it went out
    consumer.gate.set()
    await mirror.close()
    assert consumer.commits == [{T0: 5}, {T0: 9}]  # newest per partition; t:2 is not assigned, t:1 revoked
    assert failures == []


async def test_a_failed_commit_is_counted_and_logged_once_and_the_next_one_goes_out(
    failures: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=group_offsets.__name__)
    consumer = Consumer({T0})
    consumer.fail = CommitFailedError("the group rebalanced")
    mirror = GroupOffsetMirror(consumer)
    for offset in (1, 2):
        mirror.submit({("t", 0): offset})
        await mirror.close()
    assert failures == ["CommitFailedError", "CommitFailedError"]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "the projection is not affected" in warnings[0]
    consumer.fail = None
    mirror.submit({("t", 0): 3})
    await mirror.close()
    assert consumer.commits[-1] == {T0: 3} and len(failures) == 2


async def test_a_commit_that_hangs_times_out_as_a_failure(failures: list[str]) -> None:
    consumer = Consumer({T0})
    consumer.gate = asyncio.Event()  # never set: the coordinator never answers
    mirror = GroupOffsetMirror(consumer, timeout_s=0.05)
    mirror.submit({("t", 0): 1})
    await mirror.close()  # waits for the commit in flight, which gives up after its timeout
    assert failures == ["TimeoutError"]


async def test_commits_coming_within_the_interval_go_out_as_one_after_it_or_at_close(failures: list[str]) -> None:
    consumer = Consumer({T0, T1})
    mirror = GroupOffsetMirror(consumer, interval_s=3600)
    mirror.submit({("t", 0): 5})
    await consumer.entered.wait()
    for offsets in ({("t", 0): 7}, {("t", 1): 2}, {("t", 0): 9}):
        mirror.submit(offsets)
        for _ in range(10):  # every turn the drain task could take
            await asyncio.sleep(0)
    assert consumer.commits == [{T0: 5}]  # the interval runs: nothing more goes out
    await mirror.close()
    assert consumer.commits == [{T0: 5}, {T0: 9, T1: 2}]
    assert failures == []
