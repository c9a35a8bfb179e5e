"""Hypothesis strategies of hostile input, shared by the hostile-input, store filter and API-fuzz tests."""

from __future__ import annotations

import gzip
import struct
import time
from typing import Any

import zstandard
from aiokafka import TopicPartition
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.produce import ProduceRequest
from aiokafka.record.util import calc_crc32c, encode_varint
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from graphledger.settings import Settings

# Modest example counts keep the suite fast; deadline=None because the calls go through Kafka and Postgres.
HOSTILE = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
FEW = settings(HOSTILE, max_examples=25)

SPECIAL_TEXT = [
    "",
    "'",
    '"',
    "'; DROP TABLE store; --",
    "\\",
    "\\u0000",
    "%s",
    "$1",
    "*",
    "$eq",
    "a.b",
    "\x00",
    "a\x00b",
    "\ud800",
    "x\udfff",
    "\U0001f99c",
    "\u202e",
    "\x1f\x1e",
    "x" * 100_000,
]
SQL_LEAKS = (
    "asyncpg",
    "psycopg",
    "syntax error",
    "invalid input syntax",
    "SQLSTATE",
    'relation "',
    'column "',
    "LINE 1",
)


def assert_clear(exc: BaseException, *words: str) -> None:
    """A validation error that says what was wrong (naming one of `words`, if given), not a driver or SQL message."""
    message = str(exc)
    assert message and not any(leak in message for leak in SQL_LEAKS), message
    if words:
        assert any(w in message for w in words), message


"""Text of a Postgres or driver error: it must never reach a response."""

texts = st.one_of(st.sampled_from(SPECIAL_TEXT), st.text(st.characters(exclude_categories=()), max_size=40))
ints = st.one_of(st.integers(-(2**63), 2**64 - 1), st.sampled_from([2**64, -(2**63) - 1, 10**100]))
scalars = st.one_of(st.none(), st.booleans(), ints, st.floats(), texts)


def nest(depth: int, leaf: Any = 1) -> Any:
    """`leaf` inside `depth` alternating dicts and lists, built without recursion."""
    value = leaf
    for i in range(depth):
        value = {"a": value} if i % 2 else [value]
    return value


deep = st.sampled_from([150, 199, 200, 201, 300, 10_000]).map(nest)
json_values = st.one_of(
    deep,
    st.recursive(
        scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4), max_leaves=12
    ),
)
json_objects = st.dictionaries(texts, json_values, max_size=4)


# -- hand-made record batches: what a producer not using graphledger's client can put in the log --------

BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
"""Kafka's v2 record batch header: base offset, length, leader epoch, magic, CRC-32C (of what follows it),
attributes (the codec in the low 3 bits), last offset delta, first and max timestamps, producer id,
epoch and base sequence, record count."""
CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def record_bytes(offset_delta: int, value: bytes | None, key: bytes | None = None) -> bytes:
    """One record of a v2 batch (no headers)."""
    body = bytearray([0])  # attributes
    for number in (0, offset_delta):  # timestamp delta, offset delta
        encode_varint(number, body.append)
    for field in (key, value):
        encode_varint(-1 if field is None else len(field), body.append)
        body += field or b""
    encode_varint(0, body.append)  # headers
    out = bytearray()
    encode_varint(len(body), out.append)
    return bytes(out + body)


def record_batch(payload: bytes, count: int, codec: str | None = None) -> bytes:
    """A v2 batch of `count` records whose (compressed, if `codec`) records section is `payload`."""
    now = int(time.time() * 1000)
    attributes = CODECS[codec] if codec else 0
    header = BATCH_HEADER.pack(0, BATCH_HEADER.size - 12 + len(payload), -1, 2, 0, attributes, count - 1, now,
                               now, -1, -1, -1, count)  # fmt: skip
    crc = calc_crc32c(header[21:] + payload)
    return header[:17] + struct.pack(">I", crc) + header[21:] + payload


def compressed_batch(values: list[bytes], codec: str) -> bytes:
    """A batch of `values` (keyless records), compressed with `codec` (gzip or zstd)."""
    records = b"".join(record_bytes(i, v) for i, v in enumerate(values))
    payload = gzip.compress(records) if codec == "gzip" else zstandard.ZstdCompressor().compress(records)
    return record_batch(payload, len(values), codec)


def zstd_bomb(expanded_bytes: int, record_bytes_each: int = 1024 * 1024) -> bytes:
    """A zstd batch of zero-filled records that decompresses to about `expanded_bytes` (2 GB fit in 1 MB),
    compressed as a stream: the expanded records are never in memory at once."""
    count = max(1, expanded_bytes // record_bytes_each)
    compressor = zstandard.ZstdCompressor(level=1).compressobj()
    zeros = bytes(record_bytes_each)
    parts = [compressor.compress(record_bytes(i, zeros)) for i in range(count)]
    parts.append(compressor.flush())
    return record_batch(b"".join(parts), count, "zstd")


async def produce_batch(settings: Settings, topic: str, partition: int, batch: bytes) -> None:
    """Append a hand-made record batch to a partition as it is (a raw Produce request, acks=all)."""
    client = AIOKafkaClient(**settings.kafka_client_options())  # type: ignore[arg-type]
    await client.bootstrap()
    try:
        await client.add_topic(topic)  # and waits for its metadata
        leader = client.cluster.leader_for_partition(TopicPartition(topic, partition))
        request = ProduceRequest(None, -1, 30_000, [(topic, [(partition, batch)])])
        response = await client.send(leader, request)
        for _, partitions in response.topics:
            for _, error_code, *_ in partitions:
                assert error_code == 0, f"the broker refused the batch: error {error_code}"
    finally:
        await client.close()
