"""Checkpoint-topic events: what a `KafkaSaver` call publishes and the projector applies.

Values stay opaque: blobs and writes are `(type, bytes)` made by the agent's serde. The checkpoint and
its metadata travel as JSON text exactly as `langgraph-checkpoint-postgres` stores them (jsonb), so
the projector passes them to Postgres without decoding them.

Every event but `RunsDelete` is keyed by its thread id, so one thread's events keep their order on one
partition. `RunsDelete` names no thread: it is published to every partition and each partition's
copy applies to the threads that partition carries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from graphledger.errors import InvalidEventError
from graphledger.events.envelope import MAX_EPOCH_MS
from graphledger.events.erasure import TenantErase, ThreadErase


@dataclass(frozen=True, slots=True)
class Blob:
    """One channel value at one version, as `checkpoint_blobs` stores it (`type` "empty" has no data)."""

    channel: str
    version: str
    type: str
    data: bytes | None


@dataclass(frozen=True, slots=True)
class Write:
    """One pending write of a task, as `checkpoint_writes` stores it."""

    idx: int
    channel: str
    type: str
    data: bytes


@dataclass(frozen=True, slots=True)
class CheckpointPut:
    """`put`: a checkpoint row and the blobs of the channels whose version changed."""

    TYPE: ClassVar[str] = "checkpoint.put"
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    checkpoint_json: bytes
    """The checkpoint with only inline (primitive) channel values, as JSON text."""
    metadata_json: bytes
    """`get_serializable_checkpoint_metadata(config, metadata)` as JSON text."""
    blobs: tuple[Blob, ...]

    @property
    def key(self) -> str:
        return self.thread_id

    def to_payload(self) -> dict[str, Any]:
        return {
            "thread_id": self.thread_id,
            "checkpoint_ns": self.checkpoint_ns,
            "checkpoint_id": self.checkpoint_id,
            "parent_checkpoint_id": self.parent_checkpoint_id,
            "checkpoint": self.checkpoint_json,
            "metadata": self.metadata_json,
            "blobs": [[b.channel, b.version, b.type, b.data] for b in self.blobs],
        }

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> CheckpointPut:
        blobs = tuple(
            Blob(_str(b, 0, "blob channel"), _str(b, 1, "blob version"), _str(b, 2, "blob type"), _opt_bytes(b, 3))
            for b in _list(p, "blobs", row_len=4)
        )
        return cls(
            _field_str(p, "thread_id", nonempty=True),
            _field_str(p, "checkpoint_ns"),
            _field_str(p, "checkpoint_id", nonempty=True),
            _field_opt_str(p, "parent_checkpoint_id"),
            _field_bytes(p, "checkpoint"),
            _field_bytes(p, "metadata"),
            blobs,
        )


@dataclass(frozen=True, slots=True)
class CheckpointWrites:
    """`put_writes`: one task's writes against a checkpoint.

    `upsert` follows PostgresSaver: writes whose channels are all special (`WRITES_IDX_MAP`: errors,
    interrupts, resumes) replace earlier ones; regular writes never overwrite.
    """

    TYPE: ClassVar[str] = "checkpoint.writes"
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    task_id: str
    task_path: str
    upsert: bool
    writes: tuple[Write, ...]

    @property
    def key(self) -> str:
        return self.thread_id

    def to_payload(self) -> dict[str, Any]:
        return {
            "thread_id": self.thread_id,
            "checkpoint_ns": self.checkpoint_ns,
            "checkpoint_id": self.checkpoint_id,
            "task_id": self.task_id,
            "task_path": self.task_path,
            "upsert": self.upsert,
            "writes": [[w.idx, w.channel, w.type, w.data] for w in self.writes],
        }

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> CheckpointWrites:
        writes = []
        for w in _list(p, "writes", row_len=4):
            if not isinstance(w[0], int) or isinstance(w[0], bool):
                raise InvalidEventError(f"write idx {w[0]!r} is not an integer")
            writes.append(Write(w[0], _str(w, 1, "write channel"), _str(w, 2, "write type"), _bytes(w, 3)))
        upsert = p.get("upsert")
        if not isinstance(upsert, bool):
            raise InvalidEventError(f"upsert {upsert!r} is not a bool")
        return cls(
            _field_str(p, "thread_id", nonempty=True),
            _field_str(p, "checkpoint_ns"),
            _field_str(p, "checkpoint_id", nonempty=True),
            _field_str(p, "task_id"),
            _field_str(p, "task_path"),
            upsert,
            tuple(writes),
        )


@dataclass(frozen=True, slots=True)
class ThreadDelete:
    """`delete_thread`: every checkpoint, blob and write of the thread, in every namespace."""

    TYPE: ClassVar[str] = "thread.delete"
    thread_id: str

    @property
    def key(self) -> str:
        return self.thread_id

    def to_payload(self) -> dict[str, Any]:
        return {"thread_id": self.thread_id}

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> ThreadDelete:
        return cls(_field_str(p, "thread_id", nonempty=True))


@dataclass(frozen=True, slots=True)
class ThreadCopy:
    """`copy_thread`: the source's whole history (checkpoints, blobs, writes) under the target id.

    Keyed by the source, so the copy sees every write made to the source before it.
    """

    TYPE: ClassVar[str] = "thread.copy"
    source_thread_id: str
    target_thread_id: str

    @property
    def key(self) -> str:
        return self.source_thread_id

    def to_payload(self) -> dict[str, Any]:
        return {"source_thread_id": self.source_thread_id, "target_thread_id": self.target_thread_id}

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> ThreadCopy:
        return cls(_field_str(p, "source_thread_id", nonempty=True), _field_str(p, "target_thread_id", nonempty=True))


@dataclass(frozen=True, slots=True)
class ThreadCopyBarrier:
    """After a `thread.copy`: the target's events after this one apply only once the copy has.

    The copy travels keyed by its source, so it copies the source as of its place in the source's log,
    which is another partition than the target's. This event, keyed by the target and published once
    the copy was acknowledged, holds the target's partition at its place until the projection has
    applied the copy's record (`source_partition`, `source_offset`): a read of the target that finds
    it among the target's unprojected records waits for the copy, and a rebuild applies the target's
    later events after the copy, as the live projection did.
    """

    TYPE: ClassVar[str] = "thread.copy.barrier"
    target_thread_id: str
    source_partition: int
    source_offset: int
    """The offset of the copy's (last) record on the source's partition."""

    @property
    def key(self) -> str:
        return self.target_thread_id

    def to_payload(self) -> dict[str, Any]:
        return {
            "target_thread_id": self.target_thread_id,
            "source_partition": self.source_partition,
            "source_offset": self.source_offset,
        }

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> ThreadCopyBarrier:
        return cls(
            _field_str(p, "target_thread_id", nonempty=True),
            _field_position(p, "source_partition", 2**31 - 1),
            _field_position(p, "source_offset", 2**63 - 1),
        )


PRUNE_STRATEGIES = ("keep_latest", "delete")
MAX_KEEP = 2**31 - 1


@dataclass(frozen=True, slots=True)
class ThreadPrune:
    """`prune` of one thread: `keep_latest` keeps each namespace's newest `keep` checkpoints (and, for
    a thread with DeltaChannels, the ancestors back to the snapshot each one's state is rebuilt from);
    `delete` drops all. `prune()` publishes `keep` 1; the sweeper's keep-last-N retention publishes N.
    """

    TYPE: ClassVar[str] = "thread.prune"
    thread_id: str
    strategy: str
    keep: int = 1

    @property
    def key(self) -> str:
        return self.thread_id

    def to_payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {"thread_id": self.thread_id, "strategy": self.strategy}
        if self.keep != 1:
            payload["keep"] = self.keep
        return payload

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> ThreadPrune:
        strategy = _field_str(p, "strategy")
        if strategy not in PRUNE_STRATEGIES:
            raise InvalidEventError(f"prune strategy {strategy!r} is not one of {PRUNE_STRATEGIES}")
        keep = p.get("keep", 1)
        if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= MAX_KEEP:
            raise InvalidEventError(f"prune keep {keep!r} is not an integer from 1 to {MAX_KEEP}")
        return cls(_field_str(p, "thread_id", nonempty=True), strategy, keep)


@dataclass(frozen=True, slots=True)
class ThreadExpire:
    """The sweeper's thread TTL, conditional: it deletes the thread (as `delete_thread`) only if the
    thread's last activity is still at or before `idle_before_ms` when the event applies, so a write
    that landed after the sweeper's decision keeps the thread.
    """

    TYPE: ClassVar[str] = "thread.expire"
    thread_id: str
    idle_before_ms: int
    """The cutoff (ms since the epoch): now minus the thread TTL, at the sweeper's decision."""

    @property
    def key(self) -> str:
        return self.thread_id

    def to_payload(self) -> dict[str, Any]:
        return {"thread_id": self.thread_id, "idle_before_ms": self.idle_before_ms}

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> ThreadExpire:
        cutoff = p.get("idle_before_ms")
        if isinstance(cutoff, bool) or not isinstance(cutoff, int) or not 0 <= cutoff <= MAX_EPOCH_MS:
            raise InvalidEventError(f"idle_before_ms {cutoff!r} is not a time in ms between 1970 and 9999")
        return cls(_field_str(p, "thread_id", nonempty=True), cutoff)


