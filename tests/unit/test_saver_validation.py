"""Bad KafkaSaver input fails before anything is published (a fake publisher records nothing). Odd but
valid input round-tripping through the dev stack is `acceptance/test_saver_input.py`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from fakes import FakeTopics, client_settings
from graphledger import KafkaSaver
from graphledger.errors import InvalidInputError


@pytest.fixture
def saver(topics: FakeTopics) -> Iterator[KafkaSaver]:
    with KafkaSaver(client_settings()) as saver:
        yield saver


def _config(thread_id: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


@pytest.mark.parametrize(
    ("thread_id", "message"),
    [(None, "thread_id is required"), ("", "must not be empty"), ("a\x00b", "NUL"), (1.5, "str, int or UUID")],
)
async def test_bad_thread_id_is_refused_and_publishes_nothing(
    topics: FakeTopics, saver: KafkaSaver, thread_id: Any, message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        await saver.aput(_config(thread_id), empty_checkpoint(), {}, {})
    with pytest.raises(InvalidInputError, match=message):
        await saver.aput_writes(
            {"configurable": {**_config(thread_id)["configurable"], "checkpoint_id": "x"}}, [("c", 1)], "task"
        )
    with pytest.raises(InvalidInputError, match=message):
        await saver.adelete_thread(thread_id)
    assert topics.records == []


async def test_nul_in_nested_metadata_is_refused_and_publishes_nothing(topics: FakeTopics, saver: KafkaSaver) -> None:
    with pytest.raises(InvalidInputError, match=r"checkpoint metadata\.extra\.note contains a NUL"):
        await saver.aput(_config("t-nul"), empty_checkpoint(), {"extra": {"note": "a\x00b"}}, {})
    assert topics.records == []
