"""Rules the model-based test checks (`test_model_based.py`), each reduced to a few operations on the dev
stack: what the writer (or any reader) answers against what the reference (`model_reference.py`, the
official saver's rules) and the projection answer. A rule that needs a race forces it: threads picked
on the partitions it needs (`thread_partitions.py`), the projector frozen or held at one event.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest

from graphledger import KafkaSaver
from graphledger.errors import GraphledgerError
from graphledger.events.checkpoint import ThreadCopyBarrier
from graphledger.settings import Settings
from graphledger_server.devstack.stack import DevStack
from model_reference import ReferenceSaver
from polling import wait_for
from thread_partitions import threads_on_partition

pytestmark = pytest.mark.slow

PADDING = 3000
"""Records put ahead on one partition so that the projector applies another partition first."""
COPY_SLACK = 16
"""Records another writer may put on the source's partition between its last put and the copy."""


def _checkpoint(cid: str, values: dict[str, Any] | None = None, versions: dict[str, str] | None = None) -> Any:
    values = values or {}
    return {"v": 4, "id": cid, "ts": "2026-01-01T00:00:00+00:00", "channel_values": values,
            "channel_versions": dict.fromkeys(values, "1") if versions is None else versions,
            "versions_seen": {}, "updated_channels": None}  # fmt: skip


def _config(thread: str, parent: str | None = None, ns: str = "") -> Any:
    configurable = {"thread_id": thread, "checkpoint_ns": ns}
    if parent is not None:
        configurable["checkpoint_id"] = parent
    return {"configurable": configurable}


def _thread() -> str:
    return f"f-{uuid.uuid4().hex[:8]}"


async def _projection(stack: DevStack, config: Any) -> Any:
    """What a process with nothing of its own reads (it waits for the projection)."""
    async with KafkaSaver(stack.settings) as reader:
        return await reader.aget_tuple(config)


async def _ids(saver: Any, config: Any) -> list[str]:
    return [t.config["configurable"]["checkpoint_id"] async for t in saver.alist(config)]


def _positions(saver: KafkaSaver) -> list[tuple[int, int]]:
    """The partition and offset of each event the saver publishes from now on."""
    seen: list[tuple[int, int]] = []
    publish = saver._runtime.publisher.publish

    async def publishing(*args: Any, **kwargs: Any) -> Any:
        positions = await publish(*args, **kwargs)
        seen.append(positions[-1][1:])
        return positions

    saver._runtime.publisher.publish = publishing  # type: ignore[method-assign]
    return seen


# -- the client's fold (libs/graphledger/folds/thread.py) -----------------------------------------


async def test_after_its_keep_latest_prune_the_writer_reads_no_parent(stack: DevStack) -> None:
    thread, reference = _thread(), ReferenceSaver()
    async with KafkaSaver(stack.settings) as writer:
        for saver in (writer, reference):
            await saver.aput(_config(thread), _checkpoint("1"), {}, {})
            await saver.aput(_config(thread, "1"), _checkpoint("2"), {}, {})
        await writer.aget_tuple(_config(thread))
        for saver in (writer, reference):
            await saver.aprune([thread])
        mine = await writer.aget_tuple(_config(thread))  # a prune keep_latest is waited for (not held)
        assert (await reference.aget_tuple(_config(thread))).parent_config is None
        assert (await _projection(stack, _config(thread))).parent_config is None
        assert mine.parent_config is None  # it reads checkpoint 1 as the parent


async def test_writes_ahead_of_their_checkpoint_survive_a_keep_latest_prune(stack: DevStack) -> None:
    thread, reference = _thread(), ReferenceSaver()
    async with KafkaSaver(stack.settings) as writer:
        for saver in (writer, reference):
            await saver.aput(_config(thread), _checkpoint("1"), {}, {})
            await saver.aput_writes(_config(thread, "2"), [("x", 1)], "task")
        await writer.aget_tuple(_config(thread))
        for saver in (writer, reference):
            await saver.aprune([thread])
            await saver.aput(_config(thread, "1"), _checkpoint("2"), {}, {})
        mine = await writer.aget_tuple(_config(thread))  # a prune keep_latest is waited for (not held)
        expected = [("task", "x", 1)]
        assert (await reference.aget_tuple(_config(thread))).pending_writes == expected
        assert (await _projection(stack, _config(thread))).pending_writes == expected
        assert mine.pending_writes == expected  # it reads []