@dataclass(frozen=True, slots=True)
class RunsDelete:
    """`delete_for_runs`: checkpoints whose metadata `run_id` is listed, with their writes.

    Published once to every partition; each copy applies to the threads of its own partition.
    """

    TYPE: ClassVar[str] = "runs.delete"
    run_ids: tuple[str, ...]

    @property
    def key(self) -> None:
        return None

    def to_payload(self) -> dict[str, Any]:
        return {"run_ids": list(self.run_ids)}

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> RunsDelete:
        run_ids = p.get("run_ids")
        if not isinstance(run_ids, list) or not all(isinstance(r, str) for r in run_ids):
            raise InvalidEventError(f"run_ids {run_ids!r} is not a list of strings")
        return cls(tuple(run_ids))


CheckpointEvent = (
    CheckpointPut
    | CheckpointWrites
    | ThreadDelete
    | ThreadCopy
    | ThreadCopyBarrier
    | ThreadPrune
    | ThreadExpire
    | RunsDelete
    | ThreadErase
    | TenantErase
)

CHECKPOINT_EVENT_TYPES: dict[str, type[CheckpointEvent]] = {
    cls.TYPE: cls
    for cls in (
        CheckpointPut,
        CheckpointWrites,
        ThreadDelete,
        ThreadCopy,
        ThreadCopyBarrier,
        ThreadPrune,
        ThreadExpire,
        RunsDelete,
        ThreadErase,
        TenantErase,
    )
}


