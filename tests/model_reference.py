"""The reference of the model-based test: what a checkpointer's reads must answer, written from the
documented semantics rather than from graphledger's code.

`ReferenceSaver` is LangGraph's `InMemorySaver` for what it implements (put, put_writes, get_tuple, list,
delete_thread), with `copy_thread`, `prune` and `delete_for_runs` as `BaseCheckpointSaver` and the
`langgraph-checkpoint-conformance` suite define them, and erasure as dropping the subject for good.
graphledger's projection is the official `PostgresSaver`'s layout and contract (docs/architecture.md),
so where `InMemorySaver` and `PostgresSaver` differ, the reference follows `PostgresSaver` (3.2.0, the
version installed); each such place is marked "Postgres:". `tests/integration/test_model_reference_vs_postgres.py`
checks the reference against the official saver on random operation sequences, and
`tests/unit/test_model_reference.py` runs the conformance suite against it.

One writer per thread (docs/architecture.md, "One writer per thread") is graphledger's own rule, not
LangGraph's: `OneWriterRule` is written here again from that text, apart from `graphledger.ownership`,
and decides the writes of LangGraph runs (those that carry an intent); every other write counts as the
official saver counts it.

Not modelled (the generator never produces them): DeltaChannel values and their metadata, checkpoints
before format 4 (whose reads add their parent's pending sends), values Postgres jsonb cannot hold
(NUL, integers past 64 bits, floats jsonb reads back as integers).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.memory import InMemorySaver

from graphledger.ownership import Intent

PRUNE_STRATEGIES = ("keep_latest", "delete")


def jsonb(value: Any) -> Any:
    """`value` as a Postgres jsonb column gives it back: JSON types only (tuples become lists), object
    keys in jsonb's storage order (shorter keys first, keys of one length by their UTF-8 bytes)."""
    return _jsonb_order(json.loads(json.dumps(value)))


def _jsonb_order(value: Any) -> Any:
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        return {k: _jsonb_order(value[k]) for k in keys}
    if isinstance(value, list):
        return [_jsonb_order(v) for v in value]
    return value


def jsonb_contains(container: Any, contained: Any) -> bool:
    """Postgres `container @> contained` for jsonb values (metadata filters of `list`)."""
    if isinstance(contained, dict):
        return isinstance(container, dict) and all(
            k in container and jsonb_contains(container[k], v) for k, v in contained.items()
        )
    if isinstance(contained, list):
        return isinstance(container, list) and all(any(jsonb_contains(c, v) for c in container) for v in contained)
    if isinstance(container, dict | list):
        return False
    if isinstance(contained, bool) or isinstance(container, bool):
        return type(contained) is type(container) and contained == container
    return container == contained


def _json_text(value: Any) -> str | None:
    """Postgres `->>`: a JSON string as its text, any other value as its JSON text, null as NULL."""
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value)


def _inline(value: Any) -> bool:
    """Postgres: the channel values `PostgresSaver.put` keeps in the checkpoint's jsonb, not in a blob."""
    return value is None or isinstance(value, str | int | float | bool)


@dataclass(frozen=True, slots=True)
class Lead:
    """A namespace's last counted put of a LangGraph run."""

    checkpoint: bytes
    """The hash its intent named it by."""
    checkpoint_id: str
    run_id: str | None
    writer: bytes