async def test_keep_latest_drops_a_subgraph_call_whose_root_it_prunes(stack: DevStack) -> None:
    thread, reference = _thread(), ReferenceSaver()
    call = _config(thread, ns="call:1")
    async with KafkaSaver(stack.settings) as writer:
        for saver in (writer, reference):
            await saver.aput(_config(thread), _checkpoint("1"), {}, {})
            await saver.aput(call, _checkpoint("2"), {"parents": {"": "1"}}, {})  # a call started from 1
            await saver.aput(_config(thread, "1"), _checkpoint("3"), {}, {})
            await saver.aget_tuple(call)
            await saver.aprune([thread])
        assert await reference.aget_tuple(call) is None
        assert await _projection(stack, call) is None
        assert await writer.aget_tuple(call) is None  # it reads checkpoint 2


async def test_a_put_naming_an_older_checkpoints_version_reads_its_blob(stack: DevStack) -> None:
    thread, reference = _thread(), ReferenceSaver()
    async with KafkaSaver(stack.settings) as writer, KafkaSaver(stack.settings) as other:
        for first, second in ((writer, other), (reference, reference)):
            await first.aput(_config(thread), _checkpoint("1", {"xs": [1]}, {"xs": "a"}), {}, {"xs": "a"})
            await second.aput(_config(thread, "1"), _checkpoint("2", {}, {"xs": "b"}), {}, {})
        await writer.aget_tuple(_config(thread))  # the projection has both puts; the writer holds the thread
        for saver in (writer, reference):
            # xs at version a again: not the parent's (b) and not newer (LangGraph's versions only grow): the
            # writer does not hold its value (checkpoint 1's blob row), so its read waits for the projection
            await saver.aput(_config(thread, "2"), _checkpoint("3", {}, {"xs": "a"}), {}, {})
        mine = await writer.aget_tuple(_config(thread))
        expected = {"xs": [1]}
        assert (await reference.aget_tuple(_config(thread))).checkpoint["channel_values"] == expected
        assert (await _projection(stack, _config(thread))).checkpoint["channel_values"] == expected
        assert mine.checkpoint["channel_values"] == expected  # it reads {}


async def test_a_put_after_another_processes_writes_to_it_reads_them(stack: DevStack) -> None:
    thread, reference = _thread(), ReferenceSaver()
    async with KafkaSaver(stack.settings) as writer, KafkaSaver(stack.settings) as other:
        for first, second in ((writer, other), (reference, reference)):
            await first.aput(_config(thread), _checkpoint("1"), {}, {})
            await second.aput_writes(_config(thread, "2"), [("x", 1)], "task")  # ahead of checkpoint 2's put
            await first.aget_tuple(_config(thread))  # answered by the read API: checkpoint 1
            await first.aput(_config(thread, "1"), _checkpoint("2"), {}, {})
        expected = [("task", "x", 1)]
        assert (await reference.aget_tuple(_config(thread))).pending_writes == expected
        assert (await _projection(stack, _config(thread))).pending_writes == expected
        assert (await writer.aget_tuple(_config(thread))).pending_writes == expected  # it reads []


