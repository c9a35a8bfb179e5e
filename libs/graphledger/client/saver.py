"""`KafkaSaver`: a LangGraph checkpointer whose writes are Kafka events and whose reads go to the read API.

Writes are encoded exactly as `langgraph-checkpoint-postgres` stores them (primitive channel values
inline in the checkpoint jsonb, the rest as `(type, bytes)` blobs from this saver's serde), so the
projection is the official layout. Each write returns once Kafka acknowledged it. Every read reflects
every write acknowledged to any process before it began: a get of a thread this process holds is
answered from what it holds when the log shows no other writer's record since (`thread_reads.py`,
`threads.py`), else by the read API, which finds the other records in the log; so a process continuing
its own thread needs neither the projector nor Postgres.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

from graphledger.answers import ListAnswer
from graphledger.client import ownership
from graphledger.client.runtime import ClientLifecycle, ClientRuntime
from graphledger.client.values import (
    decode_delta_history,
    decode_tuple,
    dump_checkpoint_json,
    dump_json,
    require_id,
    require_key_fits,
    split_channel_values,
)
from graphledger.errors import InvalidInputError
from graphledger.events.checkpoint import (
    PRUNE_STRATEGIES,
    Blob,
    CheckpointEvent,
    CheckpointPut,
    CheckpointWrites,
    RunsDelete,
    ThreadCopy,
    ThreadDelete,
    ThreadPrune,
    Write,
)
from graphledger.settings import Settings

log = logging.getLogger(__name__)


class KafkaSaver(ClientLifecycle, BaseCheckpointSaver[str]):
    """Checkpointer for `graph.compile(checkpointer=...)`, sync and async, through graphledger.

    Use it as a context manager (`with KafkaSaver.from_env() as saver:` or `async with`), or call
    `close()` when done; it starts its Kafka producer on first use.
    """

    def __init__(self, settings: Settings | None = None, *, serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde)
        self.settings = settings or Settings()
        self._runtime = ClientRuntime(self.settings, name="graphledger-saver")

    @classmethod
    def from_env(cls, *, serde: SerializerProtocol | None = None) -> KafkaSaver:
        """A saver configured from `GRAPHLEDGER_*` environment variables."""
        return cls(Settings(), serde=serde)

    # -- writes: build the event in the caller's thread, publish on the runtime's loop ----------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        event = self._checkpoint_put(config, checkpoint, metadata, new_versions)
        self._runtime.publish(self.settings.checkpoint_topic, event, config)
        return _config(event.thread_id, event.checkpoint_ns, event.checkpoint_id)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        event = self._checkpoint_put(config, checkpoint, metadata, new_versions)
        await self._runtime.apublish(self.settings.checkpoint_topic, event, config)
        return _config(event.thread_id, event.checkpoint_ns, event.checkpoint_id)

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        self._runtime.publish(
            self.settings.checkpoint_topic, self._checkpoint_writes(config, writes, task_id, task_path), config
        )

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        event = self._checkpoint_writes(config, writes, task_id, task_path)
        await self._runtime.apublish(self.settings.checkpoint_topic, event, config)

    def delete_thread(self, thread_id: str) -> None:
        self._runtime.publish(self.settings.checkpoint_topic, ThreadDelete(require_id(thread_id, "thread_id")))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._runtime.apublish(self.settings.checkpoint_topic, ThreadDelete(require_id(thread_id, "thread_id")))

    # -- erasure (docs/security.md) ---------------------------------------------------------------

    def erase_thread(self, thread_id: str) -> None:
        """Erase the thread for good: its data key is destroyed, so no copy of its events in the log can
        be read again, and every projection drops its rows (and those of threads copied from it). The
        thread id cannot be written again."""
        self._runtime.erase({"thread_id": require_id(thread_id, "thread_id")})

    async def aerase_thread(self, thread_id: str) -> None:
        await self._runtime.aerase({"thread_id": require_id(thread_id, "thread_id")})

    def erase_tenant(self) -> None:
        """Erase everything of this client's tenant (its token's), threads and store items alike."""
        self._runtime.erase({"tenant": True})

    async def aerase_tenant(self) -> None:
        await self._runtime.aerase({"tenant": True})

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._runtime.publish_copy(self.settings.checkpoint_topic, _thread_copy(source_thread_id, target_thread_id))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._runtime.apublish_copy(
            self.settings.checkpoint_topic, _thread_copy(source_thread_id, target_thread_id)
        )

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        for event in _prunes(thread_ids, strategy):
            self._runtime.publish(self.settings.checkpoint_topic, event)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        for event in _prunes(thread_ids, strategy):
            await self._runtime.apublish(self.settings.checkpoint_topic, event)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        if event := _runs_delete(run_ids):
            self._runtime.broadcast(self.settings.checkpoint_topic, event)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        if event := _runs_delete(run_ids):
            await self._runtime.abroadcast(self.settings.checkpoint_topic, event)

    # -- reads: one read API call each, with the consistency token --------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        answer, run = self._runtime.call(self._get(config))
        ownership.enter(run)  # in the caller's context: the run's loop calls get_next_version in it
        return decode_tuple(answer, self.serde)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        answer, run = await self._runtime.acall(self._get(config))
        ownership.enter(run)
        return decode_tuple(answer, self.serde)

    async def _get(self, config: RunnableConfig) -> tuple[Any, ownership.Run | None]:
        """The get's answer (wire form), and the run whose read it was (its mark set: `client/ownership.py`).
        A run that reads an older checkpoint travels back in time: it branches from that checkpoint, and its
        writes expect the namespace's head, which it reads too."""
        body = _get_body(config)
        thread_id, checkpoint_ns = body["thread_id"], body["checkpoint_ns"]
        reads = self._runtime.thread_reads
        assert reads is not None, "runtime not started"
        answered = await reads.get(thread_id, checkpoint_ns, body["checkpoint_id"])
        if body["checkpoint_id"] is None:
            return answered.answer, self._runtime.marked_read(config, thread_id, checkpoint_ns, answered)
        return answered.answer, await self._read_head(config, thread_id, checkpoint_ns)

    async def _read_head(self, config: RunnableConfig, thread_id: str, checkpoint_ns: str) -> ownership.Run | None:
        """For a run that read the namespace otherwise than by its newest checkpoint (an older one, or a list:
        a subgraph's replay), the namespace's head its writes expect, read now, and the run."""
        reads = self._runtime.thread_reads
        if reads is None or not self._runtime.protects(config):
            return None
        if (run := self._runtime.marks.run_marked(config, thread_id, checkpoint_ns)) is not None:
            return run
        head = await reads.get(thread_id, checkpoint_ns, None)
        return self._runtime.marked_read(config, thread_id, checkpoint_ns, head)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        body = _list_body(config, filter, before, limit)
        answer = ListAnswer.from_wire(self._runtime.read("/v1/checkpoints/list", body))
        if config is not None and self._runtime.protects(config):
            ownership.enter(self._runtime.call(self._listed(config, body)))
        for raw in answer.tuples:
            yield decode_tuple(raw, self.serde)  # type: ignore[misc]  # a listed tuple is never None

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        body = _list_body(config, filter, before, limit)
        answer = ListAnswer.from_wire(await self._runtime.aread("/v1/checkpoints/list", body))
        if config is not None and self._runtime.protects(config):
            ownership.enter(await self._runtime.acall(self._listed(config, body)))
        for raw in answer.tuples:
            yield decode_tuple(raw, self.serde)  # type: ignore[misc]  # a listed tuple is never None

    async def _listed(self, config: RunnableConfig, body: dict[str, Any]) -> ownership.Run | None:
        """A run listed a namespace (LangGraph's replay of a subgraph finds its checkpoint so): its mark."""
        return await self._read_head(config, body["thread_id"], body.get("checkpoint_ns", ""))

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        if not channels:
            return {}
        return decode_delta_history(self._runtime.call(self._history(config, channels)), self.serde)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        if not channels:
            return {}
        return decode_delta_history(await self._runtime.acall(self._history(config, channels)), self.serde)

    async def _history(self, config: RunnableConfig, channels: Sequence[str]) -> Any:
        body = _get_body(config)
        reads = self._runtime.thread_reads
        assert reads is not None, "runtime not started"
        return await reads.history(body["thread_id"], body["checkpoint_ns"], body["checkpoint_id"], list(channels))

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Same version format as PostgresSaver: zero-padded counter plus a random tiebreak. LangGraph calls it
        every superstep, in the run's own context: a run one of whose writes was refused stops here."""
        ownership.raise_if_refused()
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    # -- event builders ------------------------------------------------------------------------

    def _checkpoint_put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> CheckpointPut:
        configurable = config["configurable"]
        thread_id = require_id(configurable.get("thread_id"), "thread_id")
        checkpoint_ns = _namespace(configurable.get("checkpoint_ns"))
        parent_id = configurable.get("checkpoint_id")
        # An encrypting serde must see every value; PostgresSaver would store primitives in plain text.
        encrypted = isinstance(self.serde, EncryptedSerializer)
        inline, blob_values = split_channel_values(checkpoint["channel_values"], inline_primitives=not encrypted)
        blobs = tuple(
            Blob(channel, str(version), *self._dump(blob_values[channel], f"channel {channel!r}"))
            for channel, version in new_versions.items()
            if channel in blob_values
        )
        checkpoint_id = require_id(checkpoint["id"], "checkpoint id")
        require_key_fits("thread_id, checkpoint_ns and checkpoint id", thread_id, checkpoint_ns, checkpoint_id)
        for blob in blobs:
            require_key_fits(
                f"thread_id, checkpoint_ns and channel {blob.channel!r}",
                thread_id,
                checkpoint_ns,
                blob.channel,
                blob.version,
            )
        return CheckpointPut(
            thread_id=thread_id,
            checkpoint_ns=checkpoint_ns,
            checkpoint_id=checkpoint_id,
            parent_checkpoint_id=require_id(parent_id, "parent checkpoint_id") if parent_id else None,
            checkpoint_json=dump_checkpoint_json({**checkpoint, "channel_values": inline}),
            metadata_json=dump_json(get_serializable_checkpoint_metadata(config, metadata), "checkpoint metadata"),
            blobs=blobs,
            new_channels=tuple(new_versions),
        )

    def _dump(self, value: Any, what: str) -> tuple[str, bytes]:
        try:
            return self.serde.dumps_typed(value)
        except (TypeError, ValueError, OverflowError) as exc:  # e.g. an int past 64 bits for msgpack
            raise InvalidInputError(f"the saver's serde cannot serialize the {what}: {exc}") from exc

    def _checkpoint_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
    ) -> CheckpointWrites:
        configurable = config["configurable"]
        key = (
            require_id(configurable.get("thread_id"), "thread_id"),
            _namespace(configurable.get("checkpoint_ns")),
            require_id(configurable.get("checkpoint_id"), "checkpoint_id"),
            require_id(task_id, "task_id", allow_empty=True),
        )
        require_key_fits("thread_id, checkpoint_ns, checkpoint_id and task_id", *key)
        return CheckpointWrites(
            thread_id=key[0],
            checkpoint_ns=key[1],
            checkpoint_id=key[2],
            task_id=key[3],
            task_path=require_id(task_path, "task_path", allow_empty=True),
            # Like PostgresSaver: special writes (errors, interrupts) replace, regular ones never do.
            upsert=all(channel in WRITES_IDX_MAP for channel, _ in writes),
            writes=tuple(
                Write(WRITES_IDX_MAP.get(channel, idx), channel, *self._dump(value, f"write to {channel!r}"))
                for idx, (channel, value) in enumerate(writes)
            ),
        )


