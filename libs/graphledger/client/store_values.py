"""Pure helpers of `KafkaStore`: op validation, the texts to embed, read API bodies and result decoding.

Everything here runs before anything is published, so a bad op fails the whole batch with nothing
on the topic. Namespaces follow LangGraph's own rules and raise its `InvalidNamespaceError`; every
other bad input raises `InvalidInputError` (a `ValueError`, like LangGraph's own store errors); a bad
search filter its subclass `InvalidFilterError`, from the filter language the read API checks too
(`graphledger.store_filter`).
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, assert_never, cast

from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    get_text_at_path,
    tokenize_path,
)
from langgraph.store.base import _validate_namespace as validate_namespace
from langgraph.store.base import _validate_namespace_labels as validate_namespace_labels

from graphledger.answers import ItemAnswer, SearchItemAnswer, StoreBatchAnswer, StoreResult
from graphledger.errors import InvalidInputError, ReadApiError
from graphledger.events.store import MAX_TTL_MINUTES, StoreDelete, StorePut, Vector
from graphledger.pg_text import index_key_problem, json_problem, unstorable
from graphledger.store_filter import check_filter

MAX_COUNT = 2**63 - 1  # limits and offsets are Postgres bigints

TokenizedField = tuple[str, Literal["$"] | list[str]]


def tokenized_fields(fields: Any) -> list[TokenizedField]:
    """An index config's `fields` as LangGraph's stores keep them (default `["$"]`, the whole value)."""
    fields = fields or ["$"]
    if isinstance(fields, str):
        fields = [fields]
    if not isinstance(fields, list | tuple) or not all(isinstance(f, str) for f in fields):
        raise InvalidInputError(f"index fields must be a list of field paths, got {fields!r}")
    return [(f, "$") if f == "$" else (f, tokenize_path(f)) for f in fields]


# -- prepared ops -------------------------------------------------------------------------------


@dataclass(slots=True)
class PreparedWrite:
    """A validated put or delete; `texts` are `(field_path, text)` to embed, None if not indexed."""

    namespace: tuple[str, ...]
    key: str
    value_json: bytes | None  # None: a delete
    ttl_minutes: float | None = None
    texts: list[tuple[str, str]] | None = None

    def event(self, vectors: dict[str, tuple[float, ...]]) -> StorePut | StoreDelete:
        if self.value_json is None:
            return StoreDelete(self.namespace, self.key)
        rows: tuple[Vector, ...] | None = None
        if self.texts is not None:
            rows = tuple((path, vectors[text]) for path, text in self.texts)
        return StorePut(self.namespace, self.key, self.value_json, self.ttl_minutes, rows)


@dataclass(slots=True)
class PreparedRead:
    """A validated get, search or list_namespaces, as its read API body (plus the query to embed)."""

    kind: Literal["get", "search", "list_namespaces"]
    body: dict[str, Any]
    query: str | None = None
    refresh: bool = False
    """`refresh_ttl`: the items it returns get a `store.refresh` event."""


@dataclass(slots=True)
class Constant:
    """An op whose answer is known without asking anyone (e.g. list_namespaces with contradicting
    conditions) or that changes nothing (a delete in the empty namespace, where no item can be)."""

    result: Result


Prepared = PreparedWrite | PreparedRead | Constant


def prepare(op: Op, *, index_fields: list[TokenizedField] | None) -> Prepared:
    """Validate one op and turn it into what the store sends; raises before anything is published."""
    if isinstance(op, PutOp):
        return _prepare_put(op, index_fields)
    if isinstance(op, GetOp):
        namespace = _namespace_labels(op.namespace)
        body = {"op": "get", "namespace": list(namespace), "key": _key(op.key)}
        return PreparedRead("get", body, refresh=bool(op.refresh_ttl))
    if isinstance(op, SearchOp):
        read = _prepare_search(op, has_index=index_fields is not None)
        if isinstance(read, PreparedRead):
            read.refresh = bool(op.refresh_ttl)
        return read
    if isinstance(op, ListNamespacesOp):
        return _prepare_list_namespaces(op)
    raise InvalidInputError(f"unknown store operation {type(op).__name__}")


def _namespace_labels(namespace: Any) -> tuple[str, ...]:
    if not isinstance(namespace, tuple | list):
        # A str would pass LangGraph's label checks one character at a time.
        raise InvalidNamespaceError(f"Namespace must be a tuple of strings, got {type(namespace).__name__}.")
    labels: tuple[str, ...] = tuple(namespace)
    validate_namespace_labels(labels)
    for label in labels:
        if reason := unstorable(label):  # LangGraph checks NUL, not lone surrogates
            raise InvalidNamespaceError(f"Namespace label {label!r} {reason}, which Postgres cannot store.")
    return labels


def _key(key: Any) -> str:
    # `put`/`delete` pass str(key); a get of the same int or UUID key must find what they wrote.
    if isinstance(key, int | uuid.UUID) and not isinstance(key, bool):
        key = str(key)
    if not isinstance(key, str):
        raise InvalidInputError(f"store key must be a str, got {type(key).__name__}")
    if reason := unstorable(key):
        raise InvalidInputError(f"store key {key!r} {reason}, which Postgres cannot store")
    return key


def _prepare_put(op: PutOp, index_fields: list[TokenizedField] | None) -> Prepared:
    key = _key(op.key)
    if op.value is None:
        namespace = _namespace_labels(op.namespace)
        # Puts refuse the empty namespace, so nothing can be deleted from it.
        return PreparedWrite(namespace, key, None) if namespace else Constant(None)
    namespace = _namespace_labels(op.namespace)
    validate_namespace(namespace)
    if problem := index_key_problem("namespace and key", ".".join(namespace), key):
        raise InvalidInputError(problem)
    if not isinstance(op.value, Mapping):
        raise InvalidInputError(f"store value must be a dict, got {type(op.value).__name__}")
    value = dict(op.value)
    value_json = dump_value(value)
    ttl = op.ttl
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl)):
        raise InvalidInputError(f"ttl must be a finite number of minutes or None, got {ttl!r}")
    if ttl is not None and abs(ttl) > MAX_TTL_MINUTES:
        raise InvalidInputError(
            f"ttl {ttl!r} minutes is beyond the store's ±{MAX_TTL_MINUTES} (its ttl_minutes is an INT)"
        )
    index = op.index
    if index is not None and index is not False and not _is_path_list(index):
        raise InvalidInputError(f"index must be False, None or a list of field paths, got {index!r}")
    texts: list[tuple[str, str]] | None = None
    if index_fields is not None and index is not False:
        paths = index_fields if index is None else [(p, tokenize_path(p)) for p in index]
        texts = _texts(value, paths)
    return PreparedWrite(namespace, key, value_json, None if ttl is None else float(ttl), texts)


def _is_path_list(index: Any) -> bool:
    return isinstance(index, list | tuple) and all(isinstance(p, str) and unstorable(p) is None for p in index)


def _texts(value: dict[str, Any], paths: Sequence[TokenizedField]) -> list[tuple[str, str]]:
    """One `(field_path, text)` per extracted text, named as `AsyncPostgresStore` names its vector
    rows: the path itself, or `path.i` when the path yields several texts. A later path of the same
    name replaces an earlier one (one row per name, as in `InMemoryStore`)."""
    rows: dict[str, str] = {}
    for path, tokens in paths:
        texts = get_text_at_path(value, tokens)
        for i, text in enumerate(texts):
            rows[f"{path}.{i}" if len(texts) > 1 else path] = text
    return list(rows.items())


def dump_value(value: dict[str, Any]) -> bytes:
    """The value as the UTF-8 JSON text jsonb stores; refuses what jsonb (or a read of it) cannot hold."""
    _check_json(value, "store value")
    try:
        return json.dumps(value, allow_nan=False, ensure_ascii=False).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"store value is not JSON-serializable: {exc}") from None


def _check_json(value: Any, path: str) -> None:
    if problem := json_problem(value, path):
        raise InvalidInputError(f"{problem}: Postgres jsonb or the read API cannot hold it")


def _prepare_search(op: SearchOp, *, has_index: bool) -> PreparedRead:
    prefix = _namespace_labels(op.namespace_prefix)
    body: dict[str, Any] = {
        "op": "search",
        "namespace_prefix": list(prefix),
        "limit": _count(op.limit, "limit"),
        "offset": _count(op.offset, "offset"),
    }
    if check_filter(op.filter):  # an empty filter is no filter
        body["filter"] = op.filter
    query = op.query
    if query is not None and not isinstance(query, str):
        raise InvalidInputError(f"query must be a str, got {type(query).__name__}")
    if query and not has_index:
        # LangGraph's own stores quietly drop the query; a silently unranked answer hides the mistake.
        raise InvalidInputError(
            "search with a query needs a KafkaStore built with index={'dims': ..., 'embed': ...}; "
            "this store has no index"
        )
    return PreparedRead("search", body, query or None)


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise InvalidInputError(f"{what} must be an int from 0 to {MAX_COUNT} (a Postgres bigint), got {value!r}")
    return value


def _prepare_list_namespaces(op: ListNamespacesOp) -> Prepared:
    body: dict[str, Any] = {
        "op": "list_namespaces",
        "limit": _count(op.limit, "limit"),
        "offset": _count(op.offset, "offset"),
    }
    if op.max_depth is not None:
        body["max_depth"] = _count(op.max_depth, "max_depth")
    paths: dict[str, tuple[str, ...]] = {}
    for condition in op.match_conditions or ():
        match_type: str = condition.match_type
        path = _namespace_labels(condition.path)
        if match_type not in ("prefix", "suffix"):
            raise InvalidInputError(f"Unsupported match type: {match_type!r}")
        if not path:
            continue  # constrains nothing, as in both LangGraph stores
        merged = _merge_paths(paths.get(match_type), path, from_end=match_type == "suffix")
        if merged is None:
            return Constant([])  # two conditions no namespace can meet at once
        paths[match_type] = merged
    for match_type, path in paths.items():
        body[match_type] = list(path)
    return PreparedRead("list_namespaces", body)


def _merge_paths(a: tuple[str, ...] | None, b: tuple[str, ...], *, from_end: bool) -> tuple[str, ...] | None:
    """One pattern meeting both (`*` matches any one label), or None when none can: lets several
    conditions of one kind, which `batch` accepts, travel as the read API's single prefix/suffix."""
    if a is None:
        return b
    if from_end:
        merged = _merge_paths(a[::-1], b[::-1], from_end=False)
        return None if merged is None else merged[::-1]
    out = list(a if len(a) >= len(b) else b)
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x == "*":
            out[i] = y
        elif y == "*" or x == y:
            out[i] = x
        else:
            return None
    return tuple(out)


