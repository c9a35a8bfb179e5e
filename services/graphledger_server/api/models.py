"""Request bodies of the read API (validated) and response bodies (for the OpenAPI schema).

Requests are strict and closed: a wrong type or an unknown field is a 422 naming it, so a client typo
(`fliter`) fails loudly instead of silently widening a read. Text Postgres cannot hold (NUL) is refused
here rather than surfacing as a database error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from langchain_core.runnables import RunnableConfig
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from graphledger.pg_text import json_problem
from graphledger.wire import (
    CACHED_THROUGH_HEADER,
    CONSISTENCY_HEADER,
    JSON,
    MSGPACK,
    OWN_WRITES_HEADER,
    THREAD_KEY_HEADER,
)

MAX_DELTA_CHANNELS = 256
MAX_VERDICT_OFFSETS = 64
"""The records one verdicts request names: a put's, or a chunked write's parts."""


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL (\\u0000): Postgres text cannot hold it")
    return value


def _jsonb(value: Any) -> Any:
    """A filter jsonb can hold: no NUL or lone surrogate (keys included), no NaN, bounded nesting."""
    if problem := json_problem(value, "filter"):
        raise ValueError(problem)
    return value


Text = Annotated[str, AfterValidator(_no_nul)]
ThreadId = Annotated[str, StringConstraints(min_length=1), AfterValidator(_no_nul)]
MetadataFilter = Annotated[dict[str, Any], AfterValidator(_jsonb)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class GetRequest(_Request):
    """`aget_tuple`: the given checkpoint, or the newest of the thread's namespace without an id."""

    thread_id: ThreadId
    checkpoint_ns: Text = ""
    checkpoint_id: Text | None = None

    def config(self, thread: Callable[[str], str]) -> RunnableConfig:
        """The saver's config, its thread id as stored (`thread`: the tenant's mapping)."""
        configurable: dict[str, Any] = {"thread_id": thread(self.thread_id), "checkpoint_ns": self.checkpoint_ns}
        if self.checkpoint_id is not None:
            configurable["checkpoint_id"] = self.checkpoint_id
        return {"configurable": configurable}


class ListRequest(_Request):
    """`alist`, newest first. No `thread_id` lists every thread; no `checkpoint_ns`, every namespace."""

    thread_id: ThreadId | None = None
    checkpoint_ns: Text | None = None
    checkpoint_id: Text | None = None
    filter: MetadataFilter | None = Field(None, description="Checkpoint metadata must contain this (jsonb @>).")
    before_checkpoint_id: Text | None = Field(None, description="Only checkpoints with a smaller id.")
    limit: int | None = Field(None, ge=0, le=2**63 - 1)  # Postgres LIMIT is a bigint

    @model_validator(mode="after")
    def _narrowing_needs_thread(self) -> ListRequest:
        if self.thread_id is None and (self.checkpoint_ns is not None or self.checkpoint_id is not None):
            raise ValueError("checkpoint_ns and checkpoint_id narrow a thread: give thread_id too")
        return self

    def config(self, thread: Callable[[str], str]) -> RunnableConfig | None:
        if self.thread_id is None:
            return None
        configurable: dict[str, Any] = {"thread_id": thread(self.thread_id)}
        if self.checkpoint_ns is not None:
            configurable["checkpoint_ns"] = self.checkpoint_ns
        if self.checkpoint_id is not None:
            configurable["checkpoint_id"] = self.checkpoint_id
        return {"configurable": configurable}

    def before(self) -> RunnableConfig | None:
        if self.before_checkpoint_id is None:
            return None
        return {"configurable": {"checkpoint_id": self.before_checkpoint_id}}


class DeltaHistoryRequest(GetRequest):
    """`aget_delta_channel_history`: the writes (and seed) that rebuild each DeltaChannel's value."""

    # The official query reads a few columns per channel; Postgres allows 1664 in one select list.
    channels: list[Text] = Field(max_length=MAX_DELTA_CHANNELS)


class VerdictsRequest(_Request):
    """The one-writer rule's verdicts of the caller's records of one thread, for a client that does not read
    the log: answered once the projection applied them."""

    thread_id: ThreadId
    partition: int = Field(ge=0, le=2**31 - 1, description="The thread's partition of the checkpoint topic.")
    offsets: list[Annotated[int, Field(ge=0, le=2**63 - 1)]] = Field(min_length=1, max_length=MAX_VERDICT_OFFSETS)


# Responses: the routes answer with the types of `graphledger.answers` (their `to_wire()`); these models
# document them in the OpenAPI schema, and tests/unit/test_answer_models.py fails when the two disagree.


class TypedValue(BaseModel):
    """Opaque bytes from the agent's serde; `b` is base64 in JSON, binary in msgpack."""

    t: str
    b: str | bytes


class InlineValue(BaseModel):
    """A primitive kept inline in the checkpoint's jsonb."""

    v: Any


Value = TypedValue | InlineValue
Write = tuple[str, str, Value]
PendingWrite = tuple[str, str, Value, str, int]
"""(task_id, channel, value, task_path, idx), in the order the saver returns them."""


