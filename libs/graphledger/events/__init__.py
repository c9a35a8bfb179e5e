"""Events: the envelope, the checkpoint- and store-topic payloads, chunking (pure: no I/O)."""

from __future__ import annotations

import dataclasses

from graphledger.errors import InvalidEventError
from graphledger.events.checkpoint import CHECKPOINT_EVENT_TYPES, CheckpointEvent, ThreadCopy, ThreadPrune
from graphledger.events.envelope import STAGED_COPIES_VERSION, Envelope, new_envelope
from graphledger.events.store import STORE_EVENT_TYPES, StoreEvent

Event = CheckpointEvent | StoreEvent
"""Any event a client publishes: each has `TYPE`, `key` (its Kafka key) and `to_payload()`."""


def to_envelope(event: Event) -> Envelope:
    """The event's envelope; a protected write's intent goes in its `gl-intent` header too, and whether a
    prune is a thread operation in its `gl-operation` header."""
    operation = event.strategy == "delete" if isinstance(event, ThreadPrune) else None
    return new_envelope(event.TYPE, event.to_payload(), getattr(event, "intent", None), operation)


def checkpoint_event(envelope: Envelope) -> CheckpointEvent:
    """The typed checkpoint event inside an envelope; `InvalidEventError` names what is wrong."""
    cls = CHECKPOINT_EVENT_TYPES.get(envelope.type)
    if cls is None:
        raise InvalidEventError(f"unknown checkpoint event type {envelope.type!r}")
    event = cls.from_payload(envelope.payload)
    if isinstance(event, ThreadCopy) and envelope.written_version < STAGED_COPIES_VERSION:
        return dataclasses.replace(event, at_record=True)  # a sealed one: its payload could not say so
    return event


def store_event(envelope: Envelope) -> StoreEvent:
    """The typed store event inside an envelope; `InvalidEventError` names what is wrong."""
    cls = STORE_EVENT_TYPES.get(envelope.type)
    if cls is None:
        raise InvalidEventError(f"unknown store event type {envelope.type!r}")
    return cls.from_payload(envelope.payload)
