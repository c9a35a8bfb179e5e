"""Records no projector version can apply, forged against another tenant's threads (invariant 7, issue 25).

A producer with write access (any agent) publishes, with the record keys of acme's threads (the log shows
them): a put claiming envelope version 99, and a `thread.copy.barrier` naming a copy at offset 2^62. The
stack has its own Postgres, broker and services, two tenants' tokens, sealing on and a clear era accepted
(`GRAPHLEDGER_ACCEPT_CLEAR_EVENTS`): the setting in which a barrier in the clear naming a tenant's thread is
admitted at all (without it, it is dead-lettered: `test_erasure.py`). Each forged record parks the thread
it names and nothing else: acme's other threads and beta's on the same partition are applied and read
within 10 s, lists across threads answer, the parked threads' reads fail naming the parking, and
`graphledger parked list|release|drop` report and resolve them, the victim's held write applied in order.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka.partitioner import murmur2
from langgraph.checkpoint.base import empty_checkpoint

from graphledger import KafkaSaver
from graphledger.errors import ReadApiError
from graphledger.events import envelope, to_envelope
from graphledger.events.checkpoint import ThreadCopyBarrier
from graphledger.events.envelope import Envelope
from graphledger.tenancy import scoped_thread
from polling import wait_for
from projection_helpers import put
from tenant_stack import TenantStack, Victim, chat_graph, tenant_stack, victim_thread

pytestmark = pytest.mark.slow

MOVES_ON_S = 10.0
"""How soon the other subjects of a partition holding a forged record are applied and read."""
WAIT_S = 90.0
FAR = 2**62


@pytest.fixture(scope="module")
def tenants() -> Iterator[TenantStack]:
    with tenant_stack(accept_clear_events=True) as stack:
        yield stack


async def _thread_on(tenants: TenantStack, tenant: str, partition: int, prefix: str) -> tuple[str, bytes]:
    """A thread of `tenant` (one turn written) whose records go to `partition`, and its record key."""
    async with KafkaSaver(tenants.client(tenant)) as saver:
        for _ in range(64):
            thread = f"{prefix}-{uuid.uuid4().hex[:8]}"
            await chat_graph(saver).ainvoke({"messages": ["first"]}, {"configurable": {"thread_id": thread}})
            key = saver._runtime.record_key_of_thread(thread)
            assert key is not None
            if _partition_of(tenants, key) == partition:
                return thread, key
    raise AssertionError(f"no thread of 64 went to partition {partition}")


def _partition_of(tenants: TenantStack, key: bytes) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % tenants.dev.settings.topic_partitions


async def _forge(victim: Victim, tenants: TenantStack, env: Envelope, key: bytes) -> str:
    """Publish `env` in the clear with `key`, as any producer can; the name of the subject it parks."""
    topic = tenants.dev.settings.checkpoint_topic
    sent = await victim.producer.send_and_wait(topic, envelope.encode(env), key=key, headers=envelope.headers_for(env))
    return f"{topic}:{sent.partition}@{sent.offset}"


async def _turn(tenants: TenantStack, tenant: str, thread: str, text: str) -> tuple[list[str], str]:
    """One turn of `tenant`'s thread in a process of its own (a fresh client): the messages another process
    reads after it, and the turn's newest checkpoint."""
    async with KafkaSaver(tenants.client(tenant)) as saver:
        graph = chat_graph(saver)
        config = {"configurable": {"thread_id": thread}}
        await graph.ainvoke({"messages": [text]}, config)
    async with KafkaSaver(tenants.client(tenant)) as reader:
        state = await chat_graph(reader).aget_state(config)
    return list(state.values["messages"]), state.config["configurable"]["checkpoint_id"]


async def _refused(tenants: TenantStack, thread: str) -> str:
    """The code of acme's read of `thread` (another process's: it asks the read API)."""
    async with KafkaSaver(tenants.client("acme")) as reader:
        try:
            await chat_graph(reader).aget_state({"configurable": {"thread_id": thread}})
        except ReadApiError as exc:
            return exc.code
    return "answered"


