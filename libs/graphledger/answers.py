"""The read API's answers, one frozen type each: the read API builds them, the client parses them.

`to_wire()` is the body a route encodes (msgpack or JSON: `graphledger_server/api/codec.py`), field by
field as docs/architecture.md, "Read API (/v1)" describes it; `from_wire(body)` reads one back. A reader
ignores the fields it does not know and defaults the optional ones that are missing, so either side may be
a release ahead of the other (a rolling upgrade); a field every release sends is required, and its absence
is a `ReadApiError` (`bad_response`). What sits inside a field stays in wire form: a checkpoint is the read
API's `Tuple`, a value `{"t": type, "b": bytes}` or `{"v": primitive}` (`wire.py`), and bytes are as the
body decodes them (base64 text in JSON).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from graphledger.errors import ReadApiError

WireTuple = dict[str, Any]
"""A checkpoint as the read API answers it: `config`, `checkpoint` (its channel values as wire values),
`metadata`, `parent_config`, `pending_writes` (each `[task_id, channel, value, task_path, idx]`)."""
WireValue = dict[str, Any]
"""`{"t": type, "b": bytes}` (opaque, from the agent's serde) or `{"v": primitive}` (inline in the jsonb)."""
WireWrite = list[Any]
"""A pending write as the read API answers it: `[task_id, channel, value, task_path, idx]`; in a DeltaChannel
history, `[task_id, channel, value]`."""


def _required(wire: Mapping[str, Any], field: str, answer: str) -> Any:
    try:
        return wire[field]
    except (KeyError, TypeError):
        raise ReadApiError(200, "bad_response", f"the read API's {answer} answer has no {field!r}") from None


def _thread_key(value: Any) -> bytes | None:
    """A get answer's thread key: 32 bytes (base64 in JSON), or none."""
    if value is None:
        return None
    if isinstance(value, str):
        value = base64.b64decode(value)
    if not isinstance(value, bytes) or len(value) != 32:
        raise ReadApiError(200, "bad_response", "the read API's get answer has a thread_key of no 32 bytes")
    return value


# -- /v1/checkpoints/get ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Holding:
    """What a get of a namespace's newest checkpoint answers beside it, for a client to hold the thread from
    the answer (`client/threads.py`)."""

    later_writes: dict[str, list[WireWrite]] | None
    """The pending writes of the namespace's checkpoints newer than the answer's, whose puts are still to
    come, by checkpoint id (None: too many to send; the client then does not hold the thread)."""
    blob_ceilings: dict[str, int] | None = None
    """Per channel, the counter of the namespace's highest blob version (its 32 zero-padded digits; 2^63 when
    it has none): no row holds a version with a counter above it (None: not known)."""
    namespaces: list[str] | None = None
    """Every namespace of the thread with a checkpoint or a pending write (None: too many to list, or not
    known); a client knows the others are empty."""

    FIELDS: ClassVar[tuple[str, ...]] = ("later_writes", "blob_ceilings", "namespaces")
    """Its fields on the wire, beside the get's own."""

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"later_writes": self.later_writes}
        if self.blob_ceilings is not None:
            wire["blob_ceilings"] = self.blob_ceilings
        if self.namespaces is not None:
            wire["namespaces"] = self.namespaces
        return wire

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Holding:
        return cls(wire.get("later_writes", {}), wire.get("blob_ceilings"), wire.get("namespaces"))


@dataclass(frozen=True, slots=True)
class Basis:
    """What the one-writer rule held of the thread as of a get (`graphledger.ownership`), for a writer that
    read it to say so with its writes."""

    operations: int
    """The thread's operation count."""
    lead: bytes | None = None
    """The namespace's lead (the checkpoint hash its last counted protected put carried); None: open."""
    lead_run: str | None = None
    """That put's metadata `run_id`, as `runs.delete` matches it (None: none)."""
    lead_id: str | None = None
    """That put's checkpoint id (None: open, or not told: the namespace's newest, which a lead is)."""
    lead_writer: bytes | None = None
    """The run that put it (`Intent.writer`; None: not told)."""

    def to_wire(self) -> dict[str, Any]:
        wire = {"operations": self.operations, "lead": self.lead, "lead_run": self.lead_run}
        if self.lead_id is not None:
            wire["lead_id"] = self.lead_id
        if self.lead_writer is not None:
            wire["lead_writer"] = self.lead_writer
        return wire

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Basis:
        operations = _required(wire, "operations", "get's basis")
        return cls(operations, wire.get("lead"), wire.get("lead_run"), wire.get("lead_id"), wire.get("lead_writer"))