def _config(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id}}


def _namespace(value: Any) -> str:
    return "" if value is None else require_id(value, "checkpoint_ns", allow_empty=True)


def _thread_copy(source: str, target: str) -> ThreadCopy:
    return ThreadCopy(require_id(source, "source_thread_id"), require_id(target, "target_thread_id"))


def _prunes(thread_ids: Sequence[str], strategy: str) -> list[CheckpointEvent]:
    if isinstance(thread_ids, str):
        raise TypeError("thread_ids must be a sequence of thread IDs, not a str")
    if strategy not in PRUNE_STRATEGIES:
        raise ValueError(f"Unknown prune strategy: {strategy!r}")
    # One event per thread, keyed by it, so each prune keeps its place among the thread's writes.
    return [ThreadPrune(require_id(t, "thread_id"), strategy) for t in dict.fromkeys(thread_ids)]


def _runs_delete(run_ids: Sequence[str]) -> RunsDelete | None:
    if isinstance(run_ids, str):
        raise TypeError("run_ids must be a sequence of run IDs, not a str")
    ids = tuple(dict.fromkeys(require_id(r, "run_id") for r in run_ids))
    return RunsDelete(ids) if ids else None


def _get_body(config: RunnableConfig) -> dict[str, Any]:
    configurable = config["configurable"]
    return {
        "thread_id": require_id(configurable.get("thread_id"), "thread_id"),
        "checkpoint_ns": _namespace(configurable.get("checkpoint_ns")),
        "checkpoint_id": get_checkpoint_id(config),
    }


def _list_body(
    config: RunnableConfig | None, filter: dict[str, Any] | None, before: RunnableConfig | None, limit: int | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"filter": filter or None, "limit": limit}
    if config:
        configurable = config["configurable"]
        body["thread_id"] = require_id(configurable.get("thread_id"), "thread_id")
        if (ns := configurable.get("checkpoint_ns")) is not None:
            body["checkpoint_ns"] = _namespace(ns)
        body["checkpoint_id"] = get_checkpoint_id(config)
    if before is not None:
        body["before_checkpoint_id"] = get_checkpoint_id(before)
    if filter is not None and not isinstance(filter, dict):
        raise InvalidInputError(f"filter must be a dict, not {type(filter).__name__}")
    return body
