"""The key filter's arithmetic, and a client's copy: no key recorded is ever reported absent."""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

import pytest

from graphledger.client.key_filters import BEHIND_RETRY_S, RETRY_S, KeyFilters
from graphledger.errors import ReadApiError
from graphledger.log import key_filter
from graphledger.log.key_filter import BITS, HASHES, KeyFilter


def answer_of(keys: list[bytes], through: int, *, complete: bool = True) -> dict[str, Any]:
    """The read API's answer for a filter holding `keys`, packed as `api/routes/key_filter.py` packs the rows."""
    words = key_filter.words_of(keys)
    indexes = b"".join(w.to_bytes(4, "little") for w in words)
    values = b"".join(key_filter.signed(b).to_bytes(8, "little", signed=True) for b in words.values())
    return {"through": through, "complete": complete, "bits": BITS, "hashes": HASHES, "indexes": indexes,
            "values": values}  # fmt: skip


def test_positions_are_stable_and_within_the_filter() -> None:
    found = key_filter.positions(b"thread-1")
    assert found == key_filter.positions(b"thread-1") and len(found) == HASHES
    assert all(0 <= p < BITS for p in found)
    assert found != key_filter.positions(b"thread-2")


def test_signed_words_round_trip_through_bigint() -> None:
    for word in (0, 1, 2**63 - 1, 2**63, 2**64 - 1):
        stored = key_filter.signed(word)
        assert -(2**63) <= stored < 2**63
        assert stored % 2**64 == word


def test_a_copy_holds_every_recorded_key_and_few_others() -> None:
    rng = random.Random(7)
    recorded = [rng.randbytes(32) for _ in range(20_000)]
    copy = KeyFilter.from_answer(answer_of(recorded, 500))
    assert copy is not None and copy.through == 500
    assert all(copy.may_hold(k) for k in recorded)
    others = [os.urandom(32) for _ in range(20_000)]
    assert sum(copy.may_hold(k) for k in others) < 200  # ~0.3 % expected at 20,000 keys


@pytest.mark.parametrize(
    "change",
    [
        {"complete": False},
        {"bits": BITS // 2},
        {"hashes": HASHES + 1},
        {"indexes": b"\x01\x00\x00"},
        {"indexes": (BITS // 64).to_bytes(4, "little")},
    ],
    ids=["incomplete", "bits", "hashes", "torn", "word-beyond"],
)
def test_a_filter_that_cannot_prove_absence_is_refused(change: dict[str, Any]) -> None:
    assert KeyFilter.from_answer({**answer_of([b"k"], 3), **change}) is None


def test_a_scan_extends_a_copy_only_from_where_it_holds_every_key() -> None:
    copy = KeyFilter.empty(10)
    copy.extend(12, [b"skipped"], 20)  # began past `through`: offsets 10 and 11 unknown
    assert copy.through == 10 and not copy.may_hold(b"skipped")
    copy.extend(8, [b"a", None, b"b"], 15)
    assert copy.through == 15 and copy.may_hold(b"a") and copy.may_hold(b"b")
    copy.extend(9, [b"older"], 14)  # ends where the copy already holds every key
    assert copy.through == 15 and not copy.may_hold(b"older")


async def test_an_own_write_extends_a_copy_only_when_it_lies_at_the_copy_s_end() -> None:
    filters = KeyFilters(FakeReadApi(answer_of([b"old"], 5)))
    filters.written(0, 5, b"before the copy")  # no copy yet: nothing to extend
    copy = await filters.of(0)
    assert copy is not None and not copy.may_hold(b"before the copy")
    filters.written(0, 6, b"past a record not seen")  # offset 5 is unknown: may be another writer's
    assert copy.through == 5 and not copy.may_hold(b"past a record not seen")
    filters.written(0, 5, b"mine")
    filters.written(0, 6, None)  # a keyless record (runs.delete) moves the copy on
    filters.written(0, 4, b"below")  # below the copy's end: already counted, not added
    assert copy.through == 7 and copy.may_hold(b"mine") and not copy.may_hold(b"below")


class FakeReadApi:
    """Answers the key-filter route from a script of answers or errors, counting the calls."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def __call__(self, path: str, body: dict[str, Any], headers: Any) -> Any:
        self.calls += 1
        await asyncio.sleep(0)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


async def test_concurrent_reads_share_one_fetch_and_a_copy_behind_is_fetched_again_a_while_later() -> None:
    now = [0.0]
    api = FakeReadApi(answer_of([b"k"], 5), answer_of([b"k"], 9))
    filters = KeyFilters(api, clock=lambda: now[0])
    first, second = await asyncio.gather(filters.of(0), filters.of(0))
    assert first is second and first is not None and api.calls == 1
    filters.drop(0, first)
    assert await filters.of(0) is None and api.calls == 1
    now[0] += BEHIND_RETRY_S
    again = await filters.of(0)
    assert again is not None and again.through == 9 and api.calls == 2


async def test_a_partition_without_a_usable_filter_is_asked_again_only_after_a_while() -> None:
    now = [0.0]
    api = FakeReadApi(ReadApiError(403, "permission_denied", "no"), answer_of([], 0, complete=False), answer_of([], 4))
    filters = KeyFilters(api, clock=lambda: now[0])
    assert await filters.of(1) is None and await filters.of(1) is None and api.calls == 1
    now[0] += RETRY_S
    assert await filters.of(1) is None and api.calls == 2  # not complete: a projection older than the filter
    now[0] += RETRY_S
    assert (await filters.of(1)) is not None and api.calls == 3


async def test_an_unreachable_read_api_is_asked_again_at_the_next_read() -> None:
    api = FakeReadApi(ReadApiError(0, "unreachable", "down", retryable=True), answer_of([], 2))
    filters = KeyFilters(api)
    assert await filters.of(3) is None
    assert await filters.of(3) is not None and api.calls == 2
