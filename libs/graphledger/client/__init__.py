"""The client an agent pod installs: `KafkaSaver` and `KafkaStore`."""

from graphledger.client.saver import KafkaSaver
from graphledger.client.store import KafkaStore

__all__ = ["KafkaSaver", "KafkaStore"]