@dataclass
class OneWriterRule:
    """The rule's state of one thread: its operation count and each namespace's lead (missing: open)."""

    operations: int = 0
    leads: dict[str, Lead] = field(default_factory=dict)

    def copy(self) -> OneWriterRule:
        return OneWriterRule(self.operations, dict(self.leads))

    def put(self, ns: str, checkpoint_id: str, run_id: str | None, intent: Intent | None) -> bool:
        """Whether a put counts, the state moved past it."""
        lead = self.leads.get(ns)
        if intent is None:  # a write outside any run: it counts, and changes what every run read
            self.leads.pop(ns, None)
            self.operations += 1
            return True
        if lead is not None and lead.checkpoint == intent.checkpoint:
            return True  # the same put again
        if intent.operations != self.operations or (lead is not None and lead.checkpoint != intent.expects):
            return False
        self.leads[ns] = Lead(intent.checkpoint, checkpoint_id, run_id, intent.writer)
        return True

    def writes(self, ns: str, checkpoint_id: str, intent: Intent | None) -> bool:
        lead = self.leads.get(ns)
        if intent is None:
            return True
        current = intent.operations == self.operations
        if lead is None:
            return current
        if lead.checkpoint in (intent.checkpoint, intent.expects):
            return True
        if intent.writer and lead.writer == intent.writer:
            return True  # its own run put the lead after these writes were sent
        return current and checkpoint_id > lead.checkpoint_id  # ahead of their put

    def operation(self) -> None:
        """Delete, prune `delete`, a copy landing on the thread, erasure."""
        self.operations += 1
        self.leads.clear()

    def runs_deleted(self, run_ids: set[str]) -> None:
        hit = [ns for ns, lead in self.leads.items() if lead.run_id is not None and lead.run_id in run_ids]
        if hit:
            for ns in hit:
                del self.leads[ns]
            self.operations += 1


