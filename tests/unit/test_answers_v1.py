"""The previous release's answers (tests/fixtures/answers_v1: real bodies of the read API of 0.1.0) are read
by the typed answers of `graphledger.answers`, and `to_wire()` encodes what was read back to the very bytes:
a client of this release reads an older read API, and this release's read API answers an older client with
what it always sent. A body from a later release, with fields this one does not know or without optional
ones, reads too (a rolling upgrade either way)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import orjson
import ormsgpack
import pytest

from graphledger.answers import (
    DeltaHistoryAnswer,
    GetAnswer,
    ItemAnswer,
    KeyFilterAnswer,
    ListAnswer,
    SearchItemAnswer,
    StoreBatchAnswer,
)
from graphledger.client.store_values import decode_result
from graphledger.errors import ReadApiError
from graphledger.folds import thread
from graphledger.log.key_filter import KeyFilter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "answers_v1"
STORE_KINDS = ["get", "get", "get", "search", "list_namespaces"]
"""The ops of the `store_batch` fixtures' request, in order."""


def _json_bytes(value: Any) -> str:
    """As the read API's JSON codec writes bytes (`api/codec.py`)."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(type(value).__name__)


def body(name: str) -> dict[str, Any]:
    raw = (FIXTURES / name).read_bytes()
    decoded: dict[str, Any] = ormsgpack.unpackb(raw) if name.endswith(".msgpack") else orjson.loads(raw)
    return decoded


def encoded(name: str, wire: dict[str, Any]) -> bytes:
    return ormsgpack.packb(wire) if name.endswith(".msgpack") else orjson.dumps(wire, default=_json_bytes)


def parsed(name: str) -> Any:
    wire = body(name)
    if name.startswith("get."):
        return GetAnswer.from_wire(wire)
    if name.startswith("list."):
        return ListAnswer.from_wire(wire)
    if name.startswith("delta_history."):
        return DeltaHistoryAnswer.from_wire(wire)
    if name.startswith("key_filter."):
        return KeyFilterAnswer.from_wire(wire)
    return StoreBatchAnswer.from_wire(wire, STORE_KINDS)


FILES = sorted(p.name for p in FIXTURES.iterdir() if p.suffix in (".msgpack", ".json"))


def test_every_kind_of_answer_has_a_fixture() -> None:
    kinds = {name.rsplit(".", 1)[0] for name in FILES}
    assert {"get.folded", "get.projection", "get.by_id", "get.own_writes_from", "get.current"} <= kinds
    assert {"get.later_writes", "get.erased", "list", "delta_history", "key_filter", "store_batch"} <= kinds


@pytest.mark.parametrize("name", FILES)
def test_an_answer_of_the_previous_release_reads_and_encodes_back_to_its_bytes(name: str) -> None:
    assert encoded(name, parsed(name).to_wire()) == (FIXTURES / name).read_bytes()


@pytest.mark.parametrize("name", ["get.folded.msgpack", "get.projection.msgpack", "get.folded.json"])
def test_a_get_of_the_newest_checkpoint_reads_with_what_a_client_holds_the_thread_with(name: str) -> None:
    answer = parsed(name)
    assert (answer.log_partition, answer.own_writes_from, answer.current, answer.erased) == (3, None, False, False)
    assert answer.tuple["config"]["thread_id"] == "t-chat"
    assert answer.holding is not None
    assert answer.holding.later_writes == {} and answer.holding.namespaces == [""]
    assert answer.holding.blob_ceilings == {"__start__": 4, "messages": 6}
    view = thread.from_answer("", answer.tuple, answer.holding.namespaces, answer.holding.later_writes,
                              answer.holding.blob_ceilings)  # fmt: skip
    assert view.answer("t-chat", "", None) == answer.tuple  # the fold holds the thread from it


def test_the_other_gets_read_as_they_were_meant() -> None:
    by_id = parsed("get.by_id.msgpack")
    assert by_id.tuple is not None and by_id.holding is None
    named = parsed("get.own_writes_from.msgpack")
    assert named.own_writes_from == named.log_end == 10 and named.holding is not None
    current = parsed("get.current.msgpack")
    assert (current.current, current.tuple, current.own_writes_from, current.holding) == (True, None, 0, None)
    erased = parsed("get.erased.msgpack")
    assert (erased.erased, erased.tuple, erased.holding) == (True, None, None)
    later = parsed("get.later_writes.msgpack")
    assert later.holding is not None and later.holding.later_writes is not None
    [(checkpoint_id, [write])] = later.holding.later_writes.items()
    assert checkpoint_id > later.tuple["config"]["checkpoint_id"] and write[:2] == ["task", "x"]


def test_a_list_a_history_and_a_key_filter_read_as_they_were_meant() -> None:
    assert len(parsed("list.msgpack").tuples) == 6 and len(parsed("list.json").tuples) == 1
    history = parsed("delta_history.msgpack").history
    assert history["n"].seed == {"v": 3} and [w[1] for w in history["items"].writes] == ["items", "items"]
    copy = KeyFilter.from_answer(body("key_filter.msgpack"))
    assert copy is not None and copy.through == 32


def test_a_store_batch_reads_op_by_op() -> None:
    results = parsed("store_batch.msgpack").results
    first, second, missing, found, namespaces = results
    assert isinstance(first, ItemAnswer) and first.expires_at is None and first.namespace == ["users", "u1"]
    assert isinstance(second, ItemAnswer) and second.expires_at is not None
    assert missing is None
    assert [type(item) for item in found] == [SearchItemAnswer] * 3 and found[0].score is None
    assert namespaces == [["users", "u1"], ["users", "u2"]]
    items = [decode_result(kind, result) for kind, result in zip(STORE_KINDS, results, strict=True)]
    assert items[0].key == "k1" and items[4] == [("users", "u1"), ("users", "u2")]  # type: ignore[union-attr]


def test_fields_a_later_release_adds_are_ignored_and_missing_optional_ones_default() -> None:
    later = {**body("get.folded.msgpack"), "from_a_later_release": [1, 2]}
    assert GetAnswer.from_wire(later).to_wire() == body("get.folded.msgpack")
    bare = GetAnswer.from_wire({"log_partition": 1, "log_end": 5, "tuple": None})
    assert (bare.own_writes_from, bare.current, bare.erased, bare.holding) == (None, False, False, None)
    namespaces_only = GetAnswer.from_wire({"log_partition": 1, "log_end": 5, "tuple": None, "namespaces": [""]})
    assert namespaces_only.holding is not None and namespaces_only.holding.later_writes == {}
    history = DeltaHistoryAnswer.from_wire({"history": {"c": {}}, "next": True}).history["c"]
    assert (history.writes, history.seed) == ([], None)
    item = {k: v for k, v in body("store_batch.msgpack")["results"][0].items() if k != "expires_at"}
    [read] = StoreBatchAnswer.from_wire({"results": [{**item, "rank": 1}]}, ["get"]).results
    assert isinstance(read, ItemAnswer) and read.expires_at is None
    assert KeyFilterAnswer.from_wire({"through": 7}) == KeyFilterAnswer(7)


@pytest.mark.parametrize(
    ("parse", "wire"),
    [
        (GetAnswer.from_wire, {"log_partition": 1, "tuple": None}),
        (ListAnswer.from_wire, {}),
        (DeltaHistoryAnswer.from_wire, {"tuples": []}),
        (KeyFilterAnswer.from_wire, {"complete": True}),
        (lambda wire: StoreBatchAnswer.from_wire(wire, ["get"]), {"results": [{"key": "k"}]}),
        (lambda wire: StoreBatchAnswer.from_wire(wire, ["get", "get"]), {"results": [None]}),
    ],
    ids=["get", "list", "history", "key-filter", "item", "count"],
)
def test_an_answer_without_a_field_every_release_sends_is_a_bad_response(parse: Any, wire: dict[str, Any]) -> None:
    with pytest.raises(ReadApiError) as raised:
        parse(wire)
    assert raised.value.code == "bad_response"