@dataclass(frozen=True, slots=True)
class GetAnswer:
    """`POST /v1/checkpoints/get`: a checkpoint of a thread as the log held it when the read arrived."""

    log_partition: int
    """The thread's partition of the checkpoint topic."""
    log_end: int
    """The partition's end when the read arrived: the answer reflects every record of the thread below it."""
    tuple: WireTuple | None
    """The checkpoint; None when there is none, or when `current`."""
    own_writes_from: int | None = None
    """With `X-Graphledger-Own-Writes`: the offset of the thread's partition from which on the answer may lack
    the client's own records it named; the client adds those itself (None: it named none there)."""
    current: bool = False
    """With `X-Graphledger-Cached-Through`: no record of the thread but the named ones came since that offset,
    so the client's kept answer, with its own writes added, is the answer (`tuple` is None)."""
    erased: bool = False
    """The thread was erased: it has no checkpoint, and never will."""
    holding: Holding | None = None
    """A get of the newest checkpoint, neither `current` nor `erased`: what a client holds the thread with."""
    basis: Basis | None = None
    """A get of the newest checkpoint, not `current`: what the one-writer rule held of the thread as of the
    answer (None: not known, as from a server before the rule; its writes then carry no intent)."""
    thread_key: bytes | None = None
    """With `X-Graphledger-Thread-Key`: the thread's own data key (32 bytes), when the thread exists and the
    token may have its keys."""

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"log_partition": self.log_partition, "log_end": self.log_end}
        if self.own_writes_from is not None:
            wire["own_writes_from"] = self.own_writes_from
        wire["tuple"] = self.tuple
        if self.current:
            wire["current"] = True
        if self.erased:
            wire["erased"] = True
        if self.holding is not None:
            wire.update(self.holding.to_wire())
        if self.basis is not None:
            wire["basis"] = self.basis.to_wire()
        if self.thread_key is not None:
            wire["thread_key"] = self.thread_key
        return wire

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> GetAnswer:
        return cls(
            log_partition=_required(wire, "log_partition", "get"),
            log_end=_required(wire, "log_end", "get"),
            tuple=_required(wire, "tuple", "get"),
            own_writes_from=wire.get("own_writes_from"),
            current=bool(wire.get("current", False)),
            erased=bool(wire.get("erased", False)),
            holding=Holding.from_wire(wire) if any(field in wire for field in Holding.FIELDS) else None,
            basis=Basis.from_wire(wire["basis"]) if isinstance(wire.get("basis"), Mapping) else None,
            thread_key=_thread_key(wire.get("thread_key")),
        )


# -- /v1/checkpoints/list ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ListAnswer:
    """`POST /v1/checkpoints/list`: the checkpoints `alist` finds, newest first."""

    tuples: list[WireTuple]

    def to_wire(self) -> dict[str, Any]:
        return {"tuples": self.tuples}

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> ListAnswer:
        return cls(_required(wire, "tuples", "list"))


# -- /v1/checkpoints/verdicts ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RefusedWrite:
    """One of the caller's writes the one-writer rule refused, by its record's offset."""

    offset: int
    reason: str
    superseded_by: bytes | None = None


@dataclass(frozen=True, slots=True)
class VerdictsAnswer:
    """`POST /v1/checkpoints/verdicts`: which of the named records the projection refused; every other one
    it applied counts."""

    refused: list[RefusedWrite]

    def to_wire(self) -> dict[str, Any]:
        return {
            "refused": [
                {"offset": r.offset, "reason": r.reason, "superseded_by": r.superseded_by} for r in self.refused
            ]
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> VerdictsAnswer:
        try:
            refused = [
                RefusedWrite(
                    int(r["offset"]),
                    str(r["reason"]),
                    None if r.get("superseded_by") is None else bytes(r["superseded_by"]),
                )
                for r in _required(wire, "refused", "verdicts")
            ]
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ReadApiError(
                200, "bad_response", "the read API's verdicts answer has a malformed 'refused'"
            ) from None
        return cls(refused)


# -- /v1/checkpoints/delta-history ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChannelHistory:
    """One DeltaChannel's history: what `get_delta_channel_history` replays to rebuild its value."""

    writes: list[WireWrite]
    """`[task_id, channel, value]`, oldest first."""
    seed: WireValue | None = None
    """The value the replay starts from (None: it starts from an empty channel; absent on the wire)."""

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"writes": self.writes}
        if self.seed is not None:
            wire["seed"] = self.seed
        return wire

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> ChannelHistory:
        return cls(wire.get("writes", []), wire.get("seed"))


