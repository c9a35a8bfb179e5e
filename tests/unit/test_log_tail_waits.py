"""Where a fetch starts and how long it may wait: at the position with a 1 ms wait when the log most
likely ends there, carrying the layout partition as a beacon (tansu holds a fetch that finds no records
for its whole wait, and answers one that finds some at once), one record back with a long wait when
records are known to lie past it (tansu scans its in-memory log for at most the wait, and answers a
long partition with no records and the right end when the wait is short). A page whose answers pass over
its position (`log.gaps`) asks again until the records are readable or the gap is read past."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.protocol.api import RequestStruct, Response

from graphledger.log import tail as log_tail_module
from graphledger.log.gaps import GapWatch
from graphledger.log.tail import BEACON_BYTES, END_MAX_WAIT_MS, FETCH_MAX_WAIT_MS, LogTail
from graphledger.settings import Settings
from kafka_wire import Cluster, Wire, record_batch

TOPIC, LAYOUT = "gl.checkpoints", "gl.layout"
P0, BEACON = TopicPartition(TOPIC, 0), TopicPartition(LAYOUT, 0)
FETCH, METADATA = 1, 3


def metadata_led_by(layout_leader: int | None):  # type: ignore[no-untyped-def]
    """A Metadata handler: partition 0 of the checkpoints led by node 1, the layout partition by
    `layout_leader` (None: the broker does not know the topic)."""

    def metadata(node: int, request: RequestStruct) -> Response:
        topics = []
        for topic in request.to_object()["topics"]:
            leader = 1 if topic == TOPIC else layout_leader
            partitions = [(0, 0, leader, 0, [leader], [leader], [])] if leader is not None else []
            topics.append((0 if partitions else 3, topic, False, partitions))
        brokers = [(1, "k1", 9092, None), (2, "k2", 9092, None)]
        return request.RESPONSE_TYPE(0, brokers, "c", 1, topics)

    return metadata


def log_of(end: int, *, short_waits_find_nothing: bool = False, beacon_error: int = 0):  # type: ignore[no-untyped-def]
    """A fetch handler for a partition of `end` records keyed `b"other"`: from the fetch position to the
    end, or, as tansu's long partitions do, nothing (the end still right) for a fetch that may wait 1 ms.
    The layout partition holds one record (or answers `beacon_error`)."""

    def fetch(node: int, request: RequestStruct) -> Response:
        obj = request.to_object()
        topics = []
        for topic in obj["topics"]:
            partitions = []
            for p in topic["partitions"]:
                if topic["topic"] == LAYOUT:
                    batch = b"" if beacon_error else record_batch([(TOPIC.encode(), b'{"partitions":1}')])
                    partitions.append((p["partition"], beacon_error, 1, 1, 0, [], batch))
                    continue
                first = p["fetch_offset"]
                found = first < end and not (short_waits_find_nothing and obj["max_wait_time"] == END_MAX_WAIT_MS)
                batch = record_batch([(b"other", b"v")] * (end - first), base_offset=first) if found else b""
                partitions.append((p["partition"], 0, end, end, 0, [], batch))
            topics.append((topic["topic"], partitions))
        return request.RESPONSE_TYPE(0, 0, 0, topics)

    return fetch


def wire(end: int, *, layout_leader: int | None = 1, **kwargs: Any) -> Wire:
    wire = Wire(cluster=Cluster({TOPIC: 1}, nodes=(1, 2)))
    wire.handlers = {METADATA: metadata_led_by(layout_leader), FETCH: log_of(end, **kwargs)}
    return wire


def fetches(wire: Wire) -> list[tuple[int, int]]:
    """(fetch offset, max wait) of each fetch sent, of the checkpoints' partition."""
    return [(_positions(sent.obj())[P0][0], sent.obj()["max_wait_time"]) for sent in wire.of(FETCH)]


