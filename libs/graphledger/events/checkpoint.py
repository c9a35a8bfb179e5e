"""Checkpoint-topic events: what a `KafkaSaver` call publishes and the projector applies.

Values stay opaque: blobs and writes are `(type, bytes)` made by the agent's serde. The checkpoint and
its metadata travel as JSON text exactly as `langgraph-checkpoint-postgres` stores them (jsonb), so
the projector passes them to Postgres without decoding them. Each payload follows its event's fields
(`codec.py`).

Every event but `RunsDelete` is keyed by its thread id, so one thread's events keep their order on one
partition. `RunsDelete` names no thread: it is published to every partition and each partition's
copy applies to the threads that partition carries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from graphledger.events.codec import EPOCH_MS, Choice, EventPayload, Integer, Text, payload_codec, wire
from graphledger.events.erasure import TenantErase, ThreadErase
from graphledger.quick_init import quick_init

NAMED = Text(nonempty=True)
"""A thread or checkpoint id: never empty."""
CELL = Text(nul_apart=False)
"""A channel name, version or type in a row of blobs or writes."""


@quick_init
@dataclass(frozen=True, slots=True)
class Blob:
    """One channel value at one version, as `checkpoint_blobs` stores it (`type` "empty" has no data)."""

    channel: str = field(metadata=wire(kind=CELL))
    version: str = field(metadata=wire(kind=CELL))
    type: str = field(metadata=wire(kind=CELL))
    data: bytes | None = field(metadata=wire(label="value"))


@quick_init
@dataclass(frozen=True, slots=True)
class Write:
    """One pending write of a task, as `checkpoint_writes` stores it."""

    idx: int
    channel: str = field(metadata=wire(kind=CELL))
    type: str = field(metadata=wire(kind=CELL))
    data: bytes = field(metadata=wire(label="value"))


@payload_codec
@quick_init
@dataclass(frozen=True, slots=True)
class CheckpointPut(EventPayload):
    """`put`: a checkpoint row and the blobs of the channels whose version changed."""

    TYPE: ClassVar[str] = "checkpoint.put"
    thread_id: str = field(metadata=wire(kind=NAMED))
    checkpoint_ns: str
    checkpoint_id: str = field(metadata=wire(kind=NAMED))
    parent_checkpoint_id: str | None
    checkpoint_json: bytes = field(metadata=wire("checkpoint"))
    """The checkpoint with only inline (primitive) channel values, as JSON text."""
    metadata_json: bytes = field(metadata=wire("metadata"))
    """`get_serializable_checkpoint_metadata(config, metadata)` as JSON text."""
    blobs: tuple[Blob, ...]
    new_channels: tuple[str, ...] | None = field(default=None, metadata=wire(omitted=True))
    """The channels whose version this put made (LangGraph's `new_versions`): a version of another
    channel names a blob an earlier put stored. None in events written before it was recorded."""
    intent: bytes | None = field(default=None, metadata=wire(omitted=True))
    """What its writer read (`graphledger.ownership.Intent`, as its `gl-intent` header carries it): None for
    a put its writer made without reading the thread, which counts whatever came before (invariant 10)."""

    @property
    def key(self) -> str:
        return self.thread_id


@payload_codec
@quick_init
@dataclass(frozen=True, slots=True)
class CheckpointWrites(EventPayload):
    """`put_writes`: one task's writes against a checkpoint.

    `upsert` follows PostgresSaver: writes whose channels are all special (`WRITES_IDX_MAP`: errors,
    interrupts, resumes) replace earlier ones; regular writes never overwrite.
    """

    TYPE: ClassVar[str] = "checkpoint.writes"
    thread_id: str = field(metadata=wire(kind=NAMED))
    checkpoint_ns: str
    checkpoint_id: str = field(metadata=wire(kind=NAMED))
    task_id: str
    task_path: str
    upsert: bool
    writes: tuple[Write, ...]
    intent: bytes | None = field(default=None, metadata=wire(omitted=True))
    """What its writer read (`graphledger.ownership.Intent`), as on a put; None: they count as they come."""

    @property
    def key(self) -> str:
        return self.thread_id


@payload_codec
@dataclass(frozen=True, slots=True)
class ThreadDelete(EventPayload):
    """`delete_thread`: every checkpoint, blob and write of the thread, in every namespace."""

    TYPE: ClassVar[str] = "thread.delete"
    thread_id: str = field(metadata=wire(kind=NAMED))

    @property
    def key(self) -> str:
        return self.thread_id


@payload_codec
@dataclass(frozen=True, slots=True)
class ThreadCopy(EventPayload):
    """`copy_thread`: the source's whole history (checkpoints, blobs, writes) under the target id.

    Keyed by the source, so the copy sees every write made to the source before it.
    """

    TYPE: ClassVar[str] = "thread.copy"
    source_thread_id: str = field(metadata=wire(kind=NAMED))
    target_thread_id: str = field(metadata=wire(kind=NAMED))
    at_record: bool = field(default=False, metadata=wire(omitted=True))
    """Written before version 3 (`STAGED_COPIES_VERSION`): the copy lands at its record, on the source's
    partition, as it did then; from version 3 on it lands at its `thread.copy.barrier`."""

    @property
    def key(self) -> str:
        return self.source_thread_id


@payload_codec
@dataclass(frozen=True, slots=True)
class ThreadCopyBarrier(EventPayload):
    """After a `thread.copy`: the target's events after this one apply only once the copy has.

    The copy travels keyed by its source, so it copies the source as of its place in the source's log,
    which is another partition than the target's. This event, keyed by the target and published once
    the copy was acknowledged, holds the target's partition at its place until the projection has
    applied the copy's record (`source_partition`, `source_offset`): a read of the target that finds
    it among the target's unprojected records waits for the copy, and a rebuild applies the target's
    later events after the copy, as the live projection did.
    """

    TYPE: ClassVar[str] = "thread.copy.barrier"
    target_thread_id: str = field(metadata=wire(kind=NAMED))
    source_partition: int = field(metadata=wire(kind=Integer(0, 2**31 - 1)))
    source_offset: int = field(metadata=wire(kind=Integer(0, 2**63 - 1)))
    """The offset of the copy's (last) record on the source's partition."""

    @property
    def key(self) -> str:
        return self.target_thread_id


PRUNE_STRATEGIES = ("keep_latest", "delete")
MAX_KEEP = 2**31 - 1


@payload_codec
@dataclass(frozen=True, slots=True)
class ThreadPrune(EventPayload):
    """`prune` of one thread: `keep_latest` keeps each namespace's newest `keep` checkpoints (and, for
    a thread with DeltaChannels, the ancestors back to the snapshot each one's state is rebuilt from);
    `delete` drops all. `prune()` publishes `keep` 1; the sweeper's keep-last-N retention publishes N.
    """

    TYPE: ClassVar[str] = "thread.prune"
    thread_id: str = field(metadata=wire(kind=NAMED))
    strategy: str = field(metadata=wire(kind=Choice(PRUNE_STRATEGIES, "prune strategy")))
    keep: int = field(default=1, metadata=wire(label="prune keep", kind=Integer(1, MAX_KEEP), omitted=True))

    @property
    def key(self) -> str:
        return self.thread_id


@payload_codec
@dataclass(frozen=True, slots=True)
class ThreadExpire(EventPayload):
    """The sweeper's thread TTL, conditional: it deletes the thread (as `delete_thread`) only if the
    thread's last activity is still at or before `idle_before_ms` when the event applies, so a write
    that landed after the sweeper's decision keeps the thread.
    """

    TYPE: ClassVar[str] = "thread.expire"
    thread_id: str = field(metadata=wire(kind=NAMED))
    idle_before_ms: int = field(metadata=wire(kind=EPOCH_MS))
    """The cutoff (ms since the epoch): now minus the thread TTL, at the sweeper's decision."""

    @property
    def key(self) -> str:
        return self.thread_id


@payload_codec
@dataclass(frozen=True, slots=True)
class RunsDelete(EventPayload):
    """`delete_for_runs`: checkpoints whose metadata `run_id` is listed, with their writes.

    Published once to every partition; each copy applies to the threads of its own partition.
    """

    TYPE: ClassVar[str] = "runs.delete"
    run_ids: tuple[str, ...]

    @property
    def key(self) -> None:
        return None


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

ThreadEvent = (
    CheckpointPut | CheckpointWrites | ThreadDelete | ThreadCopy | ThreadCopyBarrier | ThreadPrune | ThreadExpire
)
"""The events that are one thread's records: keyed by it (`key`), so they keep their order on its partition."""

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