# -- validation helpers: each names the field and the bad value ------------------------------------


def _field_str(p: dict[str, Any], name: str, *, nonempty: bool = False) -> str:
    value = p.get(name)
    if not isinstance(value, str) or (nonempty and not value):
        raise InvalidEventError(f"{name} {value!r} is not a{' non-empty' if nonempty else ''} string")
    if "\x00" in value:
        raise InvalidEventError(f"{name} {value!r} contains a NUL character")
    return value


def _field_position(p: dict[str, Any], name: str, most: int) -> int:
    value = p.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise InvalidEventError(f"{name} {value!r} is not an integer from 0 to {most}")
    return value


def _field_opt_str(p: dict[str, Any], name: str) -> str | None:
    return None if p.get(name) is None else _field_str(p, name)


def _field_bytes(p: dict[str, Any], name: str) -> bytes:
    value = p.get(name)
    if not isinstance(value, bytes):
        raise InvalidEventError(f"{name} is a {type(value).__name__}, not bytes")
    return value


def _list(p: dict[str, Any], name: str, *, row_len: int) -> list[list[Any]]:
    rows = p.get(name)
    if not isinstance(rows, list):
        raise InvalidEventError(f"{name} is a {type(rows).__name__}, not a list")
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != row_len:
            # The row's shape, never its content: rows hold channel values, which reach logs via the reason.
            shape = f"a list of {len(row)}" if isinstance(row, list) else f"a {type(row).__name__}"
            raise InvalidEventError(f"{name} row {i} is {shape}, not a list of {row_len}")
    return rows


def _str(row: list[Any], i: int, what: str) -> str:
    if not isinstance(row[i], str) or "\x00" in row[i]:
        raise InvalidEventError(f"{what} {row[i]!r} is not a string without NUL")
    return row[i]


def _bytes(row: list[Any], i: int) -> bytes:
    if not isinstance(row[i], bytes):
        raise InvalidEventError(f"value is a {type(row[i]).__name__}, not bytes")
    return row[i]


def _opt_bytes(row: list[Any], i: int) -> bytes | None:
    return None if row[i] is None else _bytes(row, i)