def _positions(fetch: dict[str, Any]) -> dict[TopicPartition, tuple[int, int]]:
    """(fetch offset, max bytes) of each partition a fetch asks for."""
    return {
        TopicPartition(topic["topic"], p["partition"]): (p["fetch_offset"], p["max_bytes"])
        for topic in fetch["topics"]
        for p in topic["partitions"]
    }


def beacons(wire: Wire) -> list[bool]:
    """Whether each fetch sent carried the layout partition, from its first record."""
    return [_positions(sent.obj()).get(BEACON) == (0, BEACON_BYTES) for sent in wire.of(FETCH)]


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


async def test_a_page_from_the_end_last_seen_is_asked_there_with_the_beacon_one_below_it_a_record_back() -> None:
    wire_ = wire(40)
    tail_ = log_tail(wire_)
    page = (await tail_.pages({P0: 40}, 1))[P0]
    assert (page.end, page.records) == (40, ())
    assert [r.offset for r in (await tail_.pages({P0: 38}, 1))[P0].records] == [38, 39]  # 40 seen: one back
    assert fetches(wire_) == [(40, END_MAX_WAIT_MS), (37, FETCH_MAX_WAIT_MS)]
    assert beacons(wire_) == [True, False]


async def test_a_page_from_a_position_the_process_saw_no_end_past_still_gets_the_records_beyond() -> None:
    wire_ = wire(40)
    page = (await log_tail(wire_).pages({P0: 37}, 1))[P0]
    assert (page.end, [r.offset for r in page.records]) == (40, [37, 38, 39])
    assert fetches(wire_) == [(37, END_MAX_WAIT_MS)]


async def test_a_page_asked_at_the_end_that_finds_the_log_longer_but_no_records_asks_again_a_record_back() -> None:
    wire_ = wire(40, short_waits_find_nothing=True)  # tansu's listing of a long partition outlasting 1 ms
    page = (await log_tail(wire_).pages({P0: 37}, 1))[P0]
    assert (page.end, [r.offset for r in page.records]) == (40, [37, 38, 39])
    assert fetches(wire_) == [(37, END_MAX_WAIT_MS), (36, FETCH_MAX_WAIT_MS)]


async def test_the_end_alone_is_asked_at_the_position_with_a_1_ms_wait() -> None:
    wire_ = wire(40)
    assert await log_tail(wire_).ends({P0: 25}, 1) == {P0: 40}
    assert fetches(wire_) == [(25, END_MAX_WAIT_MS)]


async def test_a_fetch_that_expects_the_end_carries_the_beacon_and_one_for_records_does_not() -> None:
    wire_ = wire(40)
    tail_ = log_tail(wire_)
    assert (await tail_.tails({P0: 40}, 1))[P0].end == 40
    assert await tail_.ends({P0: 25}, 1) == {P0: 40}
    tail_.note_end(P0, 40)
    assert [offset for offset, _ in (await tail_.tails({P0: 38}, 1))[P0].keys] == [38, 39]
    assert beacons(wire_) == [True, True, False]


async def test_what_the_beacon_holds_or_any_error_about_it_never_reaches_the_read() -> None:
    wire_ = wire(40, beacon_error=3)  # UNKNOWN_TOPIC_OR_PARTITION: deleted since, or not readable
    tail = (await log_tail(wire_).tails({P0: 40}, 1))[P0]
    assert (tail.end, tail.keys, tail.complete) == (40, (), True)
    assert beacons(wire_) == [True]


async def test_no_beacon_goes_to_a_node_that_does_not_lead_it_nor_where_the_broker_has_none() -> None:
    for layout_leader in (2, None):
        wire_ = wire(40, layout_leader=layout_leader)
        assert (await log_tail(wire_).tails({P0: 40}, 1))[P0].end == 40
        assert beacons(wire_) == [False]


