"""The one way the services build a Kafka client, each from `Settings.kafka_client_options()`.

A TLS or SASL setting then reaches every client. Producers are the client library's `new_producer`,
the one every writer uses, so a service acknowledges and frames records exactly as an agent does.
Consumers never commit to Kafka on their own (progress lives in `graphledger_offsets`), and fetch at
least a whole record of `max_message_bytes` plus its headers from a partition at once. A compressed
batch decompresses to at most `max_decompressed_batch_bytes` (`graphledger.log.compressed_batches`): past
that, the consumer yields a placeholder record for it, which the projector dead-letters.
"""

from __future__ import annotations

from typing import Literal

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient

from graphledger.client.producer import new_producer
from graphledger.events.chunks import RECORD_HEADROOM_BYTES
from graphledger.log.compressed_batches import bound_decompression
from graphledger.settings import Settings

__all__ = ["new_admin", "new_consumer", "new_producer"]

FETCH_BYTES = 1024 * 1024
"""A partition's fetch, at least (aiokafka's default)."""


def new_consumer(
    settings: Settings,
    *,
    group_id: str | None = None,
    auto_offset_reset: Literal["earliest", "none"] = "earliest",
    fetch_bytes: int = FETCH_BYTES,
) -> AIOKafkaConsumer:
    """An unstarted consumer: in `group_id` (None: partitions assigned by hand), from the earliest offset
    where none is known (`none`: a lost position raises), fetching `fetch_bytes` a partition or a whole
    record, whichever is more."""
    bound_decompression(settings.max_decompressed_batch_bytes)
    return AIOKafkaConsumer(
        **settings.kafka_client_options(),
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset=auto_offset_reset,
        fetch_max_wait_ms=settings.fetch_max_wait_ms,
        max_partition_fetch_bytes=max(fetch_bytes, settings.max_message_bytes + RECORD_HEADROOM_BYTES),
    )


def new_admin(settings: Settings) -> AIOKafkaAdminClient:
    """An unstarted admin client (topics, their configs, consumer groups)."""
    return AIOKafkaAdminClient(**settings.kafka_client_options())
