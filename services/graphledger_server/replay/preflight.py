"""Before a replay: does the log still hold every event the projections were built from?

A replay rebuilds from the earliest offsets. A source topic whose records can expire (finite
`retention.ms` or `retention.bytes`, or compaction), or whose earliest offset is already above 0,
no longer holds its whole history: the rebuilt schema would silently lack what was lost. The replay
refuses unless the operator accepts that loss.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiokafka import TopicPartition

from graphledger.errors import GraphledgerError, LossRefusedError
from graphledger.settings import Settings
from graphledger_server.log.clients import new_admin, new_consumer
from graphledger_server.log.topics import INFINITE, retention_configs, source_topics

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SourceTopic:
    """What a replay needs to know about one source-of-truth topic."""

    name: str
    configs: dict[str, str] | None
    """retention.ms, retention.bytes, cleanup.policy as the broker describes them; None: not described."""
    earliest: dict[int, int]
    """Earliest offset still held, per partition."""

    def losses(self) -> list[str]:
        """Why this topic may not hold its whole history (empty: it does, as far as the broker says)."""
        found = []
        configs = self.configs or {}
        for name in ("retention.ms", "retention.bytes"):
            value = configs.get(name)
            if value is not None and value != INFINITE:
                found.append(f"topic {self.name} has {name}={value} (events older than that are deleted)")
        if "compact" in configs.get("cleanup.policy", ""):
            found.append(f"topic {self.name} has cleanup.policy={configs['cleanup.policy']} (compaction drops events)")
        for partition, offset in sorted(self.earliest.items()):
            if offset > 0:
                found.append(
                    f"partition {self.name}:{partition} starts at offset {offset}: offsets 0..{offset - 1} are gone"
                )
        return found


def refuse_losses(topics: list[SourceTopic], *, accept_loss: bool) -> list[str]:
    """The losses found; raises `LossRefusedError` naming them unless `accept_loss`."""
    found = [loss for topic in topics for loss in topic.losses()]
    for topic in topics:
        if topic.configs is None:
            log.warning("the broker does not describe %s's configs; its retention cannot be checked", topic.name)
    if found and not accept_loss:
        raise LossRefusedError(
            "refusing to replay: the log no longer holds every event, so the rebuilt schema would miss some: "
            + "; ".join(found)
            + ". Set infinite retention on the source topics, or pass --accept-loss to rebuild from what is left."
        )
    for loss in found:
        log.warning("accepted loss: %s", loss)
    return found


async def inspect_sources(settings: Settings) -> list[SourceTopic]:
    """Configs and earliest offsets of the checkpoint and store topics, as the broker reports them."""
    names = source_topics(settings)
    admin = new_admin(settings)
    await admin.start()
    try:
        configs = {name: await retention_configs(admin, name) for name in names}
    finally:
        await admin.close()
    consumer = new_consumer(settings)
    await consumer.start()
    try:
        await consumer.topics()  # fetches metadata, so partitions_for_topic knows every topic
        partitions = [
            TopicPartition(name, p) for name in names for p in sorted(consumer.partitions_for_topic(name) or ())
        ]
        missing = [name for name in names if not any(tp.topic == name for tp in partitions)]
        if missing:
            raise GraphledgerError(f"source topics {missing} do not exist; run `graphledger topics ensure`")
        earliest = await consumer.beginning_offsets(partitions)
    finally:
        await consumer.stop()
    return [
        SourceTopic(name, configs[name], {tp.partition: off for tp, off in earliest.items() if tp.topic == name})
        for name in names
    ]
