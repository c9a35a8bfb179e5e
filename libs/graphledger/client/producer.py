"""The one way graphledger builds a Kafka producer: the client's publisher and every service's writer.

A write counts once every in-sync replica has it (`acks=all`); idempotence follows the setting
(brokers without InitProducerId, such as the embedded tansu, need it off). A request may carry a
whole record of `max_message_bytes` plus its headers, and one partition's batch may hold a whole
chunk: the 16 KiB default batch split concurrent checkpoints into many small produce requests.
Requests time out after `produce_timeout_s`, the deadline every writer waits for acknowledgements.
The producer refuses to route a source topic's record while the broker reports another partition count
than the one `topics ensure` recorded (`graphledger.log.layout`).
"""

from __future__ import annotations

from graphledger.events.chunks import RECORD_HEADROOM_BYTES
from graphledger.log.layout import PartitionCheckedProducer, PartitionLayout, key_partitioner
from graphledger.settings import Settings


def new_producer(settings: Settings, *, linger_ms: int = 0) -> PartitionCheckedProducer:
    """An unstarted producer with the shared connection options; `linger_ms` trades latency for batching."""
    request_bytes = settings.max_message_bytes + RECORD_HEADROOM_BYTES
    return PartitionCheckedProducer(
        PartitionLayout(settings),
        **settings.kafka_client_options(),
        acks="all",
        enable_idempotence=settings.kafka_idempotence,
        max_request_size=request_bytes,
        max_batch_size=request_bytes,
        request_timeout_ms=int(settings.produce_timeout_s * 1000),
        linger_ms=linger_ms,
        partitioner=key_partitioner,
    )