class Config(BaseModel):
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str


class Checkpoint(BaseModel):
    """LangGraph's checkpoint, its channel values as wire values; other fields as stored."""

    model_config = ConfigDict(extra="allow")

    v: int
    id: str
    ts: str
    channel_values: dict[str, Value]
    channel_versions: dict[str, Any]
    versions_seen: dict[str, dict[str, Any]]


class CheckpointTuple(BaseModel):
    config: Config
    checkpoint: Checkpoint
    metadata: dict[str, Any]
    parent_config: Config | None
    pending_writes: list[PendingWrite]


class Basis(BaseModel):
    operations: int = Field(
        description="The thread's operation count (deletes, prunes that delete, expiries, copies onto it, ...)."
    )
    lead: str | bytes | None = Field(
        None,
        description="The namespace's lead: the checkpoint hash its last counted protected put carried (null: open).",
    )
    lead_run: str | None = Field(None, description="That put's metadata run_id (null: none).")
    lead_id: str | None = Field(None, description="That put's checkpoint id (absent: open).")
    lead_writer: str | bytes | None = Field(None, description="The run that put it, as its intent named it.")


class GetResponse(BaseModel):
    tuple: CheckpointTuple | None = Field(description="Null when there is none, or when `current`.")
    log_partition: int = Field(description="The thread's partition of the checkpoint topic.")
    log_end: int = Field(
        description="The partition's end when the read arrived: the answer reflects every record of the thread below."
    )
    own_writes_from: int | None = Field(
        None,
        description=f"With {OWN_WRITES_HEADER}: the offset on the thread's partition from which on the answer may "
        "lack the client's own writes it named; the client adds those itself.",
    )
    current: bool = Field(
        False,
        description=f"With {CACHED_THROUGH_HEADER}: no record of the thread but the named ones came since that "
        "offset, so the client's kept answer, with its own writes added, is the answer (`tuple` is null).",
    )
    namespaces: list[str] | None = Field(
        None,
        description="A get of the newest checkpoint: every namespace of the thread with a checkpoint or a pending "
        "write in the answer's projection (absent: too many to list); a client knows the others are empty.",
    )
    erased: bool = Field(False, description="The thread was erased: it has no checkpoint, and never will.")
    later_writes: dict[str, list[list[Any]]] | None = Field(
        None,
        description="A get of the newest checkpoint: the pending writes of the namespace's newer checkpoints, whose "
        "puts are still to come, by checkpoint id (null: too many to send).",
    )
    blob_ceilings: dict[str, int] | None = Field(
        None,
        description="A get of the newest checkpoint: per channel, the counter of the namespace's highest blob version "
        "(its 32 zero-padded digits; 2^63 when it has none): no row holds a version with a counter above it.",
    )
    basis: Basis | None = Field(
        None,
        description="A get of the newest checkpoint: what the one-writer rule held of the thread as of the answer, "
        'which a writer that read it says with its writes (docs/architecture.md, "One writer per thread").',
    )
    thread_key: bytes | None = Field(
        None,
        description=f"With {THREAD_KEY_HEADER}: the thread's own data key (32 bytes; base64 in JSON), for an existing "
        "thread and a token with the keys permission; the client seals the thread with it from then on.",
    )


class ListResponse(BaseModel):
    tuples: list[CheckpointTuple]


class DeltaChannelHistory(BaseModel):
    writes: list[Write] = Field(description="(task_id, channel, value), oldest first.")
    seed: Value | None = Field(None, description="Absent when replay starts from an empty channel.")


class DeltaHistoryResponse(BaseModel):
    history: dict[str, DeltaChannelHistory]


class RefusedWriteBody(BaseModel):
    offset: int = Field(description="The refused record's offset.")
    reason: str
    superseded_by: str | bytes | None = Field(None, description="The lead its writer did not expect (a hash).")


class VerdictsResponse(BaseModel):
    refused: list[RefusedWriteBody] = Field(description="The named records the rule refused; every other one counts.")


class ErrorBody(BaseModel):
    error: str
    message: str
    retryable: bool


# OpenAPI of the routes that parse their own bodies (to take msgpack as well as JSON).


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """The `requestBody` of a route whose body is `model`, in JSON or msgpack."""
    schema = model.model_json_schema()
    return {"required": True, "content": {JSON: {"schema": schema}, MSGPACK: {"schema": schema}}}


def header_parameter(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    """An optional request header, as OpenAPI describes one."""
    return {"name": name, "in": "header", "required": False, "schema": schema, "description": description}


def consistency_parameter(example: str) -> dict[str, Any]:
    """The consistency token header a read may carry (`X-Graphledger-Consistency`)."""
    return header_parameter(
        CONSISTENCY_HEADER,
        {"type": "string", "example": example},
        "topic:partition:offset,...; answer only once the projection applied them.",
    )


ERROR_RESPONSE: dict[str, Any] = {"model": ErrorBody, "content": {MSGPACK: {}}}
"""What an error answers: `ErrorBody`, in JSON or msgpack."""
