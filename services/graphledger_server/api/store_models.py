"""Request and response bodies of `POST /v1/store/batch`.

Requests are strict and closed like the checkpoint routes': a wrong type, an unknown field or an
unknown op is a 422 naming it. Everything that would otherwise fail inside Postgres is refused here
with the field's name: NUL and lone surrogates in any text (Postgres text and jsonb reject them),
non-finite numbers, a `.` or an empty label in a namespace (the projection stores `".".join(namespace)`),
and filters outside the filter language (`graphledger.store_filter`, which the client checks too: its
`InvalidFilterError` is a `ValueError`, which pydantic reports as the field's 422).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from graphledger.pg_text import unstorable
from graphledger.store_filter import check_filter

MAX_OPS = 1_000
MAX_COUNT = 2**63 - 1  # Postgres LIMIT/OFFSET are bigints
MAX_QUERY_DIMS = 16_000  # pgvector's largest vector


def _text(value: str, what: str = "text") -> str:
    if reason := unstorable(value):
        raise ValueError(f"{what} {reason}: Postgres cannot store it")
    return value


def _label(value: str) -> str:
    _text(value, "a namespace label")
    if not value or "." in value:
        raise ValueError("a namespace label must be non-empty and must not contain '.'")
    return value


def _finite(values: list[float]) -> list[float]:
    for i, x in enumerate(values):
        if not math.isfinite(x):
            raise ValueError(f"component {i} is {x!r}; a query vector holds finite numbers")
    return values


Label = Annotated[str, AfterValidator(_label)]
PatternLabel = Annotated[str, AfterValidator(_label)]
"""A label of a list_namespaces prefix/suffix; `*` matches any one label."""
Key = Annotated[str, AfterValidator(lambda v: _text(v, "key"))]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]


class _Op(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class GetOp(_Op):
    """`GetOp`: the item, or null."""

    op: Literal["get"]
    namespace: list[Label]
    key: Key


class SearchOp(_Op):
    """`SearchOp`: items under `namespace_prefix` matching `filter`; ranked by similarity to
    `query_vector` when given (the client embeds the query), else most recently updated first."""

    op: Literal["search"]
    namespace_prefix: list[Label] = Field(default_factory=list)
    filter: Annotated[dict[str, Any] | None, AfterValidator(check_filter)] = None
    limit: Count = 10
    offset: Count = 0
    query_vector: (
        Annotated[list[float], Field(min_length=1, max_length=MAX_QUERY_DIMS), AfterValidator(_finite)] | None
    ) = None


class ListNamespacesOp(_Op):
    """`ListNamespacesOp` with at most one prefix and one suffix condition (`*` matches one label)."""

    op: Literal["list_namespaces"]
    prefix: list[PatternLabel] | None = None
    suffix: list[PatternLabel] | None = None
    max_depth: Count | None = None
    limit: Count = 100
    offset: Count = 0


StoreOp = Annotated[GetOp | SearchOp | ListNamespacesOp, Field(discriminator="op")]


class StoreBatchRequest(_Op):
    """The ops of one `BaseStore.batch` call's reads, answered in order."""

    ops: list[StoreOp] = Field(max_length=MAX_OPS)


# Responses: the route answers with `graphledger.answers.StoreBatchAnswer`; these models document it in the
# OpenAPI schema, and tests/unit/test_answer_models.py fails when the two disagree.


class ItemBody(BaseModel):
    namespace: list[str]
    key: str
    value: dict[str, Any]
    created_at: str = Field(description="ISO 8601 with offset.")
    updated_at: str = Field(description="ISO 8601 with offset.")
    expires_at: str | None = Field(
        None, description="ISO 8601 with offset; null for an item without a TTL (the client refreshes only TTL items)."
    )


class SearchItemBody(ItemBody):
    score: float | None = Field(description="Similarity to query_vector (max over the item's vectors); null "
                                "without a query, or for an item without vectors.")  # fmt: skip


class StoreBatchResponse(BaseModel):
    results: list[ItemBody | list[SearchItemBody] | list[list[str]] | None] = Field(
        description="One per op, in op order: get -> Item | null, search -> [SearchItem], list_namespaces -> [[label]]."
    )
