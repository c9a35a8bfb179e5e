"""Event schema evolution, pure: v1 records decode forever, upcasters lift old versions before validation,
and a record no upcaster reaches stops its partition rather than being dead-lettered.

Applying the v1 records and a projector meeting a newer version are `integration/test_event_schema.py`.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest

from graphledger.errors import UnknownEventVersionError
from graphledger.events import checkpoint_event, envelope, store_event
from graphledger.events.checkpoint import CHECKPOINT_EVENT_TYPES, ThreadCopy, ThreadPrune
from graphledger.events.envelope import Envelope
from graphledger.events.erasure import NamespaceErase, TenantErase, ThreadErase
from graphledger.events.store import STORE_EVENT_TYPES
from graphledger.log.records import LogRecord
from graphledger.opening.checkpoint_events import TimedCheckpointEvent
from graphledger.opening.records import DeadLetter, Decoded, TooNew, classify
from graphledger_server.projection.checkpoints import CheckpointProjection
from v1_events import CHECKPOINT_TOPIC, EVENT_ID, EVENTS, FIXTURES, PRODUCED_MS, fixture

SCHEMA = "v1"


SINCE_V2 = {ThreadErase.TYPE, NamespaceErase.TYPE, TenantErase.TYPE}
"""The event types version 2 added: no version-1 record of them exists."""


def test_every_event_type_of_v1_has_a_v1_fixture() -> None:
    kept = {path.stem for path in FIXTURES.glob("*.msgpack")}
    assert kept == set(EVENTS)
    every = set(CHECKPOINT_EVENT_TYPES) | set(STORE_EVENT_TYPES)
    assert SINCE_V2 <= every
    assert {e.TYPE for e in EVENTS.values()} == every - SINCE_V2


@pytest.mark.parametrize("name", sorted(EVENTS))
def test_a_v1_record_decodes_to_its_event(name: str) -> None:
    env = envelope.decode(fixture(name))
    assert (env.version, env.produced_ms) == (envelope.SCHEMA_VERSION, PRODUCED_MS)
    typed = store_event(env) if env.type.startswith("store.") else checkpoint_event(env)
    expected = EVENTS[name]
    if isinstance(expected, ThreadCopy):  # written before version 3: it lands at its record, as it did then
        expected = dataclasses.replace(expected, at_record=True)
    assert typed == expected


@pytest.mark.parametrize("name", sorted(EVENTS))
def test_an_event_encodes_as_its_v1_record_did(name: str) -> None:
    """The payload a v1 event encodes to today is, byte for byte, the one graphledger 1 wrote."""
    event = EVENTS[name]
    assert envelope.encode(Envelope(event.TYPE, EVENT_ID, PRODUCED_MS, event.to_payload(), version=1)) == fixture(name)


# -- upcasters ---------------------------------------------------------------------------------------


def _keep_last_record(version: int) -> LogRecord:
    """A prune as a fictional older graphledger spelled it: strategy "keep_last"."""
    payload = {"thread_id": "t", "strategy": "keep_last"}
    env = Envelope(ThreadPrune.TYPE, str(uuid.uuid4()), PRODUCED_MS, payload, version)
    return LogRecord(CHECKPOINT_TOPIC, 0, 0, b"t", envelope.encode(env), (), PRODUCED_MS)


def _rename_keep_last(event_type: str, payload: dict[str, Any]) -> dict[str, Any]:
    if event_type == ThreadPrune.TYPE and payload.get("strategy") == "keep_last":
        return {**payload, "strategy": "keep_latest"}
    return payload


def test_an_upcaster_lifts_an_old_version_before_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    to_event = CheckpointProjection(SCHEMA).to_event
    current = envelope.SCHEMA_VERSION
    # Without a version bump the old spelling is simply invalid: a dead letter.
    assert isinstance(classify(_keep_last_record(current), to_event), DeadLetter)

    # This code as the next version, whose upcaster from the current one renames the strategy.
    monkeypatch.setattr(envelope, "SCHEMA_VERSION", current + 1)
    monkeypatch.setitem(envelope.UPCASTERS, current, _rename_keep_last)
    decoded = classify(_keep_last_record(current), to_event)
    assert isinstance(decoded, Decoded)
    assert decoded.event == TimedCheckpointEvent(ThreadPrune("t", "keep_latest"), PRODUCED_MS)
    assert envelope.decode(_keep_last_record(current).value).version == current + 1
    # The v1 fixtures go through the whole chain of upcasters and still mean what they meant.
    assert checkpoint_event(envelope.decode(fixture("thread.prune"))) == EVENTS["thread.prune"]
    # Records of the new version are not upcast; the one after it is from the future.
    assert isinstance(classify(_keep_last_record(current + 1), to_event), DeadLetter)
    assert isinstance(classify(_keep_last_record(current + 2), to_event), TooNew)


def test_a_missing_upcaster_stops_rather_than_dead_letters(monkeypatch: pytest.MonkeyPatch) -> None:
    current = envelope.SCHEMA_VERSION
    monkeypatch.setattr(envelope, "SCHEMA_VERSION", current + 2)
    monkeypatch.setitem(envelope.UPCASTERS, current, _rename_keep_last)
    with pytest.raises(
        UnknownEventVersionError, match=f"no upcaster from event version {current + 1} to {current + 2}"
    ):
        envelope.decode(fixture("thread.delete"))
    assert isinstance(classify(_keep_last_record(current), CheckpointProjection(SCHEMA).to_event), TooNew)


# -- version 3: a copy lands at its barrier -------------------------------------------------------------


def test_a_copy_written_before_version_3_lands_at_its_record_clear_or_sealed() -> None:
    """Its upcaster says so in a clear payload (a copy of the record keeps it); a sealed payload, opened
    after the upcast, is told by the version its producer wrote."""
    copy = ThreadCopy("s", "t")
    clear = envelope.decode(envelope.encode(Envelope(copy.TYPE, EVENT_ID, PRODUCED_MS, copy.to_payload(), version=2)))
    assert clear.payload["at_record"] is True and clear.written_version == 2
    assert checkpoint_event(clear) == ThreadCopy("s", "t", at_record=True)
    opened = dataclasses.replace(clear, payload=copy.to_payload())  # as `unseal` leaves a sealed one
    assert checkpoint_event(opened) == ThreadCopy("s", "t", at_record=True)
    today = envelope.decode(envelope.encode(Envelope(copy.TYPE, EVENT_ID, PRODUCED_MS, copy.to_payload())))
    assert "at_record" not in today.payload and checkpoint_event(today) == copy
