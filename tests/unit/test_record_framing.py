"""`chunks.frame`: one encoded event becomes one record, or chunks with `gl-chunk` headers."""

from __future__ import annotations

from graphledger.events import chunks
from graphledger.events.envelope import HEADER_CHUNK, HEADER_TYPE

HEADERS = [(HEADER_TYPE, b"checkpoint.put"), ("traceparent", b"00-abc-def-01")]


def test_an_event_within_the_limit_is_one_record_with_its_headers() -> None:
    (record,) = chunks.frame(b"x" * 100, HEADERS, 100, "event-1")
    assert record.value == b"x" * 100
    assert record.headers == HEADERS


def test_a_larger_event_is_chunks_carrying_its_headers_and_a_chunk_header_last() -> None:
    value = bytes(range(256)) * 3  # 768 bytes
    records = chunks.frame(value, HEADERS, 300, "event-2")
    assert [len(r.value) for r in records] == [300, 300, 168]
    assert b"".join(r.value for r in records) == value
    for i, record in enumerate(records):
        assert record.headers[:-1] == HEADERS
        name, raw = record.headers[-1]
        assert name == HEADER_CHUNK
        assert chunks.parse_header(raw) == chunks.ChunkRef("event-2", i, 3)


def test_one_byte_over_the_limit_is_two_chunks() -> None:
    records = chunks.frame(b"y" * 11, [], 10, "event-3")
    assert [r.value for r in records] == [b"y" * 10, b"y"]
    assert [r.headers for r in records] == [
        [(HEADER_CHUNK, b"event-3:0:2")],
        [(HEADER_CHUNK, b"event-3:1:2")],
    ]


def test_framing_copies_the_headers_it_is_given() -> None:
    headers = list(HEADERS)
    (record,) = chunks.frame(b"", headers, 10, "event-4")
    record.headers.append(("gl-dlq-reason", b"added by a caller"))
    assert headers == HEADERS
