"""Bad input to the read API: a body that fails validation is a 422 naming the field, an undecodable
body is refused, unknown paths and methods answer in the error format.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from graphledger.wire import JSON, MSGPACK
from read_api_helpers import DELTA, GET, LIST, VERDICTS, Api, answer, call


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (GET, {}, "thread_id"),
        (GET, {"thread_id": ""}, "thread_id"),
        (GET, {"thread_id": "a\x00b"}, "thread_id"),
        (GET, {"thread_id": 7}, "thread_id"),
        (GET, {"thread_id": "t", "checkpoint_ns": "a\x00"}, "checkpoint_ns"),
        (GET, {"thread_id": "t", "fliter": {}}, "fliter"),
        (GET, ["thread_id"], "body"),
        (LIST, {"limit": -1}, "limit"),
        (LIST, {"limit": "5"}, "limit"),
        (LIST, {"filter": {"user": "a\x00"}}, "filter"),
        (LIST, {"filter": {"a\x00": 1}}, "filter"),
        (LIST, {"checkpoint_ns": ""}, "thread_id"),
        (DELTA, {"thread_id": "t"}, "channels"),
        (DELTA, {"thread_id": "t", "channels": "items"}, "channels"),
        (VERDICTS, {"thread_id": "t", "offsets": [1]}, "partition"),
        (VERDICTS, {"thread_id": "t", "partition": -1, "offsets": [1]}, "partition"),
        (VERDICTS, {"thread_id": "t", "partition": 0, "offsets": []}, "offsets"),
        (VERDICTS, {"thread_id": "t", "partition": 0, "offsets": [-1]}, "offsets"),
        (VERDICTS, {"thread_id": "t", "partition": 0, "offsets": list(range(65))}, "offsets"),
    ],
)
@pytest.mark.parametrize("fmt", ["msgpack", "json"])
async def test_bad_bodies_are_a_422_naming_the_field(api: Api, path: str, body: Any, field: str, fmt: str) -> None:
    response = await call(api.client, path, body, fmt)
    assert response.status_code == 422, response.text
    error = answer(response)
    assert error["error"] == "invalid_request" and error["retryable"] is False
    assert field in error["message"]


async def test_a_verdict_asked_on_another_partition_than_the_threads_is_a_400(api: Api) -> None:
    response = await call(api.client, VERDICTS, {"thread_id": "t", "partition": 2**31 - 1, "offsets": [0]}, "msgpack")
    assert response.status_code == 400, response.text
    error = answer(response)
    assert error["error"] == "wrong_partition" and "'t'" in error["message"]


async def test_a_verdict_asked_for_an_offset_beyond_the_logs_end_is_a_400_not_a_wait(api: Api) -> None:
    partitions = api.app.state.api.settings.topic_partitions
    asked = [
        await call(api.client, VERDICTS, {"thread_id": "t", "partition": p, "offsets": [2**40]}, "msgpack")
        for p in range(partitions)
    ]
    on_its_partition = [r for r in asked if answer(r)["error"] != "wrong_partition"]
    assert len(on_its_partition) == 1, [r.text for r in asked]
    response = on_its_partition[0]
    assert response.status_code == 400, response.text
    error = answer(response)
    assert error["error"] == "beyond_log_end" and error["retryable"] is False
    assert f":{2**40} is beyond the log's end" in error["message"]


@pytest.mark.parametrize(
    ("content", "content_type", "status"),
    [
        (b"{not json", JSON, 400),
        (b"\xc1", MSGPACK, 400),
        (b"", JSON, 422),
        (b"thread_id=t", "application/x-www-form-urlencoded", 415),
        (orjson.dumps({"thread_id": "t" * 2_000_000}), JSON, 413),
    ],
)
async def test_undecodable_bodies_are_refused(api: Api, content: bytes, content_type: str, status: int) -> None:
    response = await api.client.post(GET, content=content, headers={"Content-Type": content_type})
    assert response.status_code == status
    assert set(response.json()) == {"error", "message", "retryable"}


async def test_unknown_paths_and_methods_use_the_error_format(api: Api) -> None:
    missing = await api.client.post("/v1/checkpoints/nope", headers={"Accept": MSGPACK})
    assert missing.status_code == 404 and answer(missing)["error"] == "not_found"
    wrong_method = await api.client.get(GET)
    assert wrong_method.status_code == 405 and wrong_method.json()["error"] == "method_not_allowed"