@dataclass(frozen=True, slots=True)
class DeltaHistoryAnswer:
    """`POST /v1/checkpoints/delta-history`: each asked channel's history, at the checkpoint asked for."""

    history: dict[str, ChannelHistory]

    def to_wire(self) -> dict[str, Any]:
        return {"history": {channel: entry.to_wire() for channel, entry in self.history.items()}}

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> DeltaHistoryAnswer:
        history = _required(wire, "history", "delta-history")
        return cls({channel: ChannelHistory.from_wire(entry) for channel, entry in history.items()})


# -- /v1/checkpoints/key-filter ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyFilterAnswer:
    """`POST /v1/checkpoints/key-filter`: one checkpoint partition's filter of record keys
    (`graphledger.log.key_filter`), read in one snapshot with the applied offset."""

    through: int
    """The projection's next offset on the partition."""
    complete: bool = False
    """Whether the filter holds every key below `through` (false for a partition applied before it existed)."""
    bits: int = 0
    """The filter's size in bits: its shape, which must be this version's."""
    hashes: int = 0
    """Bits set per key."""
    indexes: bytes = b""
    """The set words' indexes, packed little-endian uint32."""
    values: bytes = b""
    """The set words, packed little-endian uint64, in the order of `indexes`."""

    def to_wire(self) -> dict[str, Any]:
        return {
            "through": self.through,
            "complete": self.complete,
            "bits": self.bits,
            "hashes": self.hashes,
            "indexes": self.indexes,
            "values": self.values,
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> KeyFilterAnswer:
        return cls(
            _required(wire, "through", "key-filter"),
            bool(wire.get("complete", False)),
            wire.get("bits", 0),
            wire.get("hashes", 0),
            wire.get("indexes", b""),
            wire.get("values", b""),
        )


# -- /v1/store/batch --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ItemAnswer:
    """A store item, as a get answers it."""

    namespace: list[str]
    key: str
    value: dict[str, Any]
    created_at: str
    """ISO 8601 with offset."""
    updated_at: str
    """ISO 8601 with offset."""
    expires_at: str | None = None
    """ISO 8601 with offset; None for an item without a TTL (the client refreshes only TTL items)."""

    def to_wire(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "key": self.key,
            "value": self.value,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "expires_at": self.expires_at,
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> ItemAnswer:
        return cls(**_item_fields(wire))


@dataclass(frozen=True, slots=True)
class SearchItemAnswer(ItemAnswer):
    """A store item, as a search answers it."""

    score: float | None = None
    """Similarity to the query vector (the best over the item's vectors); None without a query, or for an
    item without vectors."""

    def to_wire(self) -> dict[str, Any]:
        return {**ItemAnswer.to_wire(self), "score": self.score}

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> SearchItemAnswer:
        return cls(**_item_fields(wire), score=wire.get("score"))


def _item_fields(wire: Mapping[str, Any]) -> dict[str, Any]:
    names = ("namespace", "key", "value", "created_at", "updated_at")
    return {**{name: _required(wire, name, "store item") for name in names}, "expires_at": wire.get("expires_at")}


StoreResult = ItemAnswer | list[SearchItemAnswer] | list[list[str]] | None
"""One op's result: a get's item (None: none), a search's items, a listing's namespaces."""


@dataclass(frozen=True, slots=True)
class StoreBatchAnswer:
    """`POST /v1/store/batch`: one result per op, in op order."""

    results: list[StoreResult]

    def to_wire(self) -> dict[str, Any]:
        return {"results": [_result_wire(result) for result in self.results]}

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any], kinds: Sequence[str]) -> StoreBatchAnswer:
        """The answer to ops of `kinds` (`get`, `search`, `list_namespaces`), which the wire does not name."""
        results = wire.get("results") if isinstance(wire, Mapping) else None
        if not isinstance(results, list) or len(results) != len(kinds):
            got = len(results) if isinstance(results, list) else type(results).__name__
            raise ReadApiError(200, "bad_response", f"/v1/store/batch answered {got} results for {len(kinds)} ops")
        return cls([_result(kind, raw) for kind, raw in zip(kinds, results, strict=True)])


def _result_wire(result: StoreResult) -> Any:
    if result is None or isinstance(result, ItemAnswer):
        return None if result is None else result.to_wire()
    return [entry.to_wire() if isinstance(entry, ItemAnswer) else entry for entry in result]


def _result(kind: str, raw: Any) -> StoreResult:
    if kind == "get":
        return None if raw is None else ItemAnswer.from_wire(raw)
    if kind == "search":
        return [SearchItemAnswer.from_wire(item) for item in raw]
    return [list(labels) for labels in raw]
