"""What the read API holds of the log the projector has not applied (`api/consistency/unprojected.py`), and the
thread views it keeps (`api/consistency/read_through.py`), against an in-memory log and applied offsets."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from aiokafka import TopicPartition

from graphledger.erasure.sealing import ERASED
from graphledger.events import envelope, to_envelope
from graphledger.events.erasure import ThreadErase
from graphledger.folds import thread
from graphledger.log.records import Tail
from graphledger.log.tail import LogRecord, Page
from graphledger_server.api.consistency.read_through import KeptView, TailEvents, ThreadViews
from graphledger_server.api.consistency.unprojected import Unprojected
from graphledger_server.keys.lookup import DataKeyCache
from graphledger_server.opening.opener import RecordOpener
from graphledger_server.projection.checkpoints import CheckpointProjection

TOPIC = "t.checkpoints"
TP = TopicPartition(TOPIC, 0)


class Log:
    """One partition's records; a page is at most `page` records from a position."""

    def __init__(self, page: int = 100, *, stingy: bool = False) -> None:
        self.records: list[LogRecord] = []
        self.page = page
        self.stingy = stingy
        """A fetch one record back answers that record's batch alone (nothing from the position on)."""
        self.fetches = 0
        self.unreadable: int | None = None
        """A batch at this offset nobody can read (a scan from at or before it ends there)."""

    def append(self, key: bytes | None, size: int = 10, value: bytes | None = None, headers: tuple = ()) -> int:
        offset = len(self.records)
        self.records.append(
            LogRecord(TP.topic, TP.partition, offset, key, b"v" * size if value is None else value, headers)
        )
        return offset

    async def pages(
        self, positions: Mapping[TopicPartition, int], timeout_s: float, *, below_end: bool = False
    ) -> dict[TopicPartition, Page]:
        self.fetches += 1
        page = 0 if self.stingy and not below_end else self.page
        return {
            tp: Page(len(self.records), tuple(self.records[position : min(position + page, self._stop(position))]))
            for tp, position in positions.items()
        }

    def _stop(self, position: int) -> int:
        unreadable = self.unreadable
        return unreadable if unreadable is not None and position <= unreadable else len(self.records)

    async def partition_count(self, topic: str) -> int:
        return 1


class Applied:
    def __init__(self) -> None:
        self.next = 0
        self.listening = asyncio.Event()
        self.listening.set()

    def applied(self, topic: str, partition: int) -> int:
        return self.next


def held(log: Log, applied: Applied, max_bytes: int = 1 << 20) -> Unprojected:
    return Unprojected(log, applied, [TOPIC], max_bytes)  # type: ignore[arg-type]


def offsets(tail: Tail | None) -> list[int]:
    assert tail is not None
    return [r.offset for r in tail.records]


async def test_a_keys_tail_holds_its_records_and_the_keyless_ones_from_the_applied_offset() -> None:
    log, applied = Log(), Applied()
    for key in (b"a", b"b", None, b"a", b"b", b"a"):
        log.append(key)
    applied.next = 1
    unprojected = held(log, applied)
    tail = await unprojected.tail(TP, b"a", 1.0)
    assert tail is not None and (tail.start, tail.end) == (1, 6)
    assert offsets(tail) == [2, 3, 5]  # not 0: applied; 2 is keyless, every key's
    log.append(b"a")
    assert offsets(await unprojected.tail(TP, b"a", 1.0)) == [2, 3, 5, 6]  # a fetch after the read began


async def test_what_the_projection_applied_is_dropped_with_what_readers_noted_of_it() -> None:
    log, applied = Log(), Applied()
    for _ in range(4):
        log.append(b"a", size=100)
    unprojected = held(log, applied)
    tail = await unprojected.tail(TP, b"a", 1.0)
    assert tail is not None
    unprojected.set_note(tail.records[0], "decoded")
    before = unprojected.size
    applied.next = 3
    tail = await unprojected.tail(TP, b"a", 1.0)
    assert offsets(tail) == [3] and tail is not None and tail.start == 3
    assert unprojected.size < before / 3
    assert unprojected.note(tail.records[0]) is None


async def test_a_read_far_behind_reads_on_to_the_end_of_the_log() -> None:
    log, applied = Log(page=2), Applied()
    for _ in range(7):
        log.append(b"a")
    assert offsets(await held(log, applied).tail(TP, b"a", 1.0)) == list(range(7))


async def test_a_fetch_one_record_back_that_brings_nothing_new_is_followed_by_one_at_the_position() -> None:
    log, applied = Log(stingy=True), Applied()
    for _ in range(3):
        log.append(b"a")
    assert offsets(await held(log, applied).tail(TP, b"a", 1.0)) == [0, 1, 2]


async def test_beyond_its_bound_it_holds_nothing_more_until_the_projection_applies_what_it_holds() -> None:
    log, applied = Log(), Applied()
    for _ in range(10):
        log.append(b"a", size=1000)
    unprojected = held(log, applied, max_bytes=5_000)
    assert await unprojected.tail(TP, b"a", 1.0) is None
    assert unprojected.full and unprojected.size <= 5_000
    applied.next = 8  # the projector applied most of it: there is room again
    assert offsets(await unprojected.tail(TP, b"a", 1.0)) == [8, 9]
    assert not unprojected.full


