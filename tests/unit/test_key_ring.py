"""The key-encryption keys and the wrapping of data keys with them (`graphledger_server.keys.ring`),
pure: parsing the setting without ever echoing a key, wrapping bound to the key's owner, rotation."""

from __future__ import annotations

import base64
import os

import pytest
from pydantic import SecretStr

from graphledger.settings import Settings
from graphledger_server.keys.ring import (
    KEY_BYTES,
    NONCE_BYTES,
    KeyRing,
    KeyRingError,
    Wrapped,
    new_key_entry,
    parse_keys,
)

KEY_A, KEY_B = os.urandom(KEY_BYTES), os.urandom(KEY_BYTES)
B64_A, B64_B = base64.b64encode(KEY_A).decode(), base64.b64encode(KEY_B).decode()
OWNER = "0a" * 16


def test_the_setting_is_a_list_of_id_and_base64_key_entries_first_one_active() -> None:
    keys = parse_keys(f" new:{B64_A} ,, old:{B64_B},")
    assert keys == [("new", KEY_A), ("old", KEY_B)]
    assert KeyRing(keys).active == "new"
    assert parse_keys("") == []


def test_a_fresh_entry_parses_to_a_new_random_key() -> None:
    first, second = new_key_entry("k1"), new_key_entry("k1")
    [(kek_id, key)] = parse_keys(first)
    assert (kek_id, len(key)) == ("k1", KEY_BYTES)
    assert parse_keys(second)[0][1] != key


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        (f"a:{base64.b64encode(KEY_A[:16]).decode()}", "'a'"),
        (f"a:{B64_A[:-4]}", "'a'"),
        (f"a:{B64_A}!", "'a'"),
        ("a:", "'a'"),
        (f":{B64_A}", "#1"),
        (B64_A, "#1"),
        (f"a:{B64_B},{B64_A}", "#2"),
    ],
    ids=["16 bytes", "truncated", "not base64", "no key", "no id", "no separator", "second without id"],
)
def test_a_malformed_entry_is_refused_naming_it_and_never_its_key(raw: str, named: str) -> None:
    with pytest.raises(KeyRingError) as refused:
        parse_keys(raw)
    message = str(refused.value)
    assert f"key-encryption key {named} is not `id:` and {KEY_BYTES} bytes in base64" in message
    for secret in (B64_A, B64_B, B64_A[:16], B64_B[:16]):
        assert secret not in message


def test_an_id_given_twice_is_refused() -> None:
    with pytest.raises(KeyRingError, match="key-encryption key id 'a' is given twice"):
        parse_keys(f"a:{B64_A},a:{B64_B}")


def test_a_ring_without_keys_is_refused_naming_the_setting() -> None:
    with pytest.raises(KeyRingError, match="no key-encryption key: set GRAPHLEDGER_KEY_ENCRYPTION_KEYS"):
        KeyRing.from_settings(Settings(key_encryption_keys=None))
    assert KeyRing.from_settings(Settings(key_encryption_keys=SecretStr(f"s:{B64_A}"))).active == "s"


def test_a_wrapped_key_unwraps_for_its_owner_and_holds_no_key_in_the_clear() -> None:
    ring, data_key = KeyRing([("a", KEY_A)]), os.urandom(KEY_BYTES)
    wrapped = ring.wrap(data_key, OWNER)
    assert wrapped.kek_id == "a"
    assert len(wrapped.data) == NONCE_BYTES + KEY_BYTES + 16  # nonce, ciphertext, GCM tag
    assert data_key not in wrapped.data
    assert ring.wrap(data_key, OWNER).data != wrapped.data
    assert ring.unwrap(wrapped, OWNER) == data_key


def test_a_wrapped_key_does_not_unwrap_for_another_owner_or_when_tampered_with() -> None:
    ring = KeyRing([("a", KEY_A)])
    wrapped = ring.wrap(os.urandom(KEY_BYTES), OWNER)
    with pytest.raises(KeyRingError, match=f"the wrapped key of {'0b' * 16} does not open with 'a'"):
        ring.unwrap(wrapped, "0b" * 16)
    tampered = Wrapped("a", wrapped.data[:-1] + bytes([wrapped.data[-1] ^ 1]))
    with pytest.raises(KeyRingError, match="does not open"):
        ring.unwrap(tampered, OWNER)


def test_a_rotated_ring_wraps_with_the_new_key_and_still_unwraps_with_the_old() -> None:
    data_key = os.urandom(KEY_BYTES)
    old = KeyRing([("old", KEY_A)]).wrap(data_key, OWNER)
    rotated = KeyRing([("new", KEY_B), ("old", KEY_A)])
    assert rotated.unwrap(old, OWNER) == data_key
    rewrapped = rotated.wrap(data_key, OWNER)
    assert rewrapped.kek_id == "new"
    assert KeyRing([("new", KEY_B)]).unwrap(rewrapped, OWNER) == data_key


def test_a_key_wrapped_by_a_key_dropped_from_the_ring_is_refused_naming_the_missing_key() -> None:
    old = KeyRing([("old", KEY_A)]).wrap(os.urandom(KEY_BYTES), OWNER)
    with pytest.raises(KeyRingError, match="wrapped by key-encryption key 'old', not in the ring"):
        KeyRing([("new", KEY_B)]).unwrap(old, OWNER)
    with pytest.raises(KeyRingError, match="does not open with 'old'"):
        KeyRing([("old", KEY_B)]).unwrap(old, OWNER)  # an id reused for another key
