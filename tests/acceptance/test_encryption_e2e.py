"""End-to-end encryption: with LangGraph's `EncryptedSerializer` on the client, no plaintext channel
value, pending write or interrupt reaches a Kafka record or a Postgres row, and state round-trips.

Checkpoint metadata is JSON by design, so it can be filtered, and not encrypted by the serde
(docs/hostile-input.md), so the sentinels travel only in channel values, task writes and the interrupt.
"""

from __future__ import annotations

import asyncio
import operator
import time
import uuid
from collections.abc import Iterator
from typing import Annotated, Any

import psycopg
import pytest
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from typing_extensions import TypedDict

from graphledger import KafkaSaver
from kafka_clients import raw_consumer

SECRET = "SENTINEL-secret-channel-7f3a"  # a plain str channel: inlined in plain text by PostgresSaver
NOTE = "SENTINEL-note-write-91c2"  # a task's write to a reducer channel
QUESTION = "SENTINEL-interrupt-question-5d0e"  # the interrupt's value, a pending write
ANSWER = "SENTINEL-resume-answer-b8e4"  # the resume value, a pending write
COUNT = 987654321987  # a number: inline in plain text by PostgresSaver too
SENTINELS = [s.encode() for s in (SECRET, NOTE, QUESTION, ANSWER, str(COUNT))]
KEY = b"0123456789abcdef0123456789abcdef"


class State(TypedDict, total=False):
    secret: str
    count: int
    notes: Annotated[list[str], operator.add]
    answer: str


def _remember(state: State) -> dict:
    return {"secret": SECRET, "count": COUNT, "notes": [NOTE]}


def _ask(state: State) -> dict:
    return {"answer": interrupt(QUESTION)}


def _graph(saver: KafkaSaver) -> Any:
    graph = StateGraph(State)
    graph.add_node("remember", _remember)
    graph.add_node("ask", _ask)
    graph.add_edge(START, "remember")
    graph.add_edge("remember", "ask")
    graph.add_edge("ask", END)
    return graph.compile(checkpointer=saver)


@pytest.fixture
def saver(stack: Any) -> Iterator[KafkaSaver]:
    with KafkaSaver(stack.settings, serde=EncryptedSerializer.from_pycryptodome_aes(key=KEY)) as s:
        yield s


async def _records(settings: Any, key: bytes) -> list[Any]:
    """Every raw record of the checkpoint topic, read until the thread's last event (record `key`) has
    been seen (tansu's end offsets are unreliable, so the stop is: the thread's records seen, then a
    quiet poll)."""
    consumer = raw_consumer(settings, settings.checkpoint_topic, auto_offset_reset="earliest")
    await consumer.start()
    records: list[Any] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=1000)
            fresh = [r for rs in batch.values() for r in rs]
            records.extend(fresh)
            if not fresh and any(r.key == key for r in records):
                return records
        raise AssertionError("timed out reading the checkpoint topic")
    finally:
        await consumer.stop()


def _rows(settings: Any) -> list[tuple[str, bytes]]:
    """Every row of every table of the projection schema as (table, bytes): text as UTF-8, bytea raw."""
    out: list[tuple[str, bytes]] = []
    with psycopg.connect(settings.postgres_dsn) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (settings.postgres_schema,)
        ).fetchall()
        for (table,) in tables:
            for row in conn.execute(f'SELECT * FROM "{settings.postgres_schema}"."{table}"'):
                for value in row:
                    out.append((table, value if isinstance(value, bytes) else str(value).encode()))
    return out


def test_no_plaintext_state_in_kafka_or_postgres_and_state_round_trips(stack: Any, saver: KafkaSaver) -> None:
    thread = f"enc-{uuid.uuid4()}"
    config = {"configurable": {"thread_id": thread}}
    graph = _graph(saver)
    graph.invoke({"notes": []}, config)
    state = graph.get_state(config)
    assert state.values == {"secret": SECRET, "count": COUNT, "notes": [NOTE]}
    assert [i.value for i in state.interrupts] == [QUESTION]
    assert graph.invoke(Command(resume=ANSWER), config) == {
        "secret": SECRET,
        "count": COUNT,
        "notes": [NOTE],
        "answer": ANSWER,
    }
    assert graph.get_state(config).values["answer"] == ANSWER
    # The resume's pending write is kept on the interrupted checkpoint: ask for it explicitly.
    history = list(graph.get_state_history(config))
    assert any(w[1] == "__resume__" for s in history for w in (saver.get_tuple(s.config).pending_writes or []))

    key = saver._runtime.record_key_of_thread(thread)
    assert key is not None and key != thread.encode()
    records = asyncio.run(_records(stack.settings, key))
    ours = [r for r in records if r.key == key]
    assert len(ours) >= 4  # puts and writes of both runs reached the topic
    for r in records:
        raw = b"".join([r.key or b"", r.value or b"", *(v for _, v in r.headers)])
        leaked = [s for s in SENTINELS if s in raw]
        assert not leaked, f"plaintext {leaked} in record {r.topic}:{r.partition}@{r.offset}"
    rows = _rows(stack.settings)
    assert any(thread.encode() in value for _, value in rows)  # the projection has the thread
    leaked_rows = {(table, s) for table, value in rows for s in SENTINELS if s in value}
    assert not leaked_rows, f"plaintext in Postgres rows: {sorted(leaked_rows)}"
