"""A Bloom filter of each checkpoint partition's record keys: a proof that a thread is new, without a read.

The projector sets the bits of the key of every record it moves a partition's offset past, in the
batch's transaction (`graphledger_server.log.key_filter`), so a partition's filter holds every
key below its applied offset `through`: it has no false negatives. A client that finds a thread's key
absent from it, and no record with the key in the partition from `through` to the log's end (a fetch
sent after its read began), knows the log holds nothing of the thread as the read begins, so the read
answers "no checkpoint" with no read API call (`client/thread_reads.py`). A false positive costs that
read its round trip, nothing more; so does a filter that has filled up (`BITS` holds about 110,000 keys
per partition at 1 % false positives).

A word is 64 bits, bit `p` of the filter being bit `p % 64` of word `p // 64`; Postgres stores a word as
a signed `bigint` (`signed`). Packed little-endian, the words are the filter's bytes, bit `p` being bit
`p % 8` of byte `p // 8`: that is how a client holds its copy (no numpy in the client).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping
from typing import Any

from graphledger.answers import KeyFilterAnswer

BITS = 1 << 20
"""Bits per partition: 128 KiB, 16,384 words."""
HASHES = 7
WORD_BITS = 64
WORD_BYTES = WORD_BITS // 8


def positions(key: bytes) -> list[int]:
    """The filter bits `key` sets: double hashing of one 128-bit BLAKE2b digest."""
    digest = hashlib.blake2b(key, digest_size=16).digest()
    first, step = int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:], "little") | 1
    return [(first + i * step) % BITS for i in range(HASHES)]


def words_of(keys: Iterable[bytes]) -> dict[int, int]:
    """Word index -> the bits (unsigned) the keys set in that word."""
    words: dict[int, int] = {}
    for key in keys:
        for p in positions(key):
            word = p // WORD_BITS
            words[word] = words.get(word, 0) | (1 << (p % WORD_BITS))
    return words


def signed(word: int) -> int:
    """An unsigned 64-bit word as Postgres's `bigint` holds it."""
    return word - (1 << WORD_BITS) if word >> (WORD_BITS - 1) else word


class KeyFilter:
    """A client's copy of one partition's filter, which it extends with the keys it scans past `through`."""

    def __init__(self, bits: bytearray, through: int) -> None:
        self._bits = bits
        self.through = through
        """The filter holds every key of the partition's records below this offset."""

    @classmethod
    def empty(cls, through: int) -> KeyFilter:
        return cls(bytearray(BITS // 8), through)

    @classmethod
    def from_answer(cls, wire: Mapping[str, Any]) -> KeyFilter | None:
        """The read API's answer (`/v1/checkpoints/key-filter`, read as a `KeyFilterAnswer`); None when it
        cannot serve as a proof: the filter does not cover the partition's first records (a projection older
        than it), or its shape is not this version's."""
        answer = KeyFilterAnswer.from_wire(wire)
        if not answer.complete or answer.bits != BITS or answer.hashes != HASHES:
            return None
        indexes, values = answer.indexes, answer.values
        if len(indexes) % 4 or len(values) != len(indexes) * 2:
            return None
        copy = cls.empty(int(answer.through))
        for i, (word,) in enumerate(struct.iter_unpack("<I", indexes)):
            if word >= BITS // WORD_BITS:
                return None
            copy._bits[word * WORD_BYTES : (word + 1) * WORD_BYTES] = values[i * WORD_BYTES : (i + 1) * WORD_BYTES]
        return copy

    def may_hold(self, key: bytes) -> bool:
        """Whether a record below `through` may have `key` (False: none has)."""
        bits = self._bits
        return all(bits[p >> 3] >> (p & 7) & 1 for p in positions(key))

    def extend(self, start: int, keys: Iterable[bytes | None], end: int) -> None:
        """Add the keys of every record in `[start, end)` (a scan of the partition), when the scan began
        at or before `through`: the filter then holds every key below `end`."""
        if start > self.through or end <= self.through:
            return
        bits = self._bits
        for key in keys:
            if key is not None:
                for p in positions(key):
                    bits[p >> 3] |= 1 << (p & 7)
        self.through = end
