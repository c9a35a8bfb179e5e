"""Whether an acknowledged write survives losing a broker: a source topic's replication factor and
`min.insync.replicas`, and the decisions `topics ensure` takes on them.

Producers write with `acks=all` (`client/producer.py`): the leader acknowledges a record once every
replica in the partition's in-sync set holds it, and refuses writes (NOT_ENOUGH_REPLICAS) while that set
is smaller than `min.insync.replicas`. The in-sync set shrinks when a follower falls behind or its broker
goes away, down to the leader alone. So a write is on at least `min(replication factor,
min.insync.replicas)` brokers when it is acknowledged, and it survives losing any one broker only when
both numbers are at least 2. Kafka's default `min.insync.replicas` is 1: with it, `acks=all` is the
leader's word alone as soon as its followers lag, and losing the leader then loses acknowledged writes.

Pure code: `topics ensure` (`log/topics.py`) gathers the numbers from the broker and asks here.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphledger.errors import SingleBrokerAcksError, TopicConfigError
from graphledger.settings import Settings

MIN_INSYNC_REPLICAS = "min.insync.replicas"
SURVIVES_ONE_LOSS = 2
"""Brokers that must hold an acknowledged write for it to survive losing any one of them."""
ACCEPT = (
    "pass --allow-single-broker-acks (GRAPHLEDGER_TOPIC_ALLOW_SINGLE_BROKER_ACKS=true) to accept losing "
    "acknowledged writes with that broker"
)


@dataclass(frozen=True, slots=True)
class Durability:
    """What a source topic's writes need before they are acknowledged."""

    topic: str
    replication_factor: int
    """The fewest replicas any of its partitions has."""
    min_insync_replicas: int | None
    """None: the broker did not describe it (no DescribeConfigs, or not allowed to)."""

    @property
    def acknowledgers(self) -> int | None:
        """The fewest brokers that can hold a write when it is acknowledged; None when unknown."""
        if self.min_insync_replicas is None:
            return self.replication_factor if self.replication_factor < SURVIVES_ONE_LOSS else None
        return min(self.replication_factor, self.min_insync_replicas)


def planned(settings: Settings, topic: str) -> Durability:
    """What `topics ensure` creates `topic` with."""
    return Durability(topic, settings.topic_replication_factor, settings.min_insync_replicas)


def refuse_planned(settings: Settings, *, allow_single_broker_acks: bool) -> None:
    """Before creating anything: refuse settings that would create topics one broker acknowledges for."""
    if allow_single_broker_acks or settings.min_insync_replicas >= SURVIVES_ONE_LOSS:
        return
    raise SingleBrokerAcksError(
        f"GRAPHLEDGER_TOPIC_REPLICATION_FACTOR {settings.topic_replication_factor} and min.insync.replicas "
        f"{settings.min_insync_replicas} (GRAPHLEDGER_TOPIC_MIN_INSYNC_REPLICAS) let a single broker acknowledge "
        "a write to the source topics: losing it loses acknowledged writes. Set both to at least 2, or "
        f"{ACCEPT}"
    )


def check_existing(found: Durability, wanted: int, *, allow_single_broker_acks: bool) -> str | None:
    """Refuse a topic no write can be acknowledged on, or one a single broker acknowledges for (unless
    allowed); returns a warning to log when its `min.insync.replicas` differs from `wanted`, or the
    broker did not describe it."""
    topic, replicas, in_sync = found.topic, found.replication_factor, found.min_insync_replicas
    if in_sync is not None and in_sync > replicas:
        raise TopicConfigError(
            f"topic {topic} has replication factor {replicas} and min.insync.replicas {in_sync}: the broker refuses "
            f"every acks=all write to it. Lower min.insync.replicas to at most {replicas} (kafka-configs.sh --alter "
            f"--entity-type topics --entity-name {topic} --add-config {MIN_INSYNC_REPLICAS}={min(wanted, replicas)})"
        )
    acknowledgers = found.acknowledgers
    if acknowledgers is not None and acknowledgers < SURVIVES_ONE_LOSS and not allow_single_broker_acks:
        fix = (
            f"raise min.insync.replicas (kafka-configs.sh --alter --entity-type topics --entity-name {topic} "
            f"--add-config {MIN_INSYNC_REPLICAS}={max(wanted, SURVIVES_ONE_LOSS)})"
            if replicas >= SURVIVES_ONE_LOSS
            else "copy the log into topics with more replicas (docs/operations.md)"
        )
        raise SingleBrokerAcksError(
            f"topic {topic} has replication factor {replicas} and min.insync.replicas "
            f"{in_sync if in_sync is not None else 'not described'}: a single broker may acknowledge a write, and "
            f"losing it loses acknowledged writes. {fix[0].upper()}{fix[1:]}, or {ACCEPT}"
        )
    if in_sync is None:
        return (
            f"topic {topic}: the broker did not describe min.insync.replicas; check that it is at least "
            f"{SURVIVES_ONE_LOSS} (wanted {wanted})"
        )
    if in_sync != wanted:
        return f"topic {topic} has min.insync.replicas {in_sync}, the settings ask for {wanted}; left as it is"
    return None
