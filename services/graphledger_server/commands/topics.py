"""`graphledger topics ensure`: create the topics, or check the existing ones.

The checkpoint and store topics are the source of truth, so their retention must be infinite:
`ensure` creates them with `retention.ms=-1` and refuses an existing topic with finite retention
unless `allow_finite_retention` is set. The dead-letter topic may expire.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError

from graphledger.errors import FiniteRetentionError
from graphledger.settings import Settings

log = logging.getLogger(__name__)

INFINITE = "-1"


@dataclass(frozen=True)
class TopicReport:
    name: str
    created: bool
    partitions: int
    retention_ms: str | None


def source_topics(settings: Settings) -> list[str]:
    return [settings.checkpoint_topic, settings.store_topic]


async def ensure_topics(settings: Settings, *, allow_finite_retention: bool = False) -> list[TopicReport]:
    admin = AIOKafkaAdminClient(**settings.kafka_client_options())  # type: ignore[arg-type]
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = {name: True for name in source_topics(settings)}
        wanted[settings.dead_letter_topic] = False
        reports = []
        for name, source in wanted.items():
            created = False
            if name not in existing:
                configs = {"retention.ms": INFINITE, "retention.bytes": INFINITE} if source else {}
                try:
                    await admin.create_topics(
                        [
                            NewTopic(
                                name,
                                settings.topic_partitions,
                                settings.topic_replication_factor,
                                topic_configs=configs,
                            )
                        ]
                    )
                    created = True
                except TopicAlreadyExistsError:
                    pass
            retention = await _retention_ms(admin, name)
            if source and retention not in (None, INFINITE) and not allow_finite_retention:
                raise FiniteRetentionError(
                    f"topic {name} has retention.ms={retention}; the log is the source of truth and needs "
                    f"retention.ms=-1 (pass --allow-finite-retention to accept losing old events)"
                )
            meta = await admin.describe_topics([name])
            partitions = len(meta[0].get("partitions", [])) if meta else 0
            reports.append(TopicReport(name, created, partitions, retention))
            log.info(
                "topic %s: %s, %d partitions, retention.ms=%s",
                name,
                "created" if created else "exists",
                partitions,
                retention,
            )
        return reports
    finally:
        await admin.close()


async def _retention_ms(admin: AIOKafkaAdminClient, topic: str) -> str | None:
    """The topic's retention.ms, or None when the broker does not describe configs (tansu)."""
    try:
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    except Exception as exc:  # brokers without DescribeConfigs answer with assorted errors
        log.warning("cannot read retention of %s: %s", topic, exc)
        return None
    for response in responses:
        for resource in getattr(response, "resources", []):
            for entry in resource[4]:
                if entry[0] == "retention.ms":
                    return entry[1]
    return None
