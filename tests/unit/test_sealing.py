"""Sealing an envelope's payload with its subject's data key (`graphledger.erasure.sealing`), pure: what opens,
what does not, and the clear errors of a sealed payload that is not one."""

from __future__ import annotations

import dataclasses
import re
import uuid
from typing import Any

import ormsgpack
import pytest

from graphledger.erasure.sealing import NONCE_BYTES, SealedSubject, cipher_of, new_data_key, seal, sealed_ref, unseal
from graphledger.errors import InvalidEventError
from graphledger.events import to_envelope
from graphledger.events.checkpoint import Blob, CheckpointPut
from graphledger.events.envelope import SEALED_PAYLOAD, Envelope, encode

SENTINEL = "sentinel-4f1c-pii"
THREAD = "acme/alice@example.com"
SUBJECT = SealedSubject("0a" * 16, "thread", "acme", THREAD)


def _put() -> Envelope:
    checkpoint = f'{{"channel_values": {{"note": "{SENTINEL} in state"}}}}'.encode()
    metadata = f'{{"user": "{SENTINEL} in metadata"}}'.encode()
    blob = Blob("messages", "1", "msgpack", f"{SENTINEL} in a blob".encode())
    return to_envelope(CheckpointPut(THREAD, "", "cp-1", None, checkpoint, metadata, (blob,)))


def _sealed_fields(env: Envelope) -> dict[str, Any]:
    return env.payload[SEALED_PAYLOAD]


def _with_sealed(env: Envelope, **fields: Any) -> Envelope:
    return dataclasses.replace(env, payload={SEALED_PAYLOAD: {**_sealed_fields(env), **fields}})


def test_a_sealed_payload_opens_to_the_payload_and_subject_it_was_sealed_with() -> None:
    key = cipher_of(new_data_key())
    clear = _put()
    sealed = seal(clear, SUBJECT, key)
    assert (sealed.type, sealed.event_id, sealed.produced_ms) == (clear.type, clear.event_id, clear.produced_ms)
    assert sealed_ref(sealed) == SUBJECT.ref
    assert unseal(sealed, key) == (clear, SUBJECT)


def test_a_sealed_record_holds_none_of_the_payloads_strings_nor_the_subjects_name() -> None:
    record = encode(seal(_put(), SUBJECT, cipher_of(new_data_key())))
    for secret in (SENTINEL, "alice@example.com", "acme", "channel_values", "messages"):
        assert secret.encode() not in record, secret
    assert SUBJECT.ref.encode() in record  # what a reader needs to find the key, and nothing else


def test_two_seals_of_one_event_use_different_nonces_and_ciphertexts() -> None:
    key, clear = cipher_of(new_data_key()), _put()
    first, second = (_sealed_fields(seal(clear, SUBJECT, key)) for _ in range(2))
    assert len(first["nonce"]) == len(second["nonce"]) == NONCE_BYTES
    assert first["nonce"] != second["nonce"]
    assert first["ct"] != second["ct"]


def test_a_sealed_payload_does_not_open_with_another_key() -> None:
    sealed = seal(_put(), SUBJECT, cipher_of(new_data_key()))
    with pytest.raises(InvalidEventError, match=f"subject {SUBJECT.ref} does not open with its key"):
        unseal(sealed, cipher_of(new_data_key()))


def test_a_sealed_payload_moved_to_another_event_or_subject_does_not_open() -> None:
    key = cipher_of(new_data_key())
    sealed = seal(_put(), SUBJECT, key)
    other_ref = "0b" * 16
    moved = (
        dataclasses.replace(sealed, event_id=str(uuid.uuid4())),
        _with_sealed(sealed, ref=other_ref),
    )
    for env in moved:
        with pytest.raises(InvalidEventError, match="does not open with its key"):
            unseal(env, key)


def test_a_tampered_ciphertext_does_not_open() -> None:
    key = cipher_of(new_data_key())
    sealed = seal(_put(), SUBJECT, key)
    ct = bytearray(_sealed_fields(sealed)["ct"])
    ct[0] ^= 1
    with pytest.raises(InvalidEventError, match="does not open with its key"):
        unseal(_with_sealed(sealed, ct=bytes(ct)), key)


def test_a_clear_payload_has_no_subject_reference() -> None:
    assert sealed_ref(_put()) is None


@pytest.mark.parametrize(
    "sealed_value",
    [["not", "a", "map"], {"nonce": b"n" * NONCE_BYTES, "ct": b"c"}, {"ref": "", "ct": b"c"}, {"ref": 7}],
    ids=["a list", "no ref", "an empty ref", "a ref not a string"],
)
def test_a_sealed_payload_without_a_reference_is_refused_as_such(sealed_value: Any) -> None:
    env = dataclasses.replace(_put(), payload={SEALED_PAYLOAD: sealed_value})
    with pytest.raises(InvalidEventError, match="sealed payload without a subject reference"):
        sealed_ref(env)


@pytest.mark.parametrize(
    "fields",
    [{"nonce": None}, {"nonce": b"short"}, {"nonce": "a" * NONCE_BYTES}, {"ct": None}, {"ct": "text"}],
    ids=["no nonce", "a short nonce", "a nonce not bytes", "no ciphertext", "a ciphertext not bytes"],
)
def test_a_sealed_payload_without_nonce_or_ciphertext_is_refused_as_such(fields: dict[str, Any]) -> None:
    key = cipher_of(new_data_key())
    env = _with_sealed(seal(_put(), SUBJECT, key), **fields)
    with pytest.raises(InvalidEventError, match="without a 12-byte nonce and a ciphertext"):
        unseal(env, key)


def _sealed_plaintext(plain: bytes) -> tuple[Envelope, Any]:
    """A sealed envelope whose (authentic) plaintext is `plain`: what a broken writer holding the key makes."""
    key = cipher_of(new_data_key())
    env = seal(_put(), SUBJECT, key)
    nonce = b"\x01" * NONCE_BYTES
    ct = key.encrypt(nonce, plain, env.event_id.encode() + b"\x00" + SUBJECT.ref.encode())
    return _with_sealed(env, nonce=nonce, ct=ct), key


@pytest.mark.parametrize(
    "opened",
    [
        ["payload", "subject", "tenant"],
        {"payload": {"thread_id": THREAD}, "subject": THREAD},
        {"payload": b"bytes", "subject": THREAD, "tenant": "acme"},
        {"payload": {"thread_id": THREAD}, "subject": 1, "tenant": "acme"},
    ],
    ids=["a list", "no tenant", "a payload not a map", "a subject not a string"],
)
def test_a_sealed_payload_that_opens_to_no_payload_subject_and_tenant_is_refused_as_such(opened: Any) -> None:
    env, key = _sealed_plaintext(ormsgpack.packb(opened))
    with pytest.raises(InvalidEventError, match=re.escape("is not a map of payload, subject and tenant")):
        unseal(env, key)


def test_a_sealed_payload_that_opens_to_no_msgpack_is_refused_as_such() -> None:
    env, key = _sealed_plaintext(b"\xc1 not msgpack")
    with pytest.raises(InvalidEventError, match=f"sealed payload of subject {SUBJECT.ref} is not msgpack"):
        unseal(env, key)
