"""The topics: which ones are the source of truth, creating them, and what the broker says of their retention.

The checkpoint and store topics are the source of truth, so their retention must be infinite:
`ensure_topics` (`graphledger topics ensure`) creates them with `retention.ms=-1` and refuses an
existing topic with finite retention unless `allow_finite_retention` is set. The dead-letter topic
may expire.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError

from graphledger.errors import FiniteRetentionError
from graphledger.settings import Settings
from graphledger_server.log.clients import new_admin

log = logging.getLogger(__name__)

INFINITE = "-1"
RETENTION_CONFIGS = ("retention.ms", "retention.bytes", "cleanup.policy")


@dataclass(frozen=True)
class TopicReport:
    name: str
    created: bool
    partitions: int
    retention_ms: str | None


def source_topics(settings: Settings) -> list[str]:
    return [settings.checkpoint_topic, settings.store_topic]


async def ensure_topics(settings: Settings, *, allow_finite_retention: bool = False) -> list[TopicReport]:
    admin = new_admin(settings)
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
            retention = (await retention_configs(admin, name) or {}).get("retention.ms")
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


async def retention_configs(admin: AIOKafkaAdminClient, topic: str) -> dict[str, str] | None:
    """The topic's `RETENTION_CONFIGS` as the broker describes them; None when it does not describe
    configs (tansu)."""
    try:
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    except Exception as exc:  # brokers without DescribeConfigs answer with assorted errors
        log.warning("cannot describe the configs of %s: %s", topic, exc)
        return None
    found: dict[str, str] = {}
    for response in responses:
        for resource in getattr(response, "resources", []):
            for entry in resource[4]:
                if entry[0] in RETENTION_CONFIGS and entry[1] is not None:
                    found[entry[0]] = entry[1]
    return found
