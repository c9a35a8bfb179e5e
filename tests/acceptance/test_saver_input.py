"""Odd but valid KafkaSaver input round-trips through the dev stack: NUL stripped from top-level metadata as
LangGraph does, int and UUID thread ids, NUL and non-finite channel values, a 50 MB checkpoint. Bad input
failing before anything is published is `unit/test_saver_validation.py`."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from graphledger import KafkaSaver


@pytest.fixture
def saver(stack):
    with KafkaSaver(stack.settings) as saver:
        yield saver


def _config(thread_id: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


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
