"""The payload codec mechanism (`graphledger.events.codec`): a payload follows the dataclass's fields,
each field's type (or its `wire` kind) validates it with a message naming the field and the bad value,
and what the compiled decoder keeps without a call is exactly what the kind's `decode` accepts."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

from graphledger.errors import InvalidEventError
from graphledger.events.codec import (
    Bytes,
    EventPayload,
    Flag,
    Integer,
    Kind,
    Nullable,
    Text,
    payload_codec,
    wire,
)


@dataclass(frozen=True, slots=True)
class Cell:
    name: str
    data: bytes | None = field(metadata=wire(label="value"))


@payload_codec
@dataclass(frozen=True, slots=True)
class Sample(EventPayload):
    TYPE: ClassVar[str] = "sample"
    thread_id: str = field(metadata=wire(kind=Text(nonempty=True)))
    body_json: bytes = field(metadata=wire("body"))
    done: bool
    count: int
    parent: str | None
    tags: tuple[str, ...]
    cells: tuple[Cell, ...]
    ratio: float | None
    keep: int = field(default=1, metadata=wire(label="sample keep", kind=Integer(1, 9), omitted=True))


GOOD = Sample("t", b"{}", False, 3, None, ("a", "b"), (Cell("c", b"x"), Cell("d", None)), 0.5)


def test_the_payload_follows_the_fields_under_their_wire_names_in_order() -> None:
    payload = GOOD.to_payload()
    assert list(payload) == ["thread_id", "body", "done", "count", "parent", "tags", "cells", "ratio"]
    assert payload["tags"] == ["a", "b"] and payload["cells"] == [["c", b"x"], ["d", None]]
    assert Sample.from_payload(payload) == GOOD


def test_a_default_left_out_of_the_payload_is_read_when_absent() -> None:
    assert "keep" not in GOOD.to_payload()
    kept = dataclasses.replace(GOOD, keep=4)
    assert kept.to_payload()["keep"] == 4
    assert Sample.from_payload(kept.to_payload()) == kept
    assert Sample.from_payload(GOOD.to_payload()).keep == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"thread_id": ""}, "thread_id '' is not a non-empty string"),
        ({"thread_id": "a\x00"}, r"thread_id 'a\\x00' contains a NUL character"),
        ({"body": "{}"}, "body is a str, not bytes"),
        ({"done": 1}, "done 1 is not a bool"),
        ({"count": True}, "count True is not an integer"),
        ({"parent": 5}, "parent 5 is not a string"),
        ({"tags": ["a", 1]}, r"tags \['a', 1\] is not a list of strings"),
        ({"cells": {}}, "cells is a dict, not a list"),
        ({"cells": [["c"]]}, "cells row 0 is a list of 1, not a list of 2"),
        ({"cells": [["c", b"x"], "row"]}, "cells row 1 is a str, not a list of 2"),
        ({"cells": [[1, b"x"]]}, "cell name 1 is not a string"),
        ({"cells": [["c", "x"]]}, "value is a str, not bytes"),
        ({"ratio": math.inf}, "ratio inf is not a finite number"),
        ({"keep": 10}, "sample keep 10 is not an integer from 1 to 9"),
    ],
)
def test_a_bad_value_is_refused_naming_its_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidEventError, match=f"^{message}$"):
        Sample.from_payload({**GOOD.to_payload(), **change})


def test_bytes_and_rows_are_named_by_type_and_shape_never_by_content() -> None:
    secret = "my password"
    for change in ({"body": secret}, {"cells": [[secret]]}, {"cells": [["c", secret]]}):
        with pytest.raises(InvalidEventError) as refused:
            Sample.from_payload({**GOOD.to_payload(), **change})
        assert secret not in str(refused.value)


class _Subclass(str):
    pass


@pytest.mark.parametrize(
    ("kind", "values"),
    [
        (Text(), ["", "x", "a\x00", _Subclass("s"), 1, None]),
        (Text(nonempty=True, nul_apart=False), ["", "x", "a\x00", None]),
        (Integer(0, 3), [-1, 0, 3, 4, True, 2.0, 2**70]),
        (Integer(), [-(2**70), 0, False, "1"]),
        (Nullable(Text()), [None, "x", 5]),
        (Bytes(), [b"", b"x", bytearray(b"x"), "x"]),
        (Flag(), [True, False, 0, None]),
    ],
)
def test_what_the_compiled_decoder_keeps_without_a_call_is_what_decode_accepts(kind: Kind, values: list[Any]) -> None:
    @payload_codec
    @dataclass(frozen=True, slots=True)
    class One(EventPayload):
        TYPE: ClassVar[str] = "one"
        value: object = field(metadata=wire(kind=kind))

    for value in values:
        compiled = _outcome(lambda v=value: One.from_payload({"value": v}).value)
        assert compiled == _outcome(lambda v=value: kind.decode(v, "value")), value


def test_a_field_whose_type_says_no_kind_is_refused_when_the_class_is_made() -> None:
    with pytest.raises(TypeError, match=r"give the field metadata=wire\(kind=\.\.\.\)"):

        @payload_codec
        @dataclass(frozen=True, slots=True)
        class Unknown(EventPayload):
            TYPE: ClassVar[str] = "unknown"
            mapping: dict[str, int]


def test_a_field_left_out_as_its_default_needs_one() -> None:
    with pytest.raises(TypeError, match=r"Undefaulted\.keep is left out of the payload as its default, but has none"):

        @payload_codec
        @dataclass(frozen=True, slots=True)
        class Undefaulted(EventPayload):
            TYPE: ClassVar[str] = "undefaulted"
            keep: int = field(metadata=wire(omitted=True))


def _outcome(decode: Callable[[], Any]) -> tuple[str, Any]:
    """What a decode gave (its type too: a str subclass stays one) or why it refused."""
    try:
        value = decode()
    except InvalidEventError as exc:
        return "refused", str(exc)
    return "kept", (type(value), value)
