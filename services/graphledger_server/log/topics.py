"""The topics: which ones are the source of truth, creating them, and what the broker says of their retention.

The checkpoint and store topics are the source of truth, so their retention must be infinite:
`ensure_topics` (`graphledger topics ensure`) creates them with `retention.ms=-1` and refuses an
existing topic with finite retention unless `allow_finite_retention` is set. The dead-letter topic
may expire. Their records carry the broker's time at append (`message.timestamp.type=LogAppendTime`),
the clock store expiry and thread idle times follow: an existing source topic that says otherwise is
refused.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError

from graphledger.errors import FiniteRetentionError, TimestampTypeError
from graphledger.settings import Settings
from graphledger_server.log.clients import new_admin

log = logging.getLogger(__name__)

INFINITE = "-1"
RETENTION_CONFIGS = ("retention.ms", "retention.bytes", "cleanup.policy")
TIMESTAMP_TYPE = "message.timestamp.type"
LOG_APPEND_TIME = "LogAppendTime"
"""The broker stamps each record with its own clock when it appends it (the default, CreateTime, keeps
the producer's): an event's time (`append_time_ms`), which no writer controls and a replay reads again."""


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
                if source:
                    configs[TIMESTAMP_TYPE] = LOG_APPEND_TIME
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
            described = await retention_configs(admin, name, (*RETENTION_CONFIGS, TIMESTAMP_TYPE)) or {}
            retention = described.get("retention.ms")
            if source:
                check_timestamp_type(name, described.get(TIMESTAMP_TYPE))
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


def check_timestamp_type(topic: str, described: str | None) -> None:
    """Refuse a source topic whose records carry their producer's time; None: the broker did not say
    (tansu describes only the configs a topic was created with)."""
    if described is not None and described != LOG_APPEND_TIME:
        raise TimestampTypeError(
            f"topic {topic} has {TIMESTAMP_TYPE}={described}: its records carry their writers' clocks, which would "
            f"date store expiry and thread idle times; set {TIMESTAMP_TYPE}={LOG_APPEND_TIME} (kafka-configs.sh "
            f"--alter --entity-type topics --entity-name {topic} --add-config {TIMESTAMP_TYPE}={LOG_APPEND_TIME})"
        )


async def retention_configs(
    admin: AIOKafkaAdminClient, topic: str, names: tuple[str, ...] = RETENTION_CONFIGS
) -> dict[str, str] | None:
    """The topic's configs `names` (default `RETENTION_CONFIGS`) as the broker describes them; None when
    it does not describe configs."""
    try:
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    except Exception as exc:  # brokers without DescribeConfigs answer with assorted errors
        log.warning("cannot describe the configs of %s: %s", topic, exc)
        return None
    found: dict[str, str] = {}
    for response in responses:
        for resource in getattr(response, "resources", []):
            for entry in resource[4]:
                if entry[0] in names and entry[1] is not None:
                    found[entry[0]] = entry[1]
    return found