async def test_a_put_in_a_namespace_that_held_only_writes_reads_them(stack: DevStack) -> None:
    thread, reference = _thread(), ReferenceSaver()
    call = _config(thread, ns="call:1")
    async with KafkaSaver(stack.settings) as writer, KafkaSaver(stack.settings) as other:
        for first, second in ((writer, other), (reference, reference)):
            await first.aput(_config(thread), _checkpoint("1"), {}, {})
            await second.aput_writes(_config(thread, "2", ns="call:1"), [("x", 1)], "task")  # a namespace of writes
            await first.aget_tuple(_config(thread))  # answered by the read API, with the thread's namespaces
            await first.aput(call, _checkpoint("2"), {}, {})
        expected = [("task", "x", 1)]
        assert (await reference.aget_tuple(call)).pending_writes == expected
        assert (await _projection(stack, call)).pending_writes == expected
        assert (await writer.aget_tuple(call)).pending_writes == expected  # it read []


async def test_a_put_in_a_namespace_a_copy_brought_only_writes_to_reads_them(stack: DevStack) -> None:
    source, target, reference = _thread(), _thread(), ReferenceSaver()
    call = _config(target, ns="call:1")
    async with KafkaSaver(stack.settings) as writer, KafkaSaver(stack.settings) as other:
        for first, second in ((writer, other), (reference, reference)):
            await first.aput(_config(target), _checkpoint("1"), {}, {})
            await second.aput_writes(_config(source, "2", ns="call:1"), [("x", 1)], "task")
            await second.acopy_thread(source, target)
            await first.aget_tuple(_config(target))  # answered by the read API, with the thread's namespaces
            await first.aput(call, _checkpoint("2"), {}, {})
        expected = [("task", "x", 1)]
        assert (await reference.aget_tuple(call)).pending_writes == expected
        assert (await _projection(stack, call)).pending_writes == expected
        assert (await writer.aget_tuple(call)).pending_writes == expected  # it read []


async def test_a_put_holding_inline_a_version_a_copy_brought_reads_the_copied_blob(stack: DevStack) -> None:
    source, target, reference = _thread(), _thread(), ReferenceSaver()
    copied = f"{5:032}.0.5"  # LangGraph's form: newer than any version the target's checkpoint 1 names
    async with KafkaSaver(stack.settings) as writer, KafkaSaver(stack.settings) as other:
        for first, second in ((writer, other), (reference, reference)):
            await second.aput(_config(source), _checkpoint("1", {"xs": [1]}, {"xs": copied}), {}, {"xs": copied})
            await first.aput(_config(target), _checkpoint("1"), {}, {})
            await second.acopy_thread(source, target)
            await first.aget_tuple(_config(target))  # answered by the read API, after the copy
            # xs inline at the copied version, not called new (as code that calls the saver itself may):
            # the official saver reads the copied blob row over the inline value.
            held_inline = _checkpoint("2", {"xs": "inline"}, {"xs": copied})
            await first.aput(_config(target, "1"), held_inline, {}, {})
        expected = {"xs": [1]}
        assert (await reference.aget_tuple(_config(target))).checkpoint["channel_values"] == expected
        assert (await _projection(stack, _config(target))).checkpoint["channel_values"] == expected
        assert (await writer.aget_tuple(_config(target))).checkpoint["channel_values"] == expected  # it read "inline"


# -- the projection (services/graphledger_server/projection) ------------------------------------


