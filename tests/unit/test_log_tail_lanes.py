"""A fetch reads each partition from one position, so the reads that share it must want pages from about
the same place: the read API's reads of whole records from where it has read (`pages`) go in a lane of
their own, apart from the fetches from the projection's positions (`ends`, `tails`), which may lie far
behind (a stopped projector)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.protocol.api import RequestStruct, Response

from graphledger.log.tail import LogTail
from graphledger.settings import Settings
from kafka_wire import Cluster, Wire, record_batch

TOPIC = "gl.checkpoints"
P0 = TopicPartition(TOPIC, 0)
FETCH, METADATA = 1, 3
END = 5000
"""The partition's high watermark."""
BATCH = 3
"""Records a fetch answers from its position (a page far shorter than the distance between the lanes)."""


def metadata(node: int, request: RequestStruct) -> Response:
    partitions = [(0, 0, 1, 0, [1], [1], [])]  # partition 0 led by node 1 at epoch 0
    topics = [(0, TOPIC, False, partitions)]
    return request.RESPONSE_TYPE(0, [(1, "k1", 9092, None)], "c", 1, topics)


def fetch(node: int, request: RequestStruct) -> Response:
    """`BATCH` records from each partition's fetch position on, and the end."""
    topics = []
    for topic in request.to_object()["topics"]:
        partitions = []
        for p in topic["partitions"]:
            batch = record_batch([(b"k", b"v")] * BATCH, base_offset=p["fetch_offset"])
            partitions.append((p["partition"], 0, END, END, 0, [], batch))
        topics.append((topic["topic"], partitions))
    return request.RESPONSE_TYPE(0, 0, 0, topics)


def wire() -> Wire:
    wire = Wire(cluster=Cluster({TOPIC: 1}))
    wire.handlers = {METADATA: metadata, FETCH: fetch}
    return wire


def fetched_from(wire: Wire) -> list[int]:
    return sorted(p["fetch_offset"] for sent in wire.of(FETCH) for p in sent.obj()["topics"][0]["partitions"])


async def test_a_page_asked_with_an_end_from_far_behind_comes_from_its_own_position() -> None:
    wire_ = wire()
    tail = LogTail(Settings(topic_prefix="gl"), wire_)  # type: ignore[arg-type]  # a recorded wire, not a client
    ends, pages = await asyncio.gather(tail.ends({P0: 10}, 1), tail.pages({P0: 4000}, 1))
    assert ends == {P0: END}
    assert [r.offset for r in pages[P0].records] == [4000, 4001, 4002]  # no end seen past it: asked there
    assert pages[P0].end == END
    assert fetched_from(wire_) == [10, 4000]  # two fetches, each from its own lane's position


async def test_reads_of_one_lane_still_share_a_fetch() -> None:
    wire_ = wire()
    tail = LogTail(Settings(topic_prefix="gl"), wire_)  # type: ignore[arg-type]  # a recorded wire, not a client
    first, second = await asyncio.gather(tail.pages({P0: 4000}, 1), tail.pages({P0: 4000}, 1))
    assert first == second
    assert fetched_from(wire_) == [4000]


class HeldWire(Wire):
    """A broker that answers no fetch until `answer` is set."""

    def __init__(self) -> None:
        super().__init__(cluster=Cluster({TOPIC: 1}))
        self.handlers = {METADATA: metadata, FETCH: fetch}
        self.answer = asyncio.Event()
        self.fetching = asyncio.Event()

    async def send(self, node_id: int, request: Any) -> Response:
        if request.API_KEY == FETCH:
            self.fetching.set()
            await self.answer.wait()
        return await super().send(node_id, request)


async def test_stopping_with_a_round_queued_behind_a_fetch_in_flight_leaves_no_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`stop` drops the queued round and cancels the fetch it waits behind; the fetch's done callback then
    finds no round to send (before, a KeyError logged by the event loop at the read API's exit)."""
    wire_ = HeldWire()
    tail = LogTail(Settings(topic_prefix="gl"), wire_)  # type: ignore[arg-type]  # a recorded wire, not a client
    first = asyncio.ensure_future(tail.pages({P0: 4000}, 5))
    await wire_.fetching.wait()
    second = asyncio.ensure_future(tail.pages({P0: 4000}, 5))  # queued: the round after the one in flight
    async with asyncio.timeout(1):  # the second read has joined its round (state no event announces)
        while not tail._rounds:  # noqa: ASYNC110
            await asyncio.sleep(0)
    await tail.stop()
    await asyncio.gather(first, second, return_exceptions=True)
    await asyncio.sleep(0)  # one loop turn: the cancelled fetch's done callbacks run
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
