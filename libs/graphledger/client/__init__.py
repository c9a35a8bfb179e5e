"""The client an agent pod installs: `KafkaSaver` (and later `KafkaStore`)."""

from graphledger.client.saver import KafkaSaver

__all__ = ["KafkaSaver"]
