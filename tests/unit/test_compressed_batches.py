"""Compressed record batches are read within `max_decompressed_batch_bytes` (`log/compressed_batches.py`): a
larger one, or one of a codec with no bounded decoder, becomes one placeholder record at its last offset
in a consumer's answer, and ends a `LogTail` scan."""

from __future__ import annotations

import resource
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.consumer import fetcher
from aiokafka.record.memory_records import MemoryRecords

from graphledger.log.compressed_batches import UNREADABLE_HEADER, bound_decompression
from graphledger.log.records import LogRecord
from graphledger.log.tail import _records
from graphledger.opening.records import DeadLetter, classify
from graphledger_server.projection.checkpoints import CheckpointProjection
from graphledger_server.projection.dead_letters import HEADER_OFFSET, outgoing_records
from hostile import compressed_batch, record_batch, record_bytes, zstd_bomb

BOUND = 4 * 1024 * 1024
TP = TopicPartition("t", 0)


@pytest.fixture(autouse=True)
def bound() -> None:
    bound_decompression(BOUND)


def consume(*batches: bytes, fetch_offset: int = 0) -> tuple[list[Any], int]:
    """What aiokafka's fetcher hands a consumer for these batches, and where it fetches next."""
    buffer = b"".join(_at(batch, i * 1000) for i, batch in enumerate(batches))
    records = fetcher.PartitionRecords(TP, MemoryRecords(buffer), [], fetch_offset, None, None, True, 0)
    return list(records), records.next_fetch_offset


def _at(batch: bytes, base_offset: int) -> bytes:
    return base_offset.to_bytes(8, "big") + batch[8:]


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_a_batch_within_the_bound_reads_as_it_was_written(codec: str) -> None:
    values = [b"x" * 1000, b"y" * 2000]
    records, next_offset = consume(compressed_batch(values, codec))
    assert [r.value for r in records] == values and [r.offset for r in records] == [0, 1]
    assert next_offset == 2


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_a_batch_beyond_the_bound_becomes_one_placeholder_and_the_next_batch_reads(codec: str) -> None:
    bomb = compressed_batch([bytes(1024 * 1024)] * 5, codec)  # 5 MiB of zeros, a few KiB compressed
    after = compressed_batch([b"after"], codec)
    records, next_offset = consume(bomb, after)
    placeholder, following = records
    assert (placeholder.offset, placeholder.key, placeholder.value) == (4, None, None)
    reason = dict(placeholder.headers)[UNREADABLE_HEADER].decode()
    assert reason.startswith("offsets 0..4:") and str(BOUND) in reason and codec in reason
    assert (following.offset, following.value) == (1000, b"after")
    assert next_offset == 1001


def test_a_2_gb_zstd_batch_costs_the_bound_not_2_gb() -> None:
    bomb = zstd_bomb(2 * 1024**3)
    assert len(bomb) < 1024 * 1024
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    records, next_offset = consume(bomb)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert len(records) == 1 and UNREADABLE_HEADER in dict(records[0].headers)
    assert next_offset == records[0].offset + 1 == 2048
    assert grown_kib < 4 * BOUND // 1024


@pytest.mark.parametrize("codec", ["lz4", "snappy"])
def test_a_codec_without_a_bounded_decoder_is_unreadable(codec: str) -> None:
    records, next_offset = consume(record_batch(b"\x00" * 64, 1, codec))
    assert len(records) == 1 and f"{codec} batches are not read" in dict(records[0].headers)[UNREADABLE_HEADER].decode()
    assert next_offset == 1


def test_uncompressed_batches_pass_untouched() -> None:
    records, _ = consume(record_batch(record_bytes(0, b"plain", b"k"), 1))
    assert [(r.key, r.value) for r in records] == [(b"k", b"plain")]


def test_a_log_tail_scan_stops_at_an_unreadable_batch() -> None:
    readable = compressed_batch([b"a", b"b"], "gzip")
    bomb = compressed_batch([bytes(1024 * 1024)] * 5, "gzip")
    records, size = _records(TopicPartition("t", 0), _at(readable, 0) + _at(bomb, 2) + _at(readable, 7))
    assert [r.offset for r in records] == [0, 1]
    assert size > 0


def test_the_projector_dead_letters_the_placeholder_of_an_unreadable_batch() -> None:
    (placeholder,), _ = consume(compressed_batch([bytes(1024 * 1024)] * 5, "zstd"))
    record = LogRecord("t", 0, placeholder.offset, None, None, tuple(placeholder.headers))
    letter = classify(record, CheckpointProjection("s").to_event)
    assert isinstance(letter, DeadLetter) and letter.reason.startswith("unreadable record batch, offsets 0..4:")
    # Kafka producers send no record with neither key nor value: the dead-letter topic gets an empty value.
    (outgoing,) = outgoing_records(letter, max_message_bytes=1024 * 1024)
    assert outgoing.key is None and outgoing.value == b""
    assert (HEADER_OFFSET, str(placeholder.offset).encode()) in outgoing.headers
