"""Bad client input fails before anything is published; odd but valid input round-trips."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from langgraph.checkpoint.base import empty_checkpoint

from graphledger import KafkaSaver
from graphledger.errors import InvalidInputError


@pytest.fixture
def saver(stack):
    with KafkaSaver(stack.settings) as saver:
        yield saver


async def _end_offsets(settings) -> dict[int, int]:
    """End offset of every checkpoint-topic partition: unchanged means nothing was published."""
    consumer = AIOKafkaConsumer(**settings.kafka_client_options())
    await consumer.start()
    try:
        partitions = [TopicPartition(settings.checkpoint_topic, p) for p in range(settings.topic_partitions)]
        return {tp.partition: offset for tp, offset in (await consumer.end_offsets(partitions)).items()}
    finally:
        await consumer.stop()


def _config(thread_id: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


@pytest.mark.parametrize(
    ("thread_id", "message"),
    [(None, "thread_id is required"), ("", "must not be empty"), ("a\x00b", "NUL"), (1.5, "str, int or UUID")],
)
async def test_bad_thread_id_is_refused_and_publishes_nothing(stack, saver, thread_id: Any, message: str) -> None:
    before = await _end_offsets(stack.settings)
    with pytest.raises(InvalidInputError, match=message):
        await saver.aput(_config(thread_id), empty_checkpoint(), {}, {})
    with pytest.raises(InvalidInputError, match=message):
        await saver.aput_writes(
            {"configurable": {**_config(thread_id)["configurable"], "checkpoint_id": "x"}}, [("c", 1)], "task"
        )
    with pytest.raises(InvalidInputError, match=message):
        await saver.adelete_thread(thread_id)
    assert await _end_offsets(stack.settings) == before


async def test_nul_in_nested_metadata_is_refused_and_publishes_nothing(stack, saver) -> None:
    before = await _end_offsets(stack.settings)
    with pytest.raises(InvalidInputError, match=r"checkpoint metadata\.extra\.note contains a NUL"):
        await saver.aput(_config("t-nul"), empty_checkpoint(), {"extra": {"note": "a\x00b"}}, {})
    assert await _end_offsets(stack.settings) == before


async def test_nul_in_top_level_metadata_is_stripped_as_langgraph_does(saver) -> None:
    # LangGraph's get_checkpoint_metadata drops NUL from top-level strings before any saver sees them.
    thread = str(uuid.uuid4())
    await saver.aput(_config(thread), empty_checkpoint(), {"note": "a\x00b"}, {})
    found = await saver.aget_tuple(_config(thread))
    assert found is not None and found.metadata["note"] == "ab"


@pytest.mark.parametrize("thread_id", [42, uuid.UUID("12345678-1234-5678-1234-567812345678")])
async def test_int_and_uuid_thread_ids_are_stored_as_strings(saver, thread_id: Any) -> None:
    stored = await saver.aput(_config(thread_id), empty_checkpoint(), {"source": "input", "step": -1}, {})
    assert stored["configurable"]["thread_id"] == str(thread_id)
    found = await saver.aget_tuple(_config(str(thread_id)))
    assert found is not None and found.config["configurable"]["thread_id"] == str(thread_id)


async def test_nul_string_and_nan_channel_values_round_trip_as_blobs(saver) -> None:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"text": "a\x00b", "ratio": float("inf"), "plain": "ok"}
    checkpoint["channel_versions"] = {"text": "1", "ratio": "1", "plain": "1"}
    thread = str(uuid.uuid4())
    await saver.aput(_config(thread), checkpoint, {}, {"text": "1", "ratio": "1", "plain": "1"})
    found = await saver.aget_tuple(_config(thread))
    assert found is not None
    assert found.checkpoint["channel_values"] == {"text": "a\x00b", "ratio": float("inf"), "plain": "ok"}


async def test_a_50_mb_checkpoint_round_trips(saver) -> None:
    big = uuid.uuid4().bytes * (50 * 1024 * 1024 // 16)
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"payload": big}
    checkpoint["channel_versions"] = {"payload": "1"}
    thread = str(uuid.uuid4())
    await saver.aput(_config(thread), checkpoint, {"step": 0}, {"payload": "1"})
    found = await saver.aget_tuple(_config(thread))
    assert found is not None
    assert found.checkpoint["channel_values"]["payload"] == big
