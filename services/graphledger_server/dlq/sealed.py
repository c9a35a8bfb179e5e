"""A sealed dead letter's payload, opened with its subject's data key from the key store.

`dlq show --payload` prints the opened payload, the form an operator can edit, and `dlq replay
--payload-file` seals the edited payload again under the same subject and key: the log never holds
the content in the clear, and the round trip needs nothing but the key store the services use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphledger.erasure.sealing import Cipher, Erased, Misbound, SealedSubject, sealed_key_id, sealed_ref, unseal
from graphledger.errors import DeadLetterError, GraphledgerError
from graphledger.events import envelope
from graphledger_server.keys.lookup import DataKeyCache, KeyName


@dataclass(frozen=True, slots=True)
class Opened:
    """A sealed dead letter's envelope with its payload in the clear, and what sealed it."""

    envelope: envelope.Envelope
    subject: SealedSubject
    key: Cipher
    key_id: str | None
    """The fresh key the record names, None when it was sealed with its subject's own key."""


def sealed_envelope(value: bytes | None) -> tuple[envelope.Envelope, KeyName] | None:
    """A sealed record value's envelope and the key it names; None for one in the clear or not an
    envelope at all (`dlq show` prints those as they are)."""
    try:
        sealed = envelope.decode(value or b"")
        ref, key_id = sealed_ref(sealed), sealed_key_id(sealed)
    except GraphledgerError:
        return None
    return None if ref is None else (sealed, (ref, key_id))


async def open_sealed(value: bytes | None, keys: DataKeyCache) -> Opened | None:
    """The opened envelope of a sealed record value, None for one in the clear; `DeadLetterError` when
    it is sealed but does not open."""
    if (found := sealed_envelope(value)) is None:
        return None
    sealed, (ref, key_id) = found
    await keys.load([(ref, key_id)])
    key = keys.get(ref, key_id)
    if key is None or isinstance(key, Erased | Misbound):
        raise DeadLetterError(f"the dead letter's subject {ref} has no key (erased, or another key store)")
    try:
        opened, subject = unseal(sealed, key)
    except GraphledgerError as exc:
        raise DeadLetterError(f"the dead letter's sealed payload does not open: {exc}") from None
    return Opened(opened, subject, key, key_id)


def describe_subject(opened: Opened) -> dict[str, Any]:
    """What `dlq show` says of a sealed dead letter's subject (its name as stored: tenant prefix included)."""
    subject = opened.subject
    return {
        "kind": subject.kind,
        "ref": subject.ref,
        "tenant": subject.tenant,
        "name": subject.name,
        "key_id": opened.key_id,
    }
