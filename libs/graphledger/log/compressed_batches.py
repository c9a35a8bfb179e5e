"""Reading compressed Kafka record batches within a bound.

graphledger's producers never compress, but a hostile producer (or a topic's `compression.type`, or a
mirror) can put compressed batches in the log, and aiokafka decompresses a whole batch into memory with
no bound: a 1 MB zstd batch of zeros becomes 2 GB, and every reader of its partition would crash on it
for ever. `bound_decompression` (called by everything here that reads the log: the services'
consumers and `LogTail`) puts bounded decoders in aiokafka's place: a batch decompresses to at most
`max_decompressed_batch_bytes`, or not at all.

A batch that does not decompress within the bound, or whose codec has no bounded decoder here, is
*unreadable*. A consumer (aiokafka's fetcher) then yields one placeholder record in its place, at the
batch's last offset, carrying no key and no value and the reason in an `UNREADABLE_HEADER` header: the
projector dead-letters it and the partition moves on past the batch. `LogTail` stops its scan there.

gzip is decoded by the standard library and zstd by `zstandard` (when installed; without it, like lz4
and snappy, for which no decoder here takes a bound, such batches are unreadable). aiokafka reads zstd,
lz4 and snappy only with the optional `cramjam`, which graphledger does not install: without this
module those batches raise in every consumer.
"""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Iterator
from typing import Any

from aiokafka.errors import UnsupportedCodecError

UNREADABLE_HEADER = "gl-unreadable-batch"
"""On the placeholder of an unreadable batch: why it is unreadable (offsets, codec, the bound)."""

READ_CHUNK_BYTES = 1024 * 1024


class UnreadableBatchError(Exception):
    """A compressed batch that does not decompress within the bound (or with no bounded decoder)."""


_limit = {"bytes": 64 * 1024 * 1024}
_installed = False
_RECORD_MODULES = (
    "aiokafka.record.default_records",
    "aiokafka.record.legacy_records",
    "aiokafka.record._crecords.default_records",
    "aiokafka.record._crecords.legacy_records",
)


def bound_decompression(max_bytes: int) -> None:
    """Decode every compressed batch this process reads with at most `max_bytes` of output (idempotent;
    the latest bound applies)."""
    global _installed
    _limit["bytes"] = max_bytes
    if _installed:
        return
    for name in _RECORD_MODULES:
        try:
            module: Any = importlib.import_module(name)  # aiokafka's record modules: untyped
        except ImportError:  # the C extension is optional (AIOKAFKA_NO_EXTENSIONS, other platforms)
            continue
        for attribute, decoder in _DECODERS.items():
            if hasattr(module, attribute):
                setattr(module, attribute, decoder)
        if hasattr(module, "codecs"):
            module.codecs = _Codecs(module.codecs)
    from aiokafka.consumer import fetcher

    fetcher.PartitionRecords = _bounded_partition_records(fetcher.PartitionRecords)
    _installed = True


def gzip_decode(payload: Any) -> bytes:
    """A gzip payload (one or more members), refused past the bound."""
    budget = _limit["bytes"]
    data = bytes(payload)
    out = []
    size = 0
    while data:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            chunk = inflater.decompress(data, budget - size + 1)
        except zlib.error as exc:
            raise UnreadableBatchError(f"gzip data is corrupt: {exc}") from None
        size += len(chunk)
        out.append(chunk)
        if size > budget or inflater.unconsumed_tail:
            raise _too_large("gzip")
        data = inflater.unused_data if inflater.eof else b""
    return b"".join(out)


def zstd_decode(payload: Any) -> bytes:
    """A zstd payload, refused past the bound (streamed: never more than the bound in memory)."""
    try:
        import zstandard
    except ImportError:
        raise UnreadableBatchError("zstd batches need the `zstandard` package to be read within a bound") from None
    budget = _limit["bytes"]
    out = []
    size = 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(bytes(payload), read_across_frames=True) as reader:
            while chunk := reader.read(min(READ_CHUNK_BYTES, budget - size + 1)):
                size += len(chunk)
                if size > budget:
                    raise _too_large("zstd")
                out.append(chunk)
    except zstandard.ZstdError as exc:
        raise UnreadableBatchError(f"zstd data is corrupt: {exc}") from None
    return b"".join(out)


def _refuse(codec: str) -> Any:
    def decode(payload: Any) -> bytes:
        raise UnreadableBatchError(f"{codec} batches are not read: no decoder here takes a bound on their size")

    return decode


def _too_large(codec: str) -> UnreadableBatchError:
    return UnreadableBatchError(
        f"a {codec} batch decompresses to more than {_limit['bytes']} bytes (GRAPHLEDGER_MAX_DECOMPRESSED_BATCH_BYTES)"
    )


_DECODERS = {
    "gzip_decode": gzip_decode,
    "zstd_decode": zstd_decode,
    "lz4_decode": _refuse("lz4"),
    "snappy_decode": _refuse("snappy"),
}


class _Codecs:
    """aiokafka's `codec` module as its record readers see it: every codec present (the decoders above
    answer for each), the rest (encoders, for producers) the module's own."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    @staticmethod
    def has_gzip() -> bool:
        return True

    @staticmethod
    def has_zstd() -> bool:
        return True

    @staticmethod
    def has_lz4() -> bool:
        return True

    @staticmethod
    def has_snappy() -> bool:
        return True


class UnreadableRecord:
    """Stands for an unreadable batch in a consumer's answer: its last offset, no key, no value."""

    __slots__ = ("headers", "offset", "timestamp", "timestamp_type")
    key = None
    value = None
    checksum = None

    def __init__(self, batch: Any, reason: str) -> None:
        self.offset = batch.next_offset - 1
        self.timestamp = getattr(batch, "max_timestamp", -1)
        self.timestamp_type = getattr(batch, "timestamp_type", 0)
        first = getattr(batch, "base_offset", self.offset)
        self.headers = [(UNREADABLE_HEADER, f"offsets {first}..{self.offset}: {reason}".encode())]


class _BoundedBatch:
    """A compressed batch whose decompression failing within the bound yields one `UnreadableRecord`."""

    __slots__ = ("_batch",)

    def __init__(self, batch: Any) -> None:
        self._batch = batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)

    def __iter__(self) -> Iterator[Any]:
        try:
            records = iter(self._batch)  # decompresses; the compiled batch is its own iterator: iter() it once
            record = next(records, None)
        except (UnreadableBatchError, UnsupportedCodecError) as exc:
            yield UnreadableRecord(self._batch, str(exc))
            return
        while record is not None:
            yield record
            record = next(records, None)


class _BoundedRecords:
    """A fetched record set whose compressed batches are `_BoundedBatch`es."""

    __slots__ = ("_records",)

    def __init__(self, records: Any) -> None:
        self._records = records

    def __getattr__(self, name: str) -> Any:
        return getattr(self._records, name)

    def has_next(self) -> bool:
        return bool(self._records.has_next())

    def next_batch(self) -> Any:
        batch = self._records.next_batch()
        if batch is None or getattr(batch, "compression_type", 1) == 0:
            return batch  # not compressed: as it is, no wrapper on the hot path
        return _BoundedBatch(batch)


def _bounded_partition_records(base: type) -> type:
    if getattr(base, "_graphledger_bounded", False):
        return base

    class BoundedPartitionRecords(base):  # type: ignore[misc]  # base: aiokafka's class, untyped
        """aiokafka's per-partition fetch result, reading its batches through `_BoundedRecords`."""

        _graphledger_bounded = True

        def __init__(self, tp: Any, records: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(tp, _BoundedRecords(records), *args, **kwargs)

    return BoundedPartitionRecords
