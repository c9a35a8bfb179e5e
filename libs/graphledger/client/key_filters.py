"""This process's copies of the checkpoint partitions' key filters (`graphledger.log.key_filter`), fetched from
the read API when a read first needs one, on the client's loop.

Every proof that a thread is new extends its partition's copy with the keys it scanned, and every write of
this process acknowledged right at a copy's `through` extends it with its key, so the next proof scans only
what other processes appended since: most often nothing, and a fetch that finds no records costs least
(a client's and a broker's CPU: tansu lists the partition for a fetch that finds records, at a cost that
grows with the log). A scan that does not reach the log's end in one fetch (the copy fell far behind)
drops the copy, and a proof `BEHIND_RETRY_S` later fetches a fresh one (sooner, a fresh copy would be as
far behind: the projector's position lags as far). A partition whose filter cannot serve as a proof (a
projection older than the filter, an older read API, a refusal) is asked again after `RETRY_S`; one that
failed for a passing reason (the read API unreachable) at the next read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from graphledger.errors import ReadApiError
from graphledger.log.key_filter import KeyFilter

log = logging.getLogger(__name__)

FILTER_PATH = "/v1/checkpoints/key-filter"
RETRY_S = 60.0
"""How long a partition whose filter cannot serve goes without asking again."""
BEHIND_RETRY_S = 1.0
"""How long a partition whose copy fell behind goes without a fresh one."""

Read = Callable[[str, dict[str, Any], Mapping[str, str] | None], Awaitable[Any]]


class KeyFilters:
    """The copies of one client, by partition."""

    def __init__(self, read: Read, clock: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self._clock = clock
        self._filters: dict[int, KeyFilter] = {}
        self._retry_at: dict[int, float] = {}
        self._fetching: dict[int, asyncio.Future[KeyFilter | None]] = {}

    async def of(self, partition: int) -> KeyFilter | None:
        """The partition's copy, fetched first if there is none (concurrent readers share the fetch); None
        when the partition has no usable filter now."""
        copy = self._filters.get(partition)
        if copy is not None:
            return copy
        if self._clock() < self._retry_at.get(partition, 0.0):
            return None
        fetching = self._fetching.get(partition)
        if fetching is None:
            fetching = self._fetching[partition] = asyncio.ensure_future(self._fetch(partition))
            fetching.add_done_callback(lambda _: self._fetching.pop(partition, None))
        return await asyncio.shield(fetching)

    def written(self, partition: int, offset: int, key: bytes | None) -> None:
        """This process's record at `offset` was acknowledged: the partition's copy, if it holds every key
        below that offset, holds this one too."""
        copy = self._filters.get(partition)
        if copy is not None:
            copy.extend(offset, (key,), offset + 1)

    def drop(self, partition: int, copy: KeyFilter) -> None:
        """Forget `copy` (if it is still the partition's), which fell behind the log's end."""
        if self._filters.get(partition) is copy:
            del self._filters[partition]
            self._retry_at[partition] = self._clock() + BEHIND_RETRY_S

    async def _fetch(self, partition: int) -> KeyFilter | None:
        try:
            answer = await self._read(FILTER_PATH, {"partition": partition}, None)
        except ReadApiError as exc:
            if not exc.retryable:
                log.warning("no key filter for partition %d (%s): new threads' first reads go to the read API for "
                            "%gs", partition, exc, RETRY_S)  # fmt: skip
                self._retry_at[partition] = self._clock() + RETRY_S
            return None
        copy = KeyFilter.from_answer(answer)
        if copy is None:
            log.info("the key filter of partition %d does not cover its first records yet", partition)
            self._retry_at[partition] = self._clock() + RETRY_S
            return None
        self._filters[partition] = copy
        return copy