async def test_a_copy_follows_the_targets_prune_acknowledged_before_it(stack: DevStack) -> None:
    """The projector applies the copy's record before the target's prune, every time: a barrier on the
    target's partition ahead of the prune holds that partition until the source's has passed the copy.
    The source and the target are on different partitions, so that the projector may reach either first.

    The barrier is published ahead of its copy, which no writer does (parking.py: a barrier naming a
    position beyond the log parks its subject), so the projector is frozen until the log holds it."""
    topic = stack.settings.checkpoint_topic
    reference = ReferenceSaver()
    async with KafkaSaver(stack.settings) as writer:
        (source,) = await threads_on_partition(writer, 0, label="source")
        (target,) = await threads_on_partition(writer, 1, label="target")
        positions = _positions(writer)
        for saver in (writer, reference):
            await saver.aput(_config(source), _checkpoint("1"), {}, {})
            await saver.aput(_config(source, "1"), _checkpoint("2"), {}, {})
            await saver.aput(_config(target), _checkpoint("3"), {}, {})
        (source_partition, last), (target_partition, _) = positions[1], positions[2]
        assert (source_partition, target_partition) == (0, 1), positions
        past_copy = last + 1 + COPY_SLACK  # the copy lands at last + 1 unless other writers came between
        with stack.projector_frozen():
            await writer._runtime.apublish(topic, ThreadCopyBarrier(target, source_partition, past_copy))
            for saver in (writer, reference):
                await saver.aprune([target])
            for saver in (writer, reference):
                await saver.acopy_thread(source, target)
            copy = positions[-2]
            assert copy[0] == source_partition
            assert copy[1] < past_copy, f"{copy[1] - last - 1} records of other writers came before the copy"
            i = 0
            while positions[-1][0] != source_partition or positions[-1][1] < past_copy:
                await writer.aput_writes(_config(source, "2"), [("x", i)], f"t{i}")  # after the copy: not copied
                i += 1
    async with KafkaSaver(stack.settings) as reader:
        assert await _ids(reader, _config(target)) == await _ids(reference, _config(target)) == ["3", "2", "1"]


async def test_delete_for_runs_reaches_a_copied_thread_at_its_own_partition(stack: DevStack) -> None:
    reference = ReferenceSaver()
    run = f"run-{uuid.uuid4().hex[:8]}"
    async with KafkaSaver(stack.settings) as writer:
        (source,) = await threads_on_partition(writer, 0, label="source")
        (target,) = await threads_on_partition(writer, 1, label="target")
        positions = _positions(writer)
        for saver in (writer, reference):
            await saver.aput(_config(source), _checkpoint("1"), {"run_id": run}, {})
            await saver.aput(_config(target), _checkpoint("0"), {"run_id": "another"}, {})
            await saver.acopy_thread(source, target)
        assert (positions[0][0], positions[1][0]) == (0, 1), positions
        await _projection(stack, _config(target))  # the copy applied
        with stack.projector_frozen():
            # Records ahead on the source's partition: the projector reaches its runs.delete last.
            await asyncio.gather(
                *(writer.aput_writes(_config(source, "1"), [("x", i)], f"t{i}") for i in range(PADDING))
            )
            for saver in (writer, reference):
                await saver.adelete_for_runs([run])
    async with KafkaSaver(stack.settings) as reader:
        assert await _ids(reader, _config(target)) == await _ids(reference, _config(target)) == ["0"]


async def test_erasing_a_thread_again_spares_threads_copied_from_it_after_its_erasure(stack: DevStack) -> None:
    source, target = _thread(), _thread()
    async with KafkaSaver(stack.settings) as eraser, KafkaSaver(stack.settings) as other:
        await eraser.aput(_config(source), _checkpoint("1"), {}, {})
        await eraser.aerase_thread(source)
        await other.acopy_thread(source, target)  # the other process does not know: the copy copies nothing
        await other.aput(_config(target), _checkpoint("2"), {}, {})
        await eraser.aerase_thread(source)  # again, as a retry after erasure_incomplete does
    # The same lineage row makes an erase erase a copy made while it runs, when the copy's record lands
    # after the erasure's and applies before the erase looks the copies up (the model test's seed 878292367).
    found = await _projection(stack, _config(target))
    assert found is not None and found.config["configurable"]["checkpoint_id"] == "2"  # the target was erased


@pytest.fixture(scope="module")
def short_deadline_stack() -> Iterator[DevStack]:
    """A stack whose read API waits 2 s for the projection (an erase too)."""
    with DevStack(partitions=4, base=Settings(consistency_timeout_s=2.0)) as dev:
        yield dev


