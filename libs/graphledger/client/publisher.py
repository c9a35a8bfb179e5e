"""Publishing events to Kafka.

A write returns once the broker acknowledged it (`acks=all`), with the partitions and offsets it
landed at, which become consistency tokens (`tokens.py`), or fails with a retryable `PublishError`
after `produce_timeout_s` when the broker is down or hung; the producer reconnects by itself, so the
next write after the broker is back succeeds. Events larger than `max_message_bytes` go out as chunk
records with the event's key, so they share a partition. At most `max_inflight_bytes` of events are
sent and not yet acknowledged at once: a write beyond waits for room (acknowledgements free it)
within the same deadline, so a slow or absent broker never grows the client's memory without bound.
"""

from __future__ import annotations

import asyncio
from collections import deque

from aiokafka import AIOKafkaProducer
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError
from opentelemetry.context import Context

from graphledger.client.producer import new_producer
from graphledger.errors import PartitionCountChangedError, PublishError
from graphledger.events import chunks, envelope
from graphledger.events.envelope import Envelope
from graphledger.log.layout import key_partitioner
from graphledger.settings import Settings
from graphledger.telemetry import client as telemetry
from graphledger.telemetry.propagation import traceparent


class InflightBytes:
    """Bytes of events sent and not acknowledged yet, at most `limit` (one larger event goes alone).

    Writers wait first come, first served. With room, `acquire` takes no lock and arms no timer: it
    runs once per write, and the condition-and-timeout version of it cost a tenth of a write's CPU.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    async def acquire(self, size: int) -> int:
        """Hold `size` bytes (at most `limit`) once there is room; returns what is held. A caller
        cancelled while it waits (its deadline) holds nothing."""
        size = min(size, self.limit)
        if not self._waiting and self.used + size <= self.limit:
            self.used += size
            return size
        room: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((size, room))
        try:
            await room
        except BaseException:
            if room.done() and not room.cancelled():
                self.release(size)  # granted just as the wait ended
            else:
                self._wake()  # a writer behind this one may fit now
            raise
        return size

    def release(self, size: int) -> None:
        self.used -= size
        self._wake()

    def _wake(self) -> None:
        while self._waiting:
            size, room = self._waiting[0]
            if room.done():  # cancelled while waiting
                self._waiting.popleft()
            elif self.used + size <= self.limit:
                self._waiting.popleft()
                self.used += size
                room.set_result(None)
            else:
                return


class EventPublisher:
    """One aiokafka producer; runs on the client's background loop."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._producer: AIOKafkaProducer | None = None
        self.inflight: InflightBytes | None = None

    async def start(self) -> None:
        producer = new_producer(self._settings)
        try:
            await asyncio.wait_for(producer.start(), self._settings.produce_timeout_s)
        except (TimeoutError, KafkaError, OSError) as exc:
            await producer.stop()
            raise PublishError(
                f"cannot reach Kafka at {self._settings.kafka_bootstrap_servers}: {exc or type(exc).__name__}"
            ) from exc
        self._producer = producer
        self.inflight = InflightBytes(self._settings.max_inflight_bytes)  # on the loop that publishes

    @property
    def kafka_client(self) -> AIOKafkaClient:
        """The started producer's connection to the cluster (for fetches of the log's tail)."""
        assert self._producer is not None, "publisher not started"
        return self._producer.client

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def partitions(self, topic: str) -> list[int]:
        assert self._producer is not None
        try:  # waits for metadata up to the producer's request timeout, produce_timeout_s
            return sorted(await self._producer.partitions_for(topic))
        except KafkaError as exc:
            raise PublishError(
                f"Kafka did not tell the partitions of {topic} within {self._settings.produce_timeout_s}s: "
                f"{exc or type(exc).__name__}"
            ) from exc

    async def partition_of(self, topic: str, key: bytes) -> int | None:
        """The partition the producer routes a record with `key` to now; None when the topic's partitions
        are not known, or their count is not the recorded one (the producer refuses to route then)."""
        assert self._producer is not None
        try:
            partitions = await self.partitions(topic)
            self._producer.layout.check(topic, len(partitions))
        except (PublishError, PartitionCountChangedError):
            return None
        return key_partitioner(key, partitions, partitions)

    async def publish(
        self,
        topic: str,
        key: str | None,
        event: Envelope,
        *,
        context: Context | None = None,
        partition: int | None = None,
    ) -> list[tuple[str, int, int]]:
        """Publish one event; returns `(topic, partition, offset)` of each record once all are acknowledged.

        The event gets a producer span under `context` (the caller's, captured in the caller's thread);
        the span's context rides in the records' `traceparent` header, so the projector links to it.
        """
        assert self._producer is not None and self.inflight is not None, "publisher not started"
        value = envelope.encode(event)
        timeout_s = self._settings.produce_timeout_s
        held = 0
        try:
            # One deadline for the whole write: room, then `send` (which itself waits when the broker
            # is away: for metadata, or for room in the partition's one pending batch), then the ack.
            async with asyncio.timeout(timeout_s):
                held = await self.inflight.acquire(len(value))
                return await self._send(topic, key, event, value, context, partition)
        except TimeoutError as exc:
            if not held:
                raise PublishError(
                    f"no room for a {len(value)}-byte {event.type} event within {timeout_s}s: "
                    f"{self.inflight.used} bytes await the broker's acknowledgement (GRAPHLEDGER_MAX_INFLIGHT_BYTES "
                    f"{self.inflight.limit}); the broker is slow or unreachable, retry"
                ) from exc
            raise _unacknowledged(event, topic, timeout_s, exc) from exc
        finally:
            if held:
                self.inflight.release(held)

    async def _send(
        self,
        topic: str,
        key: str | None,
        event: Envelope,
        value: bytes,
        context: Context | None,
        partition: int | None,
    ) -> list[tuple[str, int, int]]:
        assert self._producer is not None
        # Thread ids key the checkpoint topic and are no secret; store keys may name a user: not recorded.
        key_attribute = key if topic == self._settings.checkpoint_topic else None
        span = telemetry.start_send_span(topic, event.type, event.event_id, len(value), key_attribute, context)
        headers = envelope.headers_for(event, traceparent(span, context))
        key_bytes = key.encode() if key is not None else None
        records = chunks.frame(value, headers, self._settings.max_message_bytes, event.event_id)
        try:
            futures = [
                await self._producer.send(topic, r.value, key=key_bytes, headers=r.headers, partition=partition)
                for r in records
            ]
            acked = [await futures[0]] if len(futures) == 1 else await asyncio.gather(*futures)
        except KafkaError as exc:
            telemetry.fail_span(span, exc)
            raise _unacknowledged(event, topic, self._settings.produce_timeout_s, exc) from exc
        except BaseException as exc:  # the deadline (cancelled), or a producer error: the span still ends
            telemetry.fail_span(span, exc)
            raise
        positions = [(metadata.topic, metadata.partition, metadata.offset) for metadata in acked]
        telemetry.end_send_span(span, positions)
        return positions


def _unacknowledged(event: Envelope, topic: str, timeout_s: float, exc: BaseException) -> PublishError:
    return PublishError(
        f"Kafka did not acknowledge a {event.type} event on {topic} within {timeout_s}s: {exc or type(exc).__name__}"
    )