def _short_answers(end: int, answers: int | None, *, gap: int | None = None):  # type: ignore[no-untyped-def]
    """A fetch handler for a partition of `end` records whose first `answers` answers (None: all) to a fetch
    from at or below `gap` hold the records from `gap + 1` on only, as tansu's can; with no `gap`, the
    first `answers` answers hold no records (tansu's scan outlasting the wait)."""
    answered = 0

    def fetch(node: int, request: RequestStruct) -> Response:
        nonlocal answered
        topics = []
        for topic in request.to_object()["topics"]:
            partitions = []
            for p in topic["partitions"]:
                if topic["topic"] == LAYOUT:
                    partitions.append((p["partition"], 0, 1, 1, 0, [], record_batch([(b"x", b"y")])))
                    continue
                first = p["fetch_offset"]
                short = answers is None or answered < answers
                if short and gap is None:
                    batches = b""
                elif short and gap is not None and first <= gap:
                    batches = record_batch([(b"k", b"v")] * (gap - first), first) if first < gap else b""
                    batches += record_batch([(b"k", b"v")] * (end - gap - 1), gap + 1)
                else:
                    short = False
                    batches = record_batch([(b"k", b"v")] * (end - first), first)
                answered += short
                partitions.append((p["partition"], 0, end, end, 0, [], batches))
            topics.append((topic["topic"], partitions))
        return request.RESPONSE_TYPE(0, 0, 0, topics)

    return fetch


def _tail_over(handler: Any) -> tuple[LogTail, Wire]:
    wire_ = Wire(cluster=Cluster({TOPIC: 1}, nodes=(1, 2)))
    wire_.handlers = {METADATA: metadata_led_by(1), FETCH: handler}
    return log_tail(wire_), wire_


async def test_a_page_asked_below_the_end_waits_out_a_gap() -> None:
    """A read-through read that took three answers passing over its position as the position's records
    missing waited for the projector: a gap is asked for again until the broker has it readable."""
    tail, wire_ = _tail_over(_short_answers(14, 6, gap=10))
    page = (await tail.pages({P0: 10}, 5, below_end=True))[P0]
    assert [r.offset for r in page.records] == [10, 11, 12, 13]
    assert fetches(wire_) == [(10, FETCH_MAX_WAIT_MS)] * 7


async def test_a_tail_from_a_partitions_start_whose_answer_passed_over_its_first_record_asks_from_it_again() -> None:
    """One record back from offset 0 is offset 0: a fetch from -1 would pass over the first record (a gap that
    never closes), and the tail would stop short of the records after it."""
    tail, wire_ = _tail_over(_short_answers(3, 1, gap=0))
    found = (await tail.tails({P0: 0}, 1))[P0]
    assert ([offset for offset, _ in found.keys], found.complete) == ([0, 1, 2], True)
    assert fetches(wire_) == [(0, END_MAX_WAIT_MS), (0, END_MAX_WAIT_MS)]  # offset 0 never waits long


async def test_a_gap_that_persists_is_read_past_once_confirmed() -> None:
    tail, _ = _tail_over(_short_answers(14, None, gap=10))
    told: list[bool] = []
    tail._gaps = GapWatch(confirm_s=0.1, on_gap=told.append)
    page = (await tail.pages({P0: 10}, 5, below_end=True))[P0]
    assert [r.offset for r in page.records] == [11, 12, 13]
    assert told == [False, True]


async def test_a_page_below_the_end_asks_again_while_answers_bring_nothing_then_takes_it_as_unreadable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """tansu answers a fetch whose scan of a long partition outlasts its wait with no records: asked again
    for a while (three answers was too few under load), then taken as unreadable (the read waits)."""
    tail, wire_ = _tail_over(_short_answers(14, 6))
    page = (await tail.pages({P0: 10}, 5, below_end=True))[P0]
    assert [r.offset for r in page.records] == [10, 11, 12, 13]
    assert len(fetches(wire_)) == 7
    monkeypatch.setattr(log_tail_module, "EMPTY_ANSWERS_S", 0.1)
    tail, wire_ = _tail_over(_short_answers(14, None))
    page = (await tail.pages({P0: 10}, 5, below_end=True))[P0]
    assert (page.end, page.records) == (14, ())
    assert len(fetches(wire_)) > 1