async def _applied(stack: DevStack, partition: int) -> int:
    """The projection's next offset on the checkpoint topic's partition."""
    settings = stack.settings
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        found = await conn.fetchval(
            f"SELECT next_offset FROM {settings.postgres_schema}.graphledger_offsets "
            "WHERE consumer_group = $1 AND topic = $2 AND partition = $3",
            settings.projector_group_id,
            settings.checkpoint_topic,
            partition,
        )
        return found or 0
    finally:
        await conn.close()


async def _until_past(stack: DevStack, partition: int, offset: int) -> None:
    """Wait until the projection has applied the checkpoint topic's `partition` past `offset`."""

    async def past() -> bool:
        return await _applied(stack, partition) > offset

    await wait_for(past, f"the projection past offset {offset} of partition {partition}")


async def test_an_erase_asked_again_after_erasure_incomplete_erases_copies_of_copies(
    short_deadline_stack: DevStack,
) -> None:
    """An erase whose copy's erasure the projector does not apply within the read API's deadline fails,
    naming the copy (`erasure_incomplete`); asked again once the projector applied it, it erases the copy's
    own copies too. The projector is held at exactly the copy's erasure: the test holds a lock on the
    copy's checkpoint rows, which that erasure deletes and nothing before it touches."""
    stack = short_deadline_stack
    settings = stack.settings
    source, copy, copy_of_copy = _thread(), _thread(), _thread()
    async with KafkaSaver(settings) as writer:
        await writer.aput(_config(source), _checkpoint("1"), {}, {})
        await writer.acopy_thread(source, copy)
        await writer.acopy_thread(copy, copy_of_copy)  # it holds the source's checkpoint too
    conn = await asyncpg.connect(settings.postgres_dsn)

    async def projected(thread: str) -> bool:
        rows = f"SELECT count(*) FROM {settings.postgres_schema}.checkpoints WHERE thread_id = $1"
        return await conn.fetchval(rows, thread) > 0

    async def copy_erased() -> bool:
        return not await projected(copy)

    try:
        for thread in (copy, copy_of_copy):
            await wait_for(functools.partial(projected, thread), f"the copy {thread} projected")
        async with KafkaSaver(settings) as eraser:
            async with conn.transaction():
                held = await conn.fetch(
                    f"SELECT 1 FROM {settings.postgres_schema}.checkpoints WHERE thread_id = $1 FOR UPDATE", copy
                )
                assert held
                # The source's erasure applies; the eraser then erases the copy, whose erasure the
                # projector cannot apply while the rows are held: erasure_incomplete after 2 s.
                with pytest.raises(GraphledgerError, match=r"erasure_incomplete|erase it again") as raised:
                    await eraser.aerase_thread(source)
                assert copy in str(raised.value)
            await wait_for(copy_erased, f"the erasure of the copy {copy} applied")
            await eraser.aerase_thread(source)  # asked again, as the error says
    finally:
        await conn.close()
    async with KafkaSaver(settings) as reader:
        assert await _ids(reader, _config(copy)) == []
        assert "1" not in await _ids(reader, _config(copy_of_copy))  # the source's checkpoint, copied twice


async def test_erasing_a_thread_erases_a_copy_the_projector_reached_only_after_the_key_was_destroyed(
    short_deadline_stack: DevStack,
) -> None:
    """The model test's seed 551499706: a copy acknowledged before its source's erasure, applied by a
    projector that reached the source's records only once the source's key was destroyed (so the
    projection never held what the copy copied), is a copy of the source all the same: the erasure
    erases it, as it erases every thread copied from its source."""
    stack = short_deadline_stack
    source, target = _thread(), _thread()
    async with KafkaSaver(stack.settings) as writer, KafkaSaver(stack.settings) as eraser:
        await writer.aput(_config(target), _checkpoint("t"), {}, {})
        await _projection(stack, _config(target))
        with stack.projector_frozen():
            await writer.aput(_config(source), _checkpoint("s"), {}, {})
            await writer.acopy_thread(source, target)
            with pytest.raises(GraphledgerError, match=r"erasure_incomplete|erase it again"):
                await eraser.aerase_thread(source)  # the key is destroyed; its event waits for the projector
        await eraser.aerase_thread(source)  # asked again, as the error says: now its copies are known
    async with KafkaSaver(stack.settings) as reader:
        assert await _ids(reader, _config(target)) == []


