"""graphledger: event-sourced persistence for LangGraph — checkpoints and store through Kafka into Postgres."""

from graphledger.client.saver import KafkaSaver
from graphledger.client.store import KafkaStore
from graphledger.settings import Settings

__all__ = ["KafkaSaver", "KafkaStore", "Settings"]
