"""Sealing an event's payload with its subject's data key (AES-256-GCM), and opening it again.

A sealed envelope keeps its type, id and time in the clear (a consumer routes on them) and replaces
its payload by `{"sealed": {"ref", "kind", "nonce", "ct"}}`: the subject's reference
(`subjects.py`), its kind, a random 96-bit nonce and the ciphertext of the msgpack map
`{"payload", "subject", "tenant"}` (the payload, and the subject's name and tenant, which the projector
needs to find the subject's rows when it is erased). The event id and the reference are the associated data, so a
sealed payload cannot be moved to another event or subject unnoticed. The reference also travels in
the `gl-subject` header, so the projector can fetch the keys a batch needs before it decodes anything.

Without the key (destroyed by an erasure) nothing of the payload can be read, which is the erasure:
the log keeps ciphertext only (docs/security.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ormsgpack
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from graphledger.errors import InvalidEventError
from graphledger.events.envelope import SEALED_PAYLOAD as SEALED
from graphledger.events.envelope import Envelope, with_payload
from graphledger.quick_init import quick_init

KEY_BYTES = 32
NONCE_BYTES = 12


class Erased:
    """The data key of an erased subject: gone for good."""

    def __repr__(self) -> str:
        return "ERASED"


ERASED = Erased()


class Misbound:
    """A fresh key (`erasure/fresh_keys.py`) a record names for a subject it is not bound to: nothing opens with it."""

    def __repr__(self) -> str:
        return "MISBOUND"


MISBOUND = Misbound()


class Unclaimed(Erased):
    """A fresh key destroyed (its tenant erased) before any record opened with it: bound to no subject, it
    opens nothing, and a record naming it proves no subject's, so it is skipped as erased and erases nothing."""

    def __repr__(self) -> str:
        return "UNCLAIMED"


UNCLAIMED = Unclaimed()
Cipher = AESGCM
"""A data key ready to use (building one costs more than sealing a small event)."""
DataKey = Cipher | Erased
KeyLookup = Callable[[str, str | None], DataKey | Misbound | None]
"""The data key a sealed record opens with, by its subject's reference and the fresh key it names
(None: the subject's own): the key, `ERASED`, `MISBOUND`, or None when none is known."""


def new_data_key() -> bytes:
    return AESGCM.generate_key(bit_length=8 * KEY_BYTES)


def cipher_of(data_key: bytes) -> Cipher:
    return AESGCM(data_key)


@quick_init
@dataclass(frozen=True, slots=True)
class SealedSubject:
    """Whose data a sealed event carries: reference, kind, tenant and name (as `subjects.Subject`)."""

    ref: str
    kind: str
    tenant: str
    name: str


def seal(envelope: Envelope, subject: SealedSubject, data_key: Cipher, key_id: str | None = None) -> Envelope:
    """`envelope` with its payload sealed under `data_key`, the subject's: its own (`key_id` None), or a
    fresh key the writer bound to it (`erasure/fresh_keys.py`), named by `key_id`."""
    ref, kind = subject.ref, subject.kind
    nonce = os.urandom(NONCE_BYTES)
    plain = ormsgpack.packb({"payload": envelope.payload, "subject": subject.name, "tenant": subject.tenant})
    sealed = data_key.encrypt(nonce, plain, _associated(envelope.event_id, ref, key_id))
    fields: dict[str, Any] = {"ref": ref, "kind": kind, "nonce": nonce, "ct": sealed}
    if key_id is not None:
        fields["kid"] = key_id
    return with_payload(envelope, {SEALED: fields})


def sealed_ref(envelope: Envelope) -> str | None:
    """The subject reference of a sealed envelope, or None for a payload in the clear."""
    sealed = envelope.payload.get(SEALED)
    if sealed is None:
        return None
    if not isinstance(sealed, dict) or not isinstance(ref := sealed.get("ref"), str) or not ref:
        raise InvalidEventError("sealed payload without a subject reference")
    return ref


def sealed_kind(envelope: Envelope) -> str | None:
    """The subject kind a sealed envelope names (`SealedSubject.kind`), None when it names none."""
    sealed = envelope.payload.get(SEALED)
    kind = sealed.get("kind") if isinstance(sealed, dict) else None
    return kind if isinstance(kind, str) else None


def sealed_key_id(envelope: Envelope) -> str | None:
    """The fresh key a sealed envelope names (`erasure/fresh_keys.py`), or None: sealed with its subject's own."""
    sealed = envelope.payload.get(SEALED)
    key_id = sealed.get("kid") if isinstance(sealed, dict) else None
    if key_id is not None and (not isinstance(key_id, str) or not key_id):
        raise InvalidEventError("sealed payload with a key id that is not a string")
    return key_id


def unseal(envelope: Envelope, data_key: Cipher) -> tuple[Envelope, SealedSubject]:
    """The envelope with its payload opened, and its subject; `InvalidEventError` naming what is wrong
    when it does not open with `data_key` or opens to no payload."""
    ref = sealed_ref(envelope)
    assert ref is not None, "unseal of a payload in the clear"
    sealed: dict[str, Any] = envelope.payload[SEALED]
    nonce, ciphertext = sealed.get("nonce"), sealed.get("ct")
    if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES or not isinstance(ciphertext, bytes):
        raise InvalidEventError("sealed payload without a 12-byte nonce and a ciphertext")
    try:
        plain = data_key.decrypt(nonce, ciphertext, _associated(envelope.event_id, ref, sealed_key_id(envelope)))
    except InvalidTag:
        key_id = sealed_key_id(envelope)
        key = "its key" if key_id is None else f"fresh key {key_id}"
        raise InvalidEventError(f"sealed payload of subject {ref} does not open with {key}") from None
    try:
        opened = ormsgpack.unpackb(plain)
    except ormsgpack.MsgpackDecodeError:  # authentic, so written by a broken sealer
        raise InvalidEventError(f"sealed payload of subject {ref} is not msgpack") from None
    if not isinstance(opened, dict):
        opened = {}
    payload, name, tenant = opened.get("payload"), opened.get("subject"), opened.get("tenant")
    if not isinstance(payload, dict) or not isinstance(name, str) or not isinstance(tenant, str):
        raise InvalidEventError(f"sealed payload of {envelope.type} is not a map of payload, subject and tenant")
    kind = sealed.get("kind")
    subject = SealedSubject(ref, kind if isinstance(kind, str) else "", tenant, name)
    return with_payload(envelope, payload), subject


def _associated(event_id: str, ref: str, key_id: str | None) -> bytes:
    """Binds the ciphertext to its event, its subject and the key it names."""
    bound = event_id.encode() + b"\x00" + ref.encode()
    return bound if key_id is None else bound + b"\x00" + key_id.encode()