class ReferenceSaver(InMemorySaver):
    """`InMemorySaver` with the official Postgres saver's rules where the two differ, plus copy_thread,
    prune, delete_for_runs and erasure. Synchronous and in memory; `snapshot()` copies the state."""

    def __init__(self) -> None:
        super().__init__()
        self.erased: set[str] = set()
        """Erased threads: they read as nothing for ever, and nothing written to them counts."""
        self.rules: dict[str, OneWriterRule] = defaultdict(OneWriterRule)
        self.refused: set[Any] = set()
        """The `at` of every write the one-writer rule refused."""

    # -- writes --------------------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
        intent: bytes | None = None,
        at: Any = None,
    ) -> RunnableConfig:
        """`intent`: the run's, for a LangGraph run's put; `at`: the put's place, noted when refused."""
        conf = config["configurable"]
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns", "")
        result: RunnableConfig = {
            "configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}
        }
        if thread_id in self.erased:
            return result
        run_id = _json_text(get_serializable_checkpoint_metadata(config, metadata).get("run_id"))
        if not self.rules[thread_id].put(ns, checkpoint["id"], run_id, _intent(intent)):
            self.refused.add(at)
            newest = max(self.storage[thread_id][ns], default=None)
            if newest is None or checkpoint["id"] > newest:  # its writes, sent before it, go with it
                self.writes.pop((thread_id, ns, checkpoint["id"]), None)
            return result
        values = checkpoint["channel_values"]
        # Postgres: primitive values stay inline in the checkpoint's jsonb (read back whatever its
        # versions say); other values of channels in `new_versions` become blobs, and a blob
        # `(channel, version)` keeps its first value (ON CONFLICT DO NOTHING). InMemorySaver makes a
        # blob of every new version (an `empty` one for a channel without a value) and overwrites.
        inline = {k: v for k, v in values.items() if _inline(v)}
        blob_versions = {k: v for k, v in new_versions.items() if k in values and not _inline(values[k])}
        first_blobs = {
            key: self.blobs[key] for k, v in blob_versions.items() if (key := (thread_id, ns, k, v)) in self.blobs
        }
        existing = self.storage[thread_id][ns].get(checkpoint["id"])
        super().put(
            {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": conf.get("checkpoint_id")}},
            {**checkpoint, "channel_values": {k: values[k] for k in blob_versions}},
            metadata,
            blob_versions,
        )
        self.blobs.update(first_blobs)
        # Postgres: checkpoint and metadata are jsonb (metadata less its `writes`); a repeated put
        # replaces both and keeps the first put's parent (the upsert sets only those two columns).
        # InMemorySaver replaces the parent too.
        parent = existing[2] if existing is not None else conf.get("checkpoint_id")
        self.storage[thread_id][ns][checkpoint["id"]] = (
            self.serde.dumps_typed(jsonb({**checkpoint, "channel_values": inline})),
            self.serde.dumps_typed(jsonb(get_serializable_checkpoint_metadata(config, metadata))),
            parent,
        )
        return result

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
        intent: bytes | None = None,
        at: Any = None,
    ) -> None:
        conf = config["configurable"]
        thread_id = conf["thread_id"]
        if thread_id in self.erased:
            return
        if not self.rules[thread_id].writes(conf.get("checkpoint_ns", ""), conf["checkpoint_id"], _intent(intent)):
            self.refused.add(at)
            return
        # Postgres: a batch of special writes only (errors, interrupts, ...) upserts, replacing channel
        # and value and keeping the row's task_path; any other batch inserts, never replacing (special
        # writes in it included). InMemorySaver replaces every special write, with its task_path.
        upsert = all(channel in WRITES_IDX_MAP for channel, _ in writes)
        stored = self.writes[(thread_id, conf.get("checkpoint_ns", ""), conf["checkpoint_id"])]
        for idx, (channel, value) in enumerate(writes):
            key = (task_id, WRITES_IDX_MAP.get(channel, idx))
            held = stored.get(key)
            if held is None:
                stored[key] = (task_id, channel, self.serde.dumps_typed(value), task_path)
            elif upsert:
                stored[key] = (task_id, channel, self.serde.dumps_typed(value), held[3])

    def delete_thread(self, thread_id: str) -> None:
        super().delete_thread(thread_id)
        self.rules[thread_id].operation()

    def copied_onto(self, thread_id: str) -> None:
        """A copy's barrier landed on the thread: an operation, whatever it copied."""
        self.rules[thread_id].operation()

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Every checkpoint, blob and write of the source under the target id (`BaseCheckpointSaver`:
        "Copy all checkpoints and writes from one thread to another"; the conformance suite: every
        namespace, ids, metadata, values and writes as they are, the source unchanged). Neither says
        what happens to rows the target already has: here the target keeps them (a source row with
        the same key is not copied), as graphledger's projection does."""
        source, target = source_thread_id, target_thread_id
        if source == target or target in self.erased or source in self.erased:
            return
        for ns, checkpoints in list(self.storage.get(source, {}).items()):
            copied = self.storage[target][ns]
            for checkpoint_id, row in checkpoints.items():
                copied.setdefault(checkpoint_id, row)
        for (thread_id, ns, channel, version), blob in list(self.blobs.items()):
            if thread_id == source:
                self.blobs.setdefault((target, ns, channel, version), blob)
        for (thread_id, ns, checkpoint_id), writes in list(self.writes.items()):
            if thread_id == source:
                copied_writes = self.writes[(target, ns, checkpoint_id)]
                for key, write in writes.items():
                    copied_writes.setdefault(key, write)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`BaseCheckpointSaver.prune`: "keep_latest" retains only the most recent checkpoint per
        namespace (with its writes, per the conformance suite), "delete" removes all checkpoints.
        Postgres (`_keep_latest`): a kept checkpoint whose parent goes gets a null parent; writes of
        checkpoints not put yet stay; blobs no kept checkpoint references go; a subgraph call's
        namespace (a ':' in it) goes whole when the root checkpoint its head started from
        (`metadata.parents[""]`) is saved and not kept."""
        if isinstance(thread_ids, str):
            raise TypeError("thread_ids must be a sequence of thread IDs, not a str")
        if strategy not in PRUNE_STRATEGIES:
            raise ValueError(f"Unknown prune strategy: {strategy!r}")
        for thread_id in dict.fromkeys(thread_ids):
            if strategy == "delete":
                self.delete_thread(thread_id)
            else:
                self._keep_latest(thread_id)

    def _keep_latest(self, thread_id: str) -> None:
        namespaces = {ns: cps for ns, cps in self.storage.get(thread_id, {}).items() if cps}
        heads = {ns: max(checkpoints) for ns, checkpoints in namespaces.items()}
        root_checkpoints = namespaces.get("", {})
        calls = set()
        for ns, head in heads.items():
            parents = self._metadata(namespaces[ns][head]).get("parents")
            root = _json_text(parents.get("")) if isinstance(parents, dict) else None
            if ":" in ns and root is not None and root in root_checkpoints and root != heads.get(""):
                calls.add(ns)
        for ns in calls:
            self._drop_namespace(thread_id, ns)
        for ns, head in heads.items():
            if ns in calls:
                continue
            checkpoints = namespaces[ns]
            freed = set()
            for checkpoint_id in [c for c in checkpoints if c != head]:
                freed |= self._versions(checkpoints.pop(checkpoint_id))
                self.writes.pop((thread_id, ns, checkpoint_id), None)
            checkpoint, metadata, parent = checkpoints[head]
            if parent is not None and parent != head:
                checkpoints[head] = (checkpoint, metadata, None)
            self._collect_blobs(thread_id, ns, freed)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """`BaseCheckpointSaver.delete_for_runs`: "Delete all checkpoints and writes associated with the
        given run IDs" (the checkpoints whose metadata `run_id` is one of them, in every thread and
        namespace, per the conformance suite), freeing blobs as prune does."""
        if isinstance(run_ids, str):
            raise TypeError("run_ids must be a sequence of run IDs, not a str")
        runs = set(run_ids)
        for rule in self.rules.values():
            rule.runs_deleted(runs)
        for thread_id, namespaces in self.storage.items():
            for ns, checkpoints in namespaces.items():
                freed = set()
                for checkpoint_id, row in list(checkpoints.items()):
                    if _json_text(self._metadata(row).get("run_id")) in runs:
                        freed |= self._versions(checkpoints.pop(checkpoint_id))
                        self.writes.pop((thread_id, ns, checkpoint_id), None)
                self._collect_blobs(thread_id, ns, freed)

    def erase(self, thread_id: str) -> None:
        """Erasure drops the subject: the thread reads as nothing from now on, whatever is written."""
        self.delete_thread(thread_id)
        self.erased.add(thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.copy_thread(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self.prune(thread_ids, strategy=strategy)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.delete_for_runs(run_ids)

    # -- reads ---------------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        if config["configurable"]["thread_id"] in self.erased:
            return None
        found = super().get_tuple(config)
        return None if found is None else self._as_postgres(found)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        # Postgres: newest first by checkpoint id over every namespace listed (InMemorySaver lists one
        # namespace after the other); the filter is jsonb containment (InMemorySaver compares each
        # key's value with ==); `before` compares ids as InMemorySaver does.
        tuples = [self._as_postgres(t) for t in super().list(config, before=before)]
        tuples = [t for t in tuples if t.config["configurable"]["thread_id"] not in self.erased]
        if filter:
            wanted = jsonb(filter)
            tuples = [t for t in tuples if jsonb_contains(t.metadata, wanted)]
        tuples.sort(key=lambda t: t.config["configurable"]["checkpoint_id"], reverse=True)
        yield from tuples if limit is None else tuples[:limit]

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        for found in self.list(config, filter=filter, before=before, limit=limit):
            yield found

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """InMemorySaver's walk: from the checkpoint's parent up its ancestors, collecting the channels'
        writes, each channel until an ancestor stores a value for it in a blob. Postgres: a value
        stored inline (a primitive, not null) ends a channel's walk too, and ancestors are looked for
        only among older ids. The script never puts a parent newer than its child, and never a
        primitive into a channel that is walked (a `BinaryOperatorAggregate`'s, `messages`): this
        raises if an inline value would end a walk, rather than answer unlike Postgres."""
        if not channels:
            return {}
        conf = config["configurable"]
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns", "")
        if thread_id in self.erased:
            return {channel: {"writes": []} for channel in channels}
        history = dict(super().get_delta_channel_history(config=config, channels=channels))
        checkpoints = self.storage.get(thread_id, {}).get(ns, {})
        target = get_checkpoint_id(config) or max(checkpoints, default="")
        current = checkpoints[target][2] if target in checkpoints else None
        remaining = set(channels)
        while current is not None and current in checkpoints and remaining:
            row = checkpoints[current]
            checkpoint = self.serde.loads_typed(row[0])
            versions, inline = checkpoint.get("channel_versions") or {}, checkpoint.get("channel_values") or {}
            for channel in list(remaining):
                if channel not in versions:
                    continue
                blob = self.blobs.get((thread_id, ns, channel, versions[channel]))
                if blob is not None and blob[0] != "empty":
                    remaining.discard(channel)
                elif inline.get(channel) is not None:
                    raise NotImplementedError(f"channel {channel!r}: an inline seed (not generated by the script)")
            current = row[2]
        return history

    def _as_postgres(self, found: CheckpointTuple) -> CheckpointTuple:
        """InMemorySaver's tuple as PostgresSaver reads the same rows: the checkpoint as its jsonb with
        the blobs of its versions over its inline values, and configs built from the row (InMemorySaver
        hands back the caller's config for a get by id)."""
        conf = found.config["configurable"]
        thread_id, ns, checkpoint_id = conf["thread_id"], conf.get("checkpoint_ns", ""), get_checkpoint_id(found.config)
        stored, _, parent = self.storage[thread_id][ns][checkpoint_id]
        checkpoint = self.serde.loads_typed(stored)
        checkpoint["channel_values"] = {**checkpoint["channel_values"], **found.checkpoint["channel_values"]}
        return CheckpointTuple(
            config={"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}},
            checkpoint=checkpoint,
            metadata=found.metadata,
            parent_config=(
                {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": parent}}
                if parent
                else None
            ),
            pending_writes=found.pending_writes,
        )

    # -- helpers -------------------------------------------------------------------------------

    def snapshot(self) -> ReferenceSaver:
        """A copy whose changes leave this one as it is (rows are immutable tuples, shared)."""
        copy = ReferenceSaver()
        for thread_id, namespaces in self.storage.items():
            for ns, checkpoints in namespaces.items():
                copy.storage[thread_id][ns] = dict(checkpoints)
        copy.writes.update((key, dict(writes)) for key, writes in self.writes.items())
        copy.blobs.update(self.blobs)
        copy.erased = set(self.erased)
        copy.rules.update((thread_id, rule.copy()) for thread_id, rule in self.rules.items())
        copy.refused = set(self.refused)
        return copy

    def rows_of(self, thread_id: str, other: ReferenceSaver) -> None:
        """Take `other`'s rows of `thread_id` as they are (to copy from a thread another state holds)."""
        self.storage.pop(thread_id, None)
        for ns, checkpoints in other.storage.get(thread_id, {}).items():
            self.storage[thread_id][ns] = dict(checkpoints)
        self.writes.update((k, dict(w)) for k, w in other.writes.items() if k[0] == thread_id)
        self.blobs.update((k, b) for k, b in other.blobs.items() if k[0] == thread_id)
        if thread_id in other.erased:
            self.erased.add(thread_id)

    def _metadata(self, row: tuple[Any, Any, Any]) -> dict[str, Any]:
        return self.serde.loads_typed(row[1])

    def _versions(self, row: tuple[Any, Any, Any]) -> set[tuple[str, str]]:
        versions = self.serde.loads_typed(row[0]).get("channel_versions") or {}
        return {(channel, _json_text(version) or "") for channel, version in versions.items()}

    def _collect_blobs(self, thread_id: str, ns: str, freed: set[tuple[str, str]]) -> None:
        """Drop the blobs of `freed` versions no remaining checkpoint of the namespace references."""
        if not freed:
            return
        referenced = set()
        for row in self.storage[thread_id][ns].values():
            referenced |= self._versions(row)
        for channel, version in freed - referenced:
            self.blobs.pop((thread_id, ns, channel, version), None)

    def _drop_namespace(self, thread_id: str, ns: str) -> None:
        self.storage[thread_id].pop(ns, None)
        for key in [k for k in self.writes if k[0] == thread_id and k[1] == ns]:
            del self.writes[key]
        for key in [k for k in self.blobs if k[0] == thread_id and k[1] == ns]:
            del self.blobs[key]


def _intent(raw: bytes | None) -> Intent | None:
    return None if raw is None else Intent.parse(raw)
