"""Events: the envelope, the checkpoint-topic payloads, chunking of large events, topic management."""

from __future__ import annotations

from graphledger.errors import InvalidEventError
from graphledger.events.checkpoint import CHECKPOINT_EVENT_TYPES, CheckpointEvent
from graphledger.events.envelope import Envelope, new_envelope


def to_envelope(event: CheckpointEvent) -> Envelope:
    return new_envelope(event.TYPE, event.to_payload())


def checkpoint_event(envelope: Envelope) -> CheckpointEvent:
    """The typed checkpoint event inside an envelope; `InvalidEventError` names what is wrong."""
    cls = CHECKPOINT_EVENT_TYPES.get(envelope.type)
    if cls is None:
        raise InvalidEventError(f"unknown checkpoint event type {envelope.type!r}")
    return cls.from_payload(envelope.payload)
