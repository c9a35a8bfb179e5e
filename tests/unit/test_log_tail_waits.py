"""Where a fetch starts and how long it may wait: at the position with a 1 ms wait when the log most
likely ends there (tansu holds a fetch at the end for its whole wait), one record back with a long wait
when records are known to lie past it (tansu scans its in-memory log for at most the wait, and answers
a long partition with no records and the right end when the wait is short)."""

from __future__ import annotations

from aiokafka import TopicPartition
from aiokafka.protocol.api import RequestStruct, Response

from graphledger.log_tail import END_MAX_WAIT_MS, FETCH_MAX_WAIT_MS, LogTail
from graphledger.settings import Settings
from kafka_wire import Cluster, Wire, record_batch

TOPIC = "gl.checkpoints"
P0 = TopicPartition(TOPIC, 0)
FETCH, METADATA = 1, 3


def metadata(node: int, request: RequestStruct) -> Response:
    partitions = [(0, 0, 1, 0, [1], [1], [])]  # partition 0 led by node 1 at epoch 0
    return request.RESPONSE_TYPE(0, [(1, "k1", 9092, None)], "c", 1, [(0, TOPIC, False, partitions)])


def log_of(end: int, *, short_waits_find_nothing: bool = False):  # type: ignore[no-untyped-def]
    """A fetch handler for a partition of `end` records keyed `b"other"`: from the fetch position to the
    end, or, as tansu's long partitions do, nothing (the end still right) for a fetch that may wait 1 ms."""

    def fetch(node: int, request: RequestStruct) -> Response:
        obj = request.to_object()
        topics = []
        for topic in obj["topics"]:
            partitions = []
            for p in topic["partitions"]:
                first = p["fetch_offset"]
                found = first < end and not (short_waits_find_nothing and obj["max_wait_time"] == END_MAX_WAIT_MS)
                batch = record_batch([(b"other", b"v")] * (end - first), base_offset=first) if found else b""
                partitions.append((p["partition"], 0, end, end, 0, [], batch))
            topics.append((topic["topic"], partitions))
        return request.RESPONSE_TYPE(0, 0, 0, topics)

    return fetch


def wire(end: int, **kwargs: bool) -> Wire:
    wire = Wire(cluster=Cluster({TOPIC: 1}))
    wire.handlers = {METADATA: metadata, FETCH: log_of(end, **kwargs)}
    return wire


def fetches(wire: Wire) -> list[tuple[int, int]]:
    """(fetch offset, max wait) of each fetch sent."""
    return [
        (sent.obj()["topics"][0]["partitions"][0]["fetch_offset"], sent.obj()["max_wait_time"])
        for sent in wire.of(FETCH)
    ]


def log_tail(wire: Wire) -> LogTail:
    return LogTail(Settings(topic_prefix="gl"), wire)  # type: ignore[arg-type]  # a recorded wire, not a client


async def test_a_tail_from_where_the_log_was_last_seen_to_end_asks_there_and_waits_1_ms() -> None:
    wire_ = wire(40)
    tail = (await log_tail(wire_).tails({P0: 40}, 1))[P0]
    assert (tail.end, tail.keys, tail.complete) == (40, (), True)
    assert fetches(wire_) == [(40, END_MAX_WAIT_MS)]


async def test_a_tail_from_before_an_end_the_process_saw_starts_one_record_back_and_may_wait() -> None:
    wire_ = wire(40)
    tail_ = log_tail(wire_)
    tail_.note_end(P0, 40)  # e.g. this process's write acknowledged at offset 39
    tail = (await tail_.tails({P0: 38}, 1))[P0]
    assert (tail.end, [offset for offset, _ in tail.keys], tail.complete) == (40, [38, 39], True)
    assert fetches(wire_) == [(37, FETCH_MAX_WAIT_MS)]


async def test_a_tail_that_found_the_log_longer_than_it_expected_reads_on_for_the_records() -> None:
    wire_ = wire(40, short_waits_find_nothing=True)
    tail = (await log_tail(wire_).tails({P0: 37}, 1))[P0]
    assert (tail.end, [offset for offset, _ in tail.keys], tail.complete) == (40, [37, 38, 39], True)
    assert fetches(wire_) == [(37, END_MAX_WAIT_MS), (36, FETCH_MAX_WAIT_MS)]


async def test_the_end_alone_is_asked_at_the_position_with_a_1_ms_wait() -> None:
    wire_ = wire(40)
    assert await log_tail(wire_).ends({P0: 25}, 1) == {P0: 40}
    assert fetches(wire_) == [(25, END_MAX_WAIT_MS)]
