"""The read API's OpenAPI response models (`api/models.py`, `api/store_models.py`) and the answer types both ends
use (`graphledger.answers`) name the same fields, and what the types put on the wire validates against the
models: a field added to one and not the other fails here."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from pydantic import BaseModel

from graphledger.answers import (
    Basis,
    ChannelHistory,
    DeltaHistoryAnswer,
    GetAnswer,
    Holding,
    ItemAnswer,
    ListAnswer,
    RefusedWrite,
    SearchItemAnswer,
    StoreBatchAnswer,
    VerdictsAnswer,
)
from graphledger_server.api.models import (
    DeltaChannelHistory,
    DeltaHistoryResponse,
    GetResponse,
    ListResponse,
    VerdictsResponse,
)
from graphledger_server.api.store_models import ItemBody, SearchItemBody, StoreBatchResponse

TUPLE = {
    "config": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "02"},
    "checkpoint": {"v": 4, "id": "02", "ts": "2026-01-01T00:00:00+00:00", "channel_values": {"n": {"v": 1}},
                   "channel_versions": {"n": "1"}, "versions_seen": {}},
    "metadata": {"step": 1},
    "parent_config": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "01"},
    "pending_writes": [["task", "n", {"t": "msgpack", "b": b"\x01"}, "", 0]],
}  # fmt: skip
ITEM = ItemAnswer(["ns"], "k", {"a": 1}, "2026-01-01T00:00:00+00:00", "2026-01-01T00:00:01+00:00", None)
SEARCHED = SearchItemAnswer(**dataclasses.asdict(ITEM), score=0.5)

EVERY_FIELD = [
    (
        GetAnswer(3, 10, TUPLE, own_writes_from=9, current=True, erased=True,
                  holding=Holding({"03": [["task", "n", {"v": 2}, "", 0]]}, {"n": 1}, [""]),
                  basis=Basis(2, b"lead", "run-1"), thread_key=b"k" * 32),
        GetResponse,
    ),
    (ListAnswer([TUPLE]), ListResponse),
    (VerdictsAnswer([RefusedWrite(7, "superseded", b"lead")]), VerdictsResponse),
    (DeltaHistoryAnswer({"n": ChannelHistory([["task", "n", {"v": 2}]], {"v": 1})}), DeltaHistoryResponse),
    (ChannelHistory([["task", "n", {"v": 2}]], {"v": 1}), DeltaChannelHistory),
    (StoreBatchAnswer([ITEM, None, [SEARCHED], [["ns"]]]), StoreBatchResponse),
    (ITEM, ItemBody),
    (SEARCHED, SearchItemBody),
]  # fmt: skip
"""Each answer type with every optional field set, and the model that documents it."""
IDS = [type(answer).__name__ for answer, _ in EVERY_FIELD]
IDS = [type(answer).__name__ for answer, _ in EVERY_FIELD]


def wire_fields(answer: type[Any]) -> set[str]:
    """The fields an answer type puts on the wire: its own, a get's `holding` spread beside them."""
    fields = {field.name for field in dataclasses.fields(answer)}
    if answer is GetAnswer:
        fields = fields - {"holding"} | set(Holding.FIELDS)
    return fields


def test_holding_names_its_fields() -> None:
    assert Holding.FIELDS == tuple(field.name for field in dataclasses.fields(Holding))


@pytest.mark.parametrize(("answer", "model"), EVERY_FIELD, ids=IDS)
def test_a_type_and_its_model_name_the_same_fields(answer: Any, model: type[BaseModel]) -> None:
    assert wire_fields(type(answer)) == set(model.model_fields)


@pytest.mark.parametrize(("answer", "model"), EVERY_FIELD, ids=IDS)
def test_what_a_type_puts_on_the_wire_is_what_its_model_documents(answer: Any, model: type[BaseModel]) -> None:
    wire = answer.to_wire()
    assert set(wire) == set(model.model_fields)
    model.model_validate(wire)
