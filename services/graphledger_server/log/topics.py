"""The topics: which ones are the source of truth, creating them, and what the broker says of their retention
and durability.

The checkpoint and store topics are the source of truth, so their retention must be infinite:
`ensure_topics` (`graphledger topics ensure`) creates them with `retention.ms=-1` and refuses an
existing topic with finite retention unless `allow_finite_retention` is set. The dead-letter topic
may expire. Their records carry the broker's time at append (`message.timestamp.type=LogAppendTime`),
the clock store expiry and thread idle times follow: an existing source topic that says otherwise is
refused. An acknowledged write to them must survive losing a broker: they are created with
`min.insync.replicas` (`durability.py` says why and decides), and a topic one broker could acknowledge
for is refused unless `allow_single_broker_acks`. Their partition counts are recorded in the layout
topic, and a source topic whose count is not the recorded one is refused (`layout.py`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError, for_code

from graphledger.errors import FiniteRetentionError, TimestampTypeError, TopicConfigError
from graphledger.settings import Settings
from graphledger_server.log import durability, layout
from graphledger_server.log.clients import new_admin

log = logging.getLogger(__name__)

INFINITE = "-1"
RETENTION_CONFIGS = ("retention.ms", "retention.bytes", "cleanup.policy")
TIMESTAMP_TYPE = "message.timestamp.type"
LOG_APPEND_TIME = "LogAppendTime"


@dataclass(frozen=True)
class TopicReport:
    name: str
    created: bool
    partitions: int
    retention_ms: str | None
    replication_factor: int = 0
    min_insync_replicas: int | None = None
    """As the broker describes it; None when it does not."""
    recorded_partitions: int | None = None
    """The count the layout topic records (source topics only)."""


@dataclass(frozen=True, slots=True)
class _Found:
    """A topic as the broker describes it."""

    partitions: int
    replication_factor: int
    configs: dict[str, str] | None


def source_topics(settings: Settings) -> list[str]:
    return [settings.checkpoint_topic, settings.store_topic]


async def ensure_topics(
    settings: Settings, *, allow_finite_retention: bool = False, allow_single_broker_acks: bool | None = None
) -> list[TopicReport]:
    """Create the topics that are missing and check the ones that exist. Every existing topic is
    checked before anything is created, so a refusal changes nothing. `allow_single_broker_acks`
    None: `settings.topic_allow_single_broker_acks`."""
    if allow_single_broker_acks is None:
        allow_single_broker_acks = settings.topic_allow_single_broker_acks
    wanted = {name: True for name in source_topics(settings)}
    wanted[settings.dead_letter_topic] = False
    admin = new_admin(settings)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        if any(source and name not in existing for name, source in wanted.items()):
            durability.refuse_planned(settings, allow_single_broker_acks=allow_single_broker_acks)
        found = {name: await _describe(admin, name) for name in wanted if name in existing}
        recorded = await layout.recorded_counts(admin, settings)
        layout.refuse_changed_counts(
            settings,
            recorded,
            {name: found[name].partitions if name in found else None for name in source_topics(settings)},
        )
        warnings = [
            _check(settings, name, state, allow_finite_retention, allow_single_broker_acks)
            for name, state in found.items()
            if wanted[name]
        ]
        created = set()
        for name, source in wanted.items():
            if name in found:
                continue
            configs = {"retention.ms": INFINITE, "retention.bytes": INFINITE} if source else {}
            if source:
                configs[durability.MIN_INSYNC_REPLICAS] = str(settings.min_insync_replicas)
                configs[TIMESTAMP_TYPE] = LOG_APPEND_TIME
            if await _create(admin, NewTopic(name, settings.topic_partitions, settings.topic_replication_factor,
                                             topic_configs=configs)):  # fmt: skip
                created.add(name)
            found[name] = state = await _describe(admin, name)
            if source:  # what the broker made of it
                warnings.append(_check(settings, name, state, allow_finite_retention, allow_single_broker_acks))
        for warning in warnings:
            if warning is not None:
                log.warning("%s", warning)
        counts = {name: found[name].partitions for name in source_topics(settings)}
        recorded = await layout.record_counts(admin, settings, existing, recorded, counts)
        reports = []
        for name in wanted:
            state = found[name]
            configs = state.configs or {}
            in_sync = configs.get(durability.MIN_INSYNC_REPLICAS)
            report = TopicReport(
                name,
                name in created,
                state.partitions,
                configs.get("retention.ms"),
                state.replication_factor,
                int(in_sync) if in_sync is not None else None,
                recorded.get(name),
            )
            reports.append(report)
            log.info(
                "topic %s: %s, %d partitions, retention.ms=%s, replication factor %d, min.insync.replicas=%s",
                name,
                "created" if report.created else "exists",
                report.partitions,
                report.retention_ms,
                report.replication_factor,
                report.min_insync_replicas,
            )
        return reports
    finally:
        await admin.close()


def _check(
    settings: Settings, name: str, state: _Found, allow_finite_retention: bool, allow_single_broker_acks: bool
) -> str | None:
    """Refuse a source topic that loses events (finite retention, unless allowed) or acknowledges writes
    on one broker (unless allowed); returns a warning to log, if any."""
    configs = state.configs or {}
    check_timestamp_type(name, configs.get(TIMESTAMP_TYPE))
    retention = configs.get("retention.ms")
    if retention not in (None, INFINITE) and not allow_finite_retention:
        raise FiniteRetentionError(
            f"topic {name} has retention.ms={retention}; the log is the source of truth and needs "
            f"retention.ms=-1 (pass --allow-finite-retention to accept losing old events)"
        )
    in_sync = configs.get(durability.MIN_INSYNC_REPLICAS)
    found = durability.Durability(name, state.replication_factor, int(in_sync) if in_sync is not None else None)
    return durability.check_existing(
        found, settings.min_insync_replicas, allow_single_broker_acks=allow_single_broker_acks
    )


async def _describe(admin: AIOKafkaAdminClient, name: str) -> _Found:
    meta = await admin.describe_topics([name])
    partitions = meta[0].get("partitions", []) if meta else []
    replicas = min((len(p.get("replicas") or ()) for p in partitions), default=0)
    configs = await described_configs(admin, name, (*RETENTION_CONFIGS, durability.MIN_INSYNC_REPLICAS, TIMESTAMP_TYPE))
    return _Found(len(partitions), replicas, configs)


async def _create(admin: AIOKafkaAdminClient, topic: NewTopic) -> bool:
    """Create `topic`; False when it exists already (another `topics ensure` won the race)."""
    response = await admin.create_topics([topic])
    for name, error_code, *rest in response.topic_errors:
        error = for_code(error_code)
        if error is TopicAlreadyExistsError:
            return False
        if error_code:
            message = rest[0] if rest and rest[0] else error.__name__
            raise TopicConfigError(f"Kafka refused to create topic {name}: {message}")
    return True


def check_timestamp_type(topic: str, described: str | None) -> None:
    """Refuse a source topic whose records carry their producer's time; None: the broker did not say
    (tansu describes only the configs a topic was created with)."""
    if described is not None and described != LOG_APPEND_TIME:
        raise TimestampTypeError(
            f"topic {topic} has {TIMESTAMP_TYPE}={described}: its records carry their writers' clocks, which would "
            f"date store expiry and thread idle times; set {TIMESTAMP_TYPE}={LOG_APPEND_TIME} (kafka-configs.sh "
            f"--alter --entity-type topics --entity-name {topic} --add-config {TIMESTAMP_TYPE}={LOG_APPEND_TIME})"
        )


async def retention_configs(admin: AIOKafkaAdminClient, topic: str) -> dict[str, str] | None:
    """The topic's `RETENTION_CONFIGS` as the broker describes them; None when it does not describe
    configs (tansu)."""
    return await described_configs(admin, topic, RETENTION_CONFIGS)


async def described_configs(admin: AIOKafkaAdminClient, topic: str, names: tuple[str, ...]) -> dict[str, str] | None:
    """The topic's configs among `names` as the broker describes them; None when it does not describe configs."""
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
