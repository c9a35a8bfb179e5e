"""Client-side JSON checks: what jsonb or the read API's msgpack could not hold is refused up front."""

from __future__ import annotations

import pytest

from graphledger.client.store_values import dump_value
from graphledger.client.values import dump_json
from graphledger.errors import InvalidInputError


def test_64_bit_integers_pass_and_larger_ones_are_refused_naming_the_path() -> None:
    assert (
        dump_json({"a": 2**64 - 1, "b": -(2**63)}, "metadata")
        == b'{"a": 18446744073709551615, "b": -9223372036854775808}'
    )
    with pytest.raises(InvalidInputError, match=r"checkpoint metadata\.a\[1\] is 18446744073709551616"):
        dump_json({"a": [1, 2**64]}, "checkpoint metadata")
    with pytest.raises(InvalidInputError, match=r"store value\.n\.m is -9223372036854775809"):
        dump_value({"n": {"m": -(2**63) - 1}})


def test_long_digit_strings_are_not_mistaken_for_integers() -> None:
    assert (
        dump_json({"id": "123456789012345678901234567890"}, "metadata") == b'{"id": "123456789012345678901234567890"}'
    )