async def test_a_child_put_before_its_parents_reads_the_value_the_parents_put_stores(
    short_deadline_stack: DevStack,
) -> None:
    """Another writer's puts reach the log out of order: checkpoint 3, naming xs at version a, then its
    parent 2, whose put stores xs at a. The projection answered 3 without xs in between; a reader that
    folds 2's put onto that answer must not keep it (the official saver reads 3 with xs)."""
    stack, thread, reference = short_deadline_stack, _thread(), ReferenceSaver()
    child, parent = _checkpoint("3", {}, {"xs": "a"}), _checkpoint("2", {"xs": [1]}, {"xs": "a"})
    async with KafkaSaver(stack.settings) as writer, KafkaSaver(stack.settings) as other:
        for saver in (writer, reference):
            await saver.aput(_config(thread), _checkpoint("1"), {}, {})
        seen = _positions(other)
        for saver in (other, reference):
            await saver.aput(_config(thread, "2"), child, {}, {})
        ((partition, offset),) = seen
        await _until_past(stack, partition, offset)  # the projection holds 3, without xs
        expected = {"xs": [1]}
        with stack.projector_frozen():
            for saver in (other, reference):
                await saver.aput(_config(thread, "1"), parent, {}, {"xs": "a"})
            try:
                mine = await writer.aget_tuple(_config(thread))
            except GraphledgerError as exc:  # it waits for the projection, which is frozen
                assert exc.retryable, exc
            else:
                assert mine is not None and mine.checkpoint["channel_values"] == expected  # it read {}
        assert (await reference.aget_tuple(_config(thread))).checkpoint["channel_values"] == expected
        assert (await writer.aget_tuple(_config(thread))).checkpoint["channel_values"] == expected


async def test_a_put_storing_a_version_an_older_checkpoint_names_reads_there_too(
    short_deadline_stack: DevStack,
) -> None:
    """A delete drops checkpoint 1's blob row of xs at version a; checkpoint 2, put after it, names a and
    stores nothing; checkpoint 3 stores a again. Blob rows are shared by version, so the official saver
    reads 2 with xs from then on (the model test's seed 865797764). A read of 2 by id folding 3's put,
    the writer's over the read API's answer or the read API's over the projection's, read it without."""
    stack, thread, reference = short_deadline_stack, _thread(), ReferenceSaver()
    version = f"{5:032}.0.5"
    older = _config(thread, "2")
    async with KafkaSaver(stack.settings) as writer, KafkaSaver(stack.settings) as other:
        for saver in (writer, reference):
            await saver.aput(_config(thread), _checkpoint("1", {"xs": [1]}, {"xs": version}), {}, {"xs": version})
            await saver.adelete_thread(thread)
        seen = _positions(writer)
        for saver in (writer, reference):
            await saver.aput(_config(thread, "1"), _checkpoint("2", {}, {"xs": version}), {}, {})
        ((partition, offset),) = seen
        await _until_past(stack, partition, offset)  # the projection holds 2, without xs
        expected = {"xs": [1]}
        with stack.projector_frozen():
            for saver in (writer, reference):
                stores = _checkpoint("3", {"xs": [1]}, {"xs": version})
                await saver.aput(_config(thread, "2"), stores, {}, {"xs": version})
            for reader in (writer, other):
                try:
                    mine = await reader.aget_tuple(older)
                except GraphledgerError as exc:  # it waits for the projection, which is frozen
                    assert exc.retryable, exc
                else:
                    assert mine is not None and mine.checkpoint["channel_values"] == expected  # it read {}
        assert (await reference.aget_tuple(older)).checkpoint["channel_values"] == expected
        for reader in (writer, other):
            assert (await reader.aget_tuple(older)).checkpoint["channel_values"] == expected