async def _parked(tenants: TenantStack) -> dict[str, dict[str, Any]]:
    return {s["subject"]: s for s in json.loads(tenants.graphledger("parked", "list", "--json"))}


async def test_forged_records_park_only_the_threads_they_name_and_an_operator_resolves_them(
    tenants: TenantStack,
) -> None:
    async with victim_thread(tenants, "victim") as victim:
        partition = _partition_of(tenants, victim.record_key)
        copied, copied_key = await _thread_on(tenants, "acme", partition, "copied")
        other, _ = await _thread_on(tenants, "acme", partition, "other")
        theirs, _ = await _thread_on(tenants, "beta", partition, "theirs")
        newer = to_envelope(put(victim.stored, 99))
        too_new = Envelope(newer.type, newer.event_id, newer.produced_ms, newer.payload, version=99)
        version_99 = await _forge(victim, tenants, too_new, victim.record_key)
        beyond = await _forge(
            victim, tenants, to_envelope(ThreadCopyBarrier(scoped_thread("acme", copied), 0, FAR)), copied_key
        )

        # The partition's other subjects, acme's and beta's, written after the forged records: read, and
        # applied by the projector within MOVES_ON_S.
        newest = {}
        for tenant, thread in (("acme", other), ("beta", theirs)):
            messages, newest[scoped_thread(tenant, thread)] = await _turn(tenants, tenant, thread, "second")
            assert messages == ["first", "reply to first", "second", "reply to second"]
        schema = tenants.dev.settings.postgres_schema

        async def applied() -> bool:
            found = await victim.pool.fetchval(
                f"SELECT count(*) FROM {schema}.checkpoints "
                "WHERE (thread_id, checkpoint_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))",
                list(newest),
                list(newest.values()),
            )
            return bool(found == len(newest))

        await wait_for(applied, "the partition's other threads' turns to be applied", timeout_s=MOVES_ON_S)
        async with KafkaSaver(tenants.client("acme")) as reader:  # across threads: no record holds it
            listed = [t async for t in reader.alist(None, limit=1000)]
        assert {t.config["configurable"]["thread_id"] for t in listed} >= {other, copied, victim.thread}

        # The forged records' threads are parked, and say so.
        parked = await _parked(tenants)
        assert {name: parked[name]["cause"] for name in (version_99, beyond)} == {
            version_99: "newer_version",
            beyond: "beyond_log",
        }
        assert await _refused(tenants, victim.thread) == "subject_parked"
        assert await _refused(tenants, copied) == "subject_parked"

        # The victim writes on (its put waits, held with its thread); a drop dead-letters the forged record
        # and applies the held put.
        async with KafkaSaver(tenants.client("acme")) as writer:
            config = {"configurable": {"thread_id": victim.thread, "checkpoint_ns": ""}}
            held = await writer.aput(config, empty_checkpoint(), {"source": "input", "step": 5}, {})
        await wait_for(lambda: _holds(tenants, version_99, 2), "the victim's put to be held", timeout_s=WAIT_S)
        assert "parked: drop" in tenants.graphledger("parked", "drop", version_99)
        async with KafkaSaver(tenants.client("acme")) as reader:
            found = await reader.aget_tuple({"configurable": {"thread_id": victim.thread}})
        assert (
            found is not None and found.config["configurable"]["checkpoint_id"] == held["configurable"]["checkpoint_id"]
        )

        # The barrier cannot be met by this (or any) version: a release parks it again and says so; a drop
        # resolves it.
        again = tenants.run_graphledger("parked", "release", beyond)
        assert again.returncode == 1 and f"parked again at {beyond} (beyond_log" in again.stderr, again.stderr
        tenants.graphledger("parked", "drop", beyond)
        messages, _ = await _turn(tenants, "acme", copied, "back")
        assert messages == ["first", "reply to first", "back", "reply to back"]
        assert await _parked(tenants) == {}
        letters = json.loads(tenants.graphledger("dlq", "list", "--json"))
        assert {letter["source"] for letter in letters} >= {version_99, beyond}


async def _holds(tenants: TenantStack, name: str, records: int) -> bool:
    found = (await _parked(tenants)).get(name)
    return found is not None and found["records"] == records
