"""The one way a test builds a bare Kafka client: a producer that publishes records as any producer can
(forged, hostile, from a newer graphledger, filler), a consumer that reads records back as they are, and
an admin client for what a test sets up or inspects on the broker itself (topics, consumer groups).

All three connect as every graphledger client does, with `Settings.kafka_client_options()` (bootstrap
servers, TLS, SASL). None is graphledger's own: the services' and the agents' clients are built by
`graphledger_server.log.clients` and `graphledger.client.producer`, which check partition counts and
route keys as graphledger does; a test that needs a record on a given partition names the partition.
"""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from graphledger.settings import Settings

__all__ = ["raw_admin", "raw_consumer", "raw_producer"]


def raw_producer(settings: Settings, **overrides: Any) -> AIOKafkaProducer:
    """An unstarted producer with idempotence off, because the tansu broker of the tests answers no
    InitProducerId (`kafka_idempotence=False` in every test's settings), and `acks="all"`, so a send
    returns once every in-sync replica has the record, as with graphledger's own producer. `overrides`
    are further `AIOKafkaProducer` options, such as `max_request_size` for a record past the 1 MiB
    default.

    No `type: ignore` is needed, here or at a caller: aiokafka ships no type information (mypy takes its
    classes as `Any`, `[tool.mypy]` in pyproject.toml), and the options are passed as `dict[str, Any]`."""
    options: dict[str, Any] = {
        **settings.kafka_client_options(),
        "enable_idempotence": False,
        "acks": "all",
        **overrides,
    }
    return AIOKafkaProducer(**options)


def raw_consumer(settings: Settings, *topics: str, **overrides: Any) -> AIOKafkaConsumer:
    """An unstarted consumer in no consumer group (aiokafka's default `group_id=None`) that commits
    nothing: the test assigns and seeks partitions itself, or subscribes to `topics` (with
    `auto_offset_reset="earliest"` to read them from their first record). `overrides` are further
    `AIOKafkaConsumer` options."""
    options: dict[str, Any] = {**settings.kafka_client_options(), "enable_auto_commit": False, **overrides}
    return AIOKafkaConsumer(*topics, **options)


def raw_admin(settings: Settings) -> AIOKafkaAdminClient:
    """An unstarted admin client (topics, their configs, consumer groups)."""
    return AIOKafkaAdminClient(**settings.kafka_client_options())
