"""A sealed envelope on the wire: it encodes and decodes like any other, and its records name the
subject in the `gl-subject` header so a reader fetches keys before it decodes. v1 records decoding as
events is `test_event_versions.py`."""

from __future__ import annotations

import dataclasses

import pytest

from graphledger.erasure.sealing import SealedSubject, cipher_of, new_data_key, seal, sealed_ref, unseal
from graphledger.events import envelope, to_envelope
from graphledger.events.checkpoint import ThreadDelete
from v1_events import EVENTS, fixture

SUBJECT = SealedSubject("0a" * 16, "thread", "acme", "acme/t")


def test_a_sealed_envelope_decodes_to_itself_and_still_opens() -> None:
    key = cipher_of(new_data_key())
    clear = to_envelope(ThreadDelete("acme/t"))
    sealed = seal(clear, SUBJECT, key)
    decoded = envelope.decode(envelope.encode(sealed))
    # Written as version 3 (no intent: what a version 3 projector reads), read as the current version.
    assert (sealed.version, decoded.written_version) == (envelope.PLAIN_VERSION, envelope.PLAIN_VERSION)
    assert decoded == dataclasses.replace(sealed, version=envelope.SCHEMA_VERSION)
    assert unseal(decoded, key) == (dataclasses.replace(clear, version=envelope.SCHEMA_VERSION), SUBJECT)


def test_a_sealed_envelopes_headers_name_its_subject_after_type_and_version() -> None:
    sealed = seal(to_envelope(ThreadDelete("acme/t")), SUBJECT, cipher_of(new_data_key()))
    headers = envelope.headers_for(sealed, "00-trace-span-01")
    assert headers == [
        (envelope.HEADER_TYPE, b"thread.delete"),
        (envelope.HEADER_VERSION, str(envelope.PLAIN_VERSION).encode()),
        (envelope.HEADER_SUBJECT, SUBJECT.ref.encode()),
        (envelope.HEADER_TRACEPARENT, b"00-trace-span-01"),
    ]
    assert envelope.header(headers, envelope.HEADER_SUBJECT) == SUBJECT.ref.encode()


def test_a_clear_envelopes_headers_name_no_subject() -> None:
    headers = envelope.headers_for(to_envelope(ThreadDelete("acme/t")))
    assert envelope.header(headers, envelope.HEADER_SUBJECT) is None


@pytest.mark.parametrize("name", sorted(EVENTS))
def test_a_v1_record_is_upcast_to_a_clear_payload(name: str) -> None:
    decoded = envelope.decode(fixture(name))
    assert sealed_ref(decoded) is None
    assert envelope.header(envelope.headers_for(decoded), envelope.HEADER_SUBJECT) is None


def test_sealing_and_opening_keep_every_field_of_the_envelope_but_its_payload() -> None:
    """`envelope.with_payload` builds the envelope directly: a field it forgot would be lost on every seal."""
    fields = {f.name: f for f in dataclasses.fields(envelope.Envelope)}
    full = envelope.Envelope("thread.delete", "e1", 5, {"a": 1}, 2, 7, 1, b"intent", True)
    assert all(getattr(full, name) != f.default for name, f in fields.items() if f.default is not dataclasses.MISSING)
    assert envelope.with_payload(full, {"b": 2}) == dataclasses.replace(full, payload={"b": 2})
