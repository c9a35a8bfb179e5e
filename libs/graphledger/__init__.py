"""graphledger: event-sourced persistence for LangGraph — checkpoints through Kafka into Postgres."""

from graphledger.client.saver import KafkaSaver
from graphledger.settings import Settings

__all__ = ["KafkaSaver", "Settings"]
