"""The key-encryption keys (`GRAPHLEDGER_KEY_ENCRYPTION_KEYS`) and the wrapping of data keys with them.

A wrapped key is AES-256-GCM of the key under one key-encryption key, with the key's owner (a subject
reference or a tenant) as associated data, so a wrapped key copied to another row does not open. The
first key of the ring wraps; every key unwraps, by the id stored beside the wrapped key, so keys rotate
without downtime: put a new key first, `graphledger keys rotate` rewraps every row, drop the old one.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from graphledger.errors import GraphledgerError
from graphledger.settings import Settings

KEY_BYTES = 32
NONCE_BYTES = 12


class KeyRingError(GraphledgerError):
    """The key-encryption keys are missing or malformed, or a wrapped key does not open with them."""


@dataclass(frozen=True)
class Wrapped:
    kek_id: str
    data: bytes
    """The nonce, then the ciphertext."""


class KeyRing:
    def __init__(self, keys: list[tuple[str, bytes]]) -> None:
        if not keys:
            raise KeyRingError("no key-encryption key: set GRAPHLEDGER_KEY_ENCRYPTION_KEYS")
        self._keys = {kek_id: AESGCM(key) for kek_id, key in keys}
        self.active = keys[0][0]

    @classmethod
    def from_settings(cls, settings: Settings) -> KeyRing:
        raw = settings.key_encryption_keys.get_secret_value() if settings.key_encryption_keys else ""
        return cls(parse_keys(raw))

    def wrap(self, key: bytes, owner: str) -> Wrapped:
        nonce = os.urandom(NONCE_BYTES)
        return Wrapped(self.active, nonce + self._keys[self.active].encrypt(nonce, key, owner.encode()))

    def unwrap(self, wrapped: Wrapped, owner: str) -> bytes:
        cipher = self._keys.get(wrapped.kek_id)
        if cipher is None:
            raise KeyRingError(f"a key of {owner} is wrapped by key-encryption key {wrapped.kek_id!r}, not in the ring")
        try:
            return cipher.decrypt(wrapped.data[:NONCE_BYTES], wrapped.data[NONCE_BYTES:], owner.encode())
        except InvalidTag:
            raise KeyRingError(f"the wrapped key of {owner} does not open with {wrapped.kek_id!r}") from None


def parse_keys(raw: str) -> list[tuple[str, bytes]]:
    """`id:base64,...` as `[(id, key)]`; raises `KeyRingError` naming the entry that is wrong."""
    keys: list[tuple[str, bytes]] = []
    for position, entry in enumerate(filter(None, (part.strip() for part in raw.split(","))), 1):
        kek_id, separator, encoded = entry.partition(":")
        try:
            key = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if not kek_id or len(key) != KEY_BYTES:
            # An entry without `id:` may be a bare key: it is named by its position, never by its text.
            name = repr(kek_id) if kek_id and separator else f"#{position}"
            raise KeyRingError(f"key-encryption key {name} is not `id:` and {KEY_BYTES} bytes in base64")
        if any(kek_id == seen for seen, _ in keys):
            raise KeyRingError(f"key-encryption key id {kek_id!r} is given twice")
        keys.append((kek_id, key))
    return keys


def new_key_entry(kek_id: str) -> str:
    """A fresh `id:base64` entry for `GRAPHLEDGER_KEY_ENCRYPTION_KEYS`."""
    return f"{kek_id}:{base64.b64encode(os.urandom(KEY_BYTES)).decode()}"
