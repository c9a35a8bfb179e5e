"""Mirror the applied offsets into the projector's Kafka consumer group, for monitoring only.

Kafka's own lag tooling (`kafka-consumer-groups --describe`, Burrow, KEDA's Kafka scaler, the Strimzi
and MSK consoles) reads a group's lag from the offsets it commits to Kafka. The projector's progress
lives in Postgres (`graphledger_offsets`, in each batch's transaction), so after each committed batch,
and on each assignment, the same next offsets are also committed to the group in Kafka.

Postgres stays the truth: on assignment the worker seeks to the stored offsets and never to Kafka's
(it pauses new partitions until it has), so a Kafka commit that is missing, stale or ahead (Postgres
restored from a backup, `graphledger offsets reset`) changes nothing applied. A failed commit is
logged and counted (`graphledger.projector.offset_commit.failures`), never retried on its own and never
fails or retries a batch: the next batch's commit carries newer offsets anyway.

Commits run in a task of their own, one at a time and at most one per `COMMIT_INTERVAL_S`, the newest
offsets per partition coalesced meanwhile, so the apply loop never waits for a broker round trip and
the broker serves a commit a second, not one per batch (a hundred a second at concurrency 1, each a
request tansu serves on the stack's core). `close` commits what is pending at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka import TopicPartition

from graphledger.tasks import set_within
from graphledger_server.telemetry.projector import offset_commit_failed

log = logging.getLogger(__name__)

COMMIT_TIMEOUT_S = 5.0
"""Longest one commit may take (aiokafka retries a retriable error without end, e.g. while the group
coordinator is unknown); past it the commit counts as failed."""
COMMIT_INTERVAL_S = 1.0
"""Least time between two commits: lag tools poll a group's offsets every few seconds at most."""
LOG_EVERY_S = 60.0
"""At most one warning per this many seconds while commits keep failing (the counter counts each)."""


class GroupOffsetMirror:
    """Commits next offsets to the consumer's group in Kafka in the background, newest first."""

    def __init__(
        self, consumer: Any, timeout_s: float = COMMIT_TIMEOUT_S, interval_s: float = COMMIT_INTERVAL_S
    ) -> None:
        self._consumer = consumer
        self._timeout_s = timeout_s
        self._interval_s = interval_s
        self._pending: dict[TopicPartition, int] = {}
        self._task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._failures_unlogged = 0
        self._logged_at = -LOG_EVERY_S

    def submit(self, next_offsets: Mapping[tuple[str, int], int]) -> None:
        """Commit these next offsets soon (after the commit in flight, if any)."""
        if not next_offsets:
            return
        self._pending.update({TopicPartition(topic, partition): o for (topic, partition), o in next_offsets.items()})
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="kafka offset commits")

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """Partitions revoked: their pending offsets are another worker's to commit now."""
        for tp in partitions:
            self._pending.pop(tp, None)

    async def close(self) -> None:
        """Commit what is pending now and let that finish within its timeout (a graceful stop commits the
        last batch's offsets, so Kafka's tools show no lag for what was applied)."""
        self._closing.set()
        if self._task is not None:
            await self._task

    async def _drain(self) -> None:
        while self._pending:
            assigned = self._consumer.assignment()
            offsets = {tp: offset for tp, offset in self._pending.items() if tp in assigned}
            self._pending = {}
            if offsets:
                await self._commit(offsets)
                await set_within(self._closing, self._interval_s)  # the interval, or until `close`

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        try:
            await asyncio.wait_for(self._consumer.commit(offsets), self._timeout_s)
        except Exception as exc:  # monitoring only: whatever went wrong, the batches go on
            offset_commit_failed(exc)
            self._failures_unlogged += 1
            now = time.monotonic()
            if now - self._logged_at >= LOG_EVERY_S:
                log.warning(
                    "cannot commit applied offsets to the consumer group in Kafka (%s: %s; %d failed since the "
                    "last warning); Kafka's lag tools see stale lag until a commit succeeds, the projection is "
                    "not affected",
                    type(exc).__name__, exc, self._failures_unlogged,
                )  # fmt: skip
                self._logged_at = now
                self._failures_unlogged = 0