# -- results ------------------------------------------------------------------------------------


def _timestamp(value: Any) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def decode_item(answered: ItemAnswer) -> Item:
    return Item(
        value=answered.value,
        key=answered.key,
        namespace=tuple(answered.namespace),
        created_at=_timestamp(answered.created_at),
        updated_at=_timestamp(answered.updated_at),
    )


def decode_search_item(answered: SearchItemAnswer) -> SearchItem:
    score = answered.score
    return SearchItem(
        namespace=tuple(answered.namespace),
        key=answered.key,
        value=answered.value,
        created_at=_timestamp(answered.created_at),
        updated_at=_timestamp(answered.updated_at),
        score=None if score is None else float(score),
    )


def decode_result(kind: str, result: StoreResult) -> Result:
    """LangGraph's result of an op of `kind` from the read API's (`StoreBatchAnswer` parsed it by kind)."""
    match result:
        case None:
            return None
        case ItemAnswer():
            return decode_item(result)
        case list() if kind == "search":
            return [decode_search_item(item) for item in cast(list[SearchItemAnswer], result)]
        case list():
            return [tuple(labels) for labels in cast(list[list[str]], result)]
        case _:
            assert_never(result)


def read_answer(reads: Sequence[PreparedRead], answer: Any) -> StoreBatchAnswer:
    """The read API's answer to `reads`, parsed; a malformed one is a `ReadApiError`."""
    if not isinstance(answer, dict):
        raise ReadApiError(200, "bad_response", f"/v1/store/batch answered {type(answer).__name__}")
    return StoreBatchAnswer.from_wire(answer, [read.kind for read in reads])