async def test_an_applied_offset_that_goes_back_starts_the_partition_again_from_it() -> None:
    log, applied = Log(), Applied()
    for _ in range(5):
        log.append(b"a")
    applied.next = 4
    unprojected = held(log, applied)
    assert offsets(await unprojected.tail(TP, b"a", 1.0)) == [4]
    applied.next = 1  # `graphledger offsets reset`
    assert offsets(await unprojected.tail(TP, b"a", 1.0)) == [1, 2, 3, 4]


async def test_a_batch_nobody_can_read_is_passed_over_once_the_projection_applied_past_it() -> None:
    """Reading on from before a batch the projector dead-lettered as unreadable would find nothing for ever:
    the partition starts again at the applied offset, letting go of every key."""
    log, applied = Log(), Applied()
    for _ in range(3):
        log.append(b"a")
    unprojected = held(log, applied)
    assert offsets(await unprojected.tail(TP, b"a", 1.0)) == [0, 1, 2]
    log.unreadable = log.append(b"a")
    log.append(b"a")
    assert await unprojected.tail(TP, b"a", 1.0) is None  # not applied past yet: the read waits
    unread: list[bool] = []
    unprojected.on_unread = lambda: unread.append(True)
    applied.next = 4  # the projector dead-lettered it
    assert offsets(await unprojected.tail(TP, b"a", 1.0)) == [4] and unread == [True]


async def test_nothing_is_held_until_the_applied_offsets_are_known() -> None:
    log, applied = Log(), Applied()
    log.append(b"a")
    applied.listening.clear()
    assert await held(log, applied).tail(TP, b"a", 1.0) is None
    assert log.fetches == 0
    assert await held(log, applied, max_bytes=0).tail(TP, b"a", 1.0) is None  # read-through off


async def test_an_erasure_is_told_as_it_is_read_and_its_subjects_keys_are_asked_for_again() -> None:
    """Anyone may publish an erasure record: it does not erase, it makes the key store decide again (which
    answers a recorded erasure as erased, a forged one with the key as before)."""
    log, applied = Log(), Applied()
    erase = to_envelope(ThreadErase("reft"))
    log.append(b"a")
    log.append(b"reft", value=envelope.encode(erase), headers=tuple(envelope.headers_for(erase)))
    unprojected = held(log, applied)
    keys = DataKeyCache(None)
    keys.erase("other")
    keys.erase("reft")  # stands for any key held of the subject
    opener = TailEvents(unprojected, RecordOpener(keys, lambda topic: CheckpointProjection("s").to_event))
    told: list[int] = []
    unprojected.on_erasure = lambda record: (told.append(record.offset), opener.erasure(record))
    await unprojected.tail(TP, b"a", 1.0)
    assert told == [1]  # read once, though the read was of another key
    assert keys.get("reft") is None  # not held: its next load asks the key store
    assert keys.get("other") is ERASED


async def test_an_erasure_the_projection_applied_before_it_was_read_is_told_all_the_same() -> None:
    """Reading on from the applied offset would pass over it, and a key held from before would open the
    subject's later records."""
    log, applied = Log(), Applied()
    erase = to_envelope(ThreadErase("reft"))
    log.append(b"reft")
    unprojected = held(log, applied)
    told: list[int] = []
    unprojected.on_erasure = lambda record: told.append(record.offset)
    assert offsets(await unprojected.tail(TP, b"reft", 1.0)) == [0]
    log.append(b"reft", value=envelope.encode(erase), headers=tuple(envelope.headers_for(erase)))
    log.append(b"a")
    log.append(b"reft")
    applied.next = 3  # the projector applied the erasure before this process read it
    assert offsets(await unprojected.tail(TP, b"reft", 1.0)) == [3]
    assert told == [1]


async def test_a_partition_read_from_its_applied_offset_lets_go_of_every_key() -> None:
    """The records below it were never read here: an erasure among them is not known."""
    log, applied = Log(), Applied()
    log.append(b"a")
    applied.next = 1
    unprojected = held(log, applied)
    keys = DataKeyCache(None)
    keys.erase("reft")  # stands for any key held
    opener = TailEvents(unprojected, RecordOpener(keys, lambda topic: CheckpointProjection("s").to_event))
    unprojected.on_unread = opener.unread
    await unprojected.tail(TP, b"a", 1.0)
    assert keys.get("reft") is None


def test_a_kept_view_serves_reads_whose_records_since_are_held_and_a_later_one_replaces_it() -> None:
    views = ThreadViews()
    views.keep(b"k", KeptView(0, 10, thread.NEW))
    assert views.usable(b"k", Tail(5, 12, ()), 0) is not None
    assert views.usable(b"k", Tail(11, 12, ()), 0) is None  # the records from 10 on are no longer held
    assert views.usable(b"k", Tail(5, 9, ()), 0) is None  # a view past the read's end
    assert views.usable(b"k", None, 1) is None  # another partition
    views.keep(b"k", KeptView(0, 8, thread.ERASED))  # an older one does not replace it
    kept = views.usable(b"k", None, 0)
    assert kept is not None and kept.through == 10


def test_kept_views_are_bounded_by_bytes_least_recently_used_first_out() -> None:
    views = ThreadViews(max_bytes=3 * thread.NEW.size)
    for key in (b"a", b"b", b"c"):
        views.keep(key, KeptView(0, 1, thread.NEW))
    views.usable(b"a", None, 0)  # used: b is now the least recently used
    views.keep(b"d", KeptView(0, 1, thread.NEW))
    assert [views.usable(key, None, 0) is not None for key in (b"a", b"b", b"c", b"d")] == [True, False, True, True]
