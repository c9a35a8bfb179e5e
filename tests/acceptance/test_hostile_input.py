"""Hostile input through client, events and read API: each input works (round-trips exactly) or fails
with a clear validation error naming what was wrong; never a crash, a 5xx or SQL error text.

Property-based (hypothesis) over namespaces, keys, ids, metadata, store values and filters made of
quotes, NUL, lone surrogates, unicode, 10,000-deep nesting, huge integers, NaN/inf and very long text.
Everything runs against the session's dev stack: real tansu, real Postgres, the real read API process.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
import ormsgpack
import psycopg
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.store.base import InvalidNamespaceError

from graphledger import KafkaSaver, KafkaStore
from graphledger.erasure.sealer import EventSealer
from graphledger.errors import InvalidInputError, ReadApiError
from graphledger.events import envelope, to_envelope
from graphledger.events.checkpoint import CheckpointPut
from graphledger.opening.checkpoint_events import to_checkpoint_event
from graphledger.pg_text import MAX_JSON_DEPTH
from graphledger.wire import JSON, MSGPACK
from graphledger_server.keys.key_store import key_store_for
from graphledger_server.keys.source import StoreKeySource
from hostile import (
    FEW,
    HOSTILE,
    SQL_LEAKS,
    assert_clear,
    json_objects,
    json_values,
    nest,
    produce_batch,
    texts,
    zstd_bomb,
)
from kafka_clients import raw_producer
from polling import wait_until
from projection_helpers import put
from thread_partitions import threads_on_partition

WAIT_S = 60.0
DELTA = "/v1/checkpoints/delta-history"
API_THREAD = "hostile-api-thread"
LAST = 2**63 - 1  # the largest count the read API takes (Postgres bigint)
KEY_CACHE_TTL_S = 600.0


@pytest.fixture(scope="module")
def saver(stack: Any) -> Iterator[KafkaSaver]:
    with KafkaSaver(stack.settings) as s:
        yield s


@pytest.fixture(scope="module")
def store(stack: Any) -> Iterator[KafkaStore]:
    with KafkaStore(stack.settings) as s:
        yield s


@pytest.fixture(scope="module")
def db(stack: Any) -> Iterator[psycopg.Connection]:
    with psycopg.connect(stack.settings.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {stack.settings.postgres_schema}")
        yield conn


def _jsonb_number(text: str) -> float | int:
    """A JSON number as jsonb gives it back: a decimal, so `1e16` and above come back as integers."""
    number = Decimal(text)
    return int(number) if "e+" in text.lower() and number == number.to_integral_value() else float(text)


def _json_round_trip(value: Any) -> Any:
    """What the projection stores and the read API answers for `value`, in both body formats."""
    normal = json.loads(json.dumps(value), parse_float=_jsonb_number)
    assert orjson.loads(orjson.dumps(normal)) == normal
    assert ormsgpack.unpackb(ormsgpack.packb(normal)) == normal
    return normal


# -- (a) the client -----------------------------------------------------------------------------------


@HOSTILE
@given(thread_id=texts, ns=texts, metadata=json_objects, channel_value=json_values)
@example(thread_id="t", ns="", metadata={"deep": nest(10_000)}, channel_value=2**70)
@example(thread_id="t", ns="", metadata={"n": 2**64}, channel_value="\ud800")
@example(thread_id="x" * 100_000, ns="", metadata={}, channel_value=None)
def test_saver_events_hold_only_what_postgres_stores_and_reads_return(
    saver: KafkaSaver, db: psycopg.Connection, thread_id: str, ns: str, metadata: dict[str, Any], channel_value: Any
) -> None:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"v": channel_value}
    checkpoint["channel_versions"] = {"v": "1"}
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}}
    try:
        event = saver._checkpoint_put(config, checkpoint, {"extra": metadata}, {"v": "1"})
    except InvalidInputError as exc:
        assert_clear(exc)
        return
    assert to_checkpoint_event(envelope.decode(envelope.encode(to_envelope(event)))) == event
    for text in (event.checkpoint_json, event.metadata_json):
        stored = db.execute("SELECT %s::text::jsonb", (text.decode(),)).fetchone()[0]
        assert stored == _json_round_trip(json.loads(text))
    inline = json.loads(event.checkpoint_json)["channel_values"]
    if "v" in inline:
        assert inline["v"] == channel_value
    else:  # kept as a blob by the agent's serde: opaque, and exactly what was written
        (blob,) = event.blobs
        back = saver.serde.loads_typed((blob.type, blob.data))
        # Exactly what the agent's serde alone makes of the value (JsonPlus writes a lone surrogate as "?").
        expected = saver.serde.loads_typed(saver.serde.dumps_typed(channel_value))
        assert repr(back) == repr(expected)


@FEW
@given(thread_id=texts, metadata=json_objects)
@example(thread_id="t", metadata={"quote": "'; DROP TABLE checkpoints; --", "n": -(2**63), "u": "\U0001f99c"})
def test_saver_metadata_round_trips_or_is_refused(saver: KafkaSaver, thread_id: str, metadata: dict[str, Any]) -> None:
    thread = f"{uuid.uuid4()}{thread_id[:50]}"
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    try:
        saver.put(config, empty_checkpoint(), {"extra": metadata}, {})
    except InvalidInputError as exc:
        assert_clear(exc)
        return
    found = saver.get_tuple(config)
    assert found is not None
    assert found.metadata["extra"] == _json_round_trip(metadata)
    try:
        listed = list(saver.list(config, filter={"extra": metadata}))
    except ReadApiError as exc:  # a filter the API refuses must be a clear 4xx
        assert 400 <= exc.status < 500, exc
        assert_clear(exc)
    else:
        assert [t.config["configurable"]["checkpoint_id"] for t in listed] == [found.checkpoint["id"]]


namespaces = st.lists(texts, min_size=0, max_size=3)


@FEW
@given(namespace=namespaces, key=texts, value=json_objects)
@example(namespace=["a", "\ud800"], key="k", value={})
@example(namespace=["a"], key="x" * 100_000, value={})
@example(namespace=["a"], key="k", value={"deep": nest(10_000)})
def test_store_put_get_round_trips_or_is_refused(
    store: KafkaStore, namespace: list[str], key: str, value: dict[str, Any]
) -> None:
    ns = (f"h{uuid.uuid4().hex[:12]}", *namespace)
    try:
        store.put(ns, key, value)
    except (InvalidInputError, InvalidNamespaceError) as exc:
        assert_clear(exc)
        return
    item = store.get(ns, key)
    assert item is not None and item.namespace == ns and item.key == key
    assert item.value == _json_round_trip(value)
    found = store.search(ns[:1], limit=5)
    assert [(i.namespace, i.key) for i in found] == [(ns, key)]
    assert store.list_namespaces(prefix=ns[:1]) == [ns]


@FEW
@given(namespace=namespaces, filter=json_objects, limit=st.integers(-5, 2**64))
@example(namespace=["a"], filter={"a": {"$regex": "x"}}, limit=1)
@example(namespace=["a"], filter={"a": nest(10_000)}, limit=1)
def test_store_search_and_list_namespaces_answer_or_refuse(
    store: KafkaStore, namespace: list[str], filter: dict[str, Any], limit: int
) -> None:
    try:
        results = store.search(tuple(namespace), filter=filter, limit=limit)
    except (InvalidInputError, InvalidNamespaceError) as exc:
        assert_clear(exc)
    except ReadApiError as exc:
        assert 400 <= exc.status < 500, exc
        assert_clear(exc)
    else:
        assert isinstance(results, list)
    try:
        spaces = store.list_namespaces(prefix=tuple(namespace), limit=limit)
    except (InvalidInputError, InvalidNamespaceError) as exc:
        assert_clear(exc)
    else:
        assert isinstance(spaces, list)


# -- (b) the events -----------------------------------------------------------------------------------


def _hostile_records(valid: CheckpointPut) -> dict[str, tuple[bytes | envelope.Envelope, str]]:
    """Records a client could never publish, each with the words its dead-letter reason must name: bytes,
    or an envelope an agent seals with a key of its own (`_sealed_records`)."""
    env = to_envelope(valid)

    def with_payload(**change: Any) -> envelope.Envelope:
        return envelope.Envelope(env.type, env.event_id, env.produced_ms, {**env.payload, **change})

    deep = b'{"a": ' * 10_000 + b"1" + b"}" * 10_000
    return {
        "garbage": (b"\xc1\x00garbage", "msgpack"),
        "not an envelope": (ormsgpack.packb([1, 2, 3]), "not a map"),
        "deep metadata": (with_payload(metadata=deep), "metadata JSON"),
        "201-deep metadata": (with_payload(metadata=json.dumps({"a": nest(MAX_JSON_DEPTH)}).encode()), "deeper"),
        "huge int": (with_payload(metadata=b'{"n": 123456789012345678901234567890}'), "64-bit"),
        "lone surrogate": (with_payload(checkpoint=b'{"a": "\\ud800"}'), "checkpoint JSON"),
        "NaN": (with_payload(metadata=b'{"n": NaN}'), "NaN is not JSON"),
        "NUL": (with_payload(metadata=b'{"n": "\\u0000"}'), "u0000"),
        "empty thread": (with_payload(thread_id=""), "thread_id"),
        "thread id past the index": (with_payload(thread_id="".join(map(str, range(3000)))), "Postgres rejected"),
        "not bytes": (with_payload(checkpoint={"a": 1}), "checkpoint"),
    }


Record = tuple[bytes, list[tuple[str, bytes]]]
"""A record's value and headers."""


async def _sealed_records(
    settings: Any, event: CheckpointPut, payloads: list[bytes | envelope.Envelope]
) -> list[Record]:
    """Each payload as a record: an envelope sealed for the thread it names (else `event`'s) with that
    thread's data key from the key store, as any agent with encryption on can seal anything (bytes as
    they are)."""
    pool = await asyncpg.create_pool(settings.postgres_dsn, min_size=1, max_size=1)
    try:
        key_store = key_store_for(settings, pool)
        assert key_store is not None
        sealer = EventSealer(StoreKeySource(key_store, settings), KEY_CACHE_TTL_S)
        records: list[Record] = []
        for payload in payloads:
            if isinstance(payload, bytes):
                records.append((payload, [("gl-type", b"checkpoint.put")]))
            else:
                named = payload.payload.get("thread_id")
                _, sealed = await sealer.seal(put(named, 1) if isinstance(named, str) and named else event, "", payload)
                records.append((envelope.encode(sealed), envelope.headers_for(sealed)))
        return records
    finally:
        await pool.close()


async def _produce(settings: Any, records: list[Record], partition: int) -> list[int]:
    producer = raw_producer(settings)
    await producer.start()
    try:
        offsets = []
        for value, headers in records:
            meta = await producer.send_and_wait(
                settings.checkpoint_topic, value, key=b"k", partition=partition, headers=headers
            )
            offsets.append(meta.offset)
        return offsets
    finally:
        await producer.stop()


def test_hostile_records_are_dead_lettered_and_the_partition_moves_on(stack: Any, db: psycopg.Connection) -> None:
    thread = f"hostile-{uuid.uuid4()}"
    hostile = _hostile_records(put(thread, 1))
    good = put(thread, 2)
    payloads = [value for value, _ in hostile.values()] + [to_envelope(good)]

    async def attack() -> list[int]:
        return await _produce(stack.settings, await _sealed_records(stack.settings, good, payloads), partition=1)

    offsets = asyncio.run(attack())

    def applied() -> bool:
        row = db.execute("SELECT 1 FROM checkpoints WHERE thread_id = %s", (thread,)).fetchone()
        return row is not None

    wait_until(applied, WAIT_S, "the good event after the hostile ones")
    rows = dict(
        db.execute(
            'SELECT "offset", reason FROM graphledger_dead_letters'
            ' WHERE topic = %s AND partition = 1 AND "offset" = ANY(%s)',
            (stack.settings.checkpoint_topic, offsets[:-1]),
        ).fetchall()
    )
    for (name, (_, words)), offset in zip(hostile.items(), offsets, strict=False):
        assert offset in rows, f"{name} was not dead-lettered"
        assert words in rows[offset], (name, rows[offset])
    assert db.execute("SELECT count(*) FROM checkpoints WHERE thread_id = %s", (thread,)).fetchone()[0] == 1


def _peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


def test_a_decompression_bomb_is_dead_lettered_within_the_bound(stack: Any, db: psycopg.Connection) -> None:
    """A zstd batch of ~120 KB that expands to 2 GB: the projector reads at most
    `max_decompressed_batch_bytes` of it, dead-letters it, stays up under its chart memory limit (1 GiB)
    and applies the partition's next record."""
    pid = stack.pids()["projector"]
    thread = f"bomb-{uuid.uuid4()}"
    topic, partition = stack.settings.checkpoint_topic, 2

    async def attack() -> int:
        await produce_batch(stack.settings, topic, partition, zstd_bomb(2 * 1024**3))
        event = put(thread, 1)
        (offset,) = await _produce(
            stack.settings, await _sealed_records(stack.settings, event, [to_envelope(event)]), partition
        )
        return offset

    good = asyncio.run(attack())

    def applied() -> bool:
        return db.execute("SELECT 1 FROM checkpoints WHERE thread_id = %s", (thread,)).fetchone() is not None

    wait_until(applied, WAIT_S, "the record after the bomb")
    reasons = [
        reason
        for (reason,) in db.execute(
            'SELECT reason FROM graphledger_dead_letters WHERE topic = %s AND partition = %s AND "offset" = %s',
            (topic, partition, good - 1),
        ).fetchall()
    ]
    assert len(reasons) == 1 and reasons[0].startswith("unreadable record batch") and "zstd" in reasons[0], reasons
    assert stack.pids()["projector"] == pid
    assert _peak_rss_bytes(pid) < 1024**3
    asyncio.run(_read_through_past_the_bomb(stack, partition))


async def _read_through_past_the_bomb(stack: Any, partition: int) -> None:
    """The read API cannot read the bomb's batch either: its reads of the partition go on from where the
    projector applied past it, answering a thread written there with the projector stopped."""
    pid = stack.pids()["projector"]
    async with KafkaSaver(stack.settings) as writer, KafkaSaver(stack.settings) as reader:
        (thread,) = await threads_on_partition(writer, partition, label="after-bomb")
        config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        os.kill(pid, signal.SIGSTOP)
        try:
            written = await writer.aput(config, empty_checkpoint(), {"source": "input", "step": -1}, {})
            found = await reader.aget_tuple(config)
        finally:
            os.kill(pid, signal.SIGCONT)
    assert found is not None, "the read API answered nothing for a thread written after the bomb"
    assert found.config["configurable"]["checkpoint_id"] == written["configurable"]["checkpoint_id"]


# -- (c) the read API -----------------------------------------------------------------------------------

ids = st.just(API_THREAD) | texts | st.integers() | st.none() | st.floats() | st.lists(texts, max_size=2)
get_bodies = st.fixed_dictionaries({"thread_id": ids}, optional={"checkpoint_ns": ids, "checkpoint_id": ids})
list_bodies = st.fixed_dictionaries(
    {},
    optional={
        "thread_id": ids,
        "filter": json_values,
        "before_checkpoint_id": ids,
        "limit": st.integers() | st.floats() | texts,
    },
)
delta_bodies = st.fixed_dictionaries({"thread_id": ids, "channels": st.lists(texts, max_size=3) | json_values})
store_ops = st.one_of(
    st.fixed_dictionaries({"op": st.just("get"), "namespace": st.lists(texts, max_size=3) | json_values, "key": ids}),
    st.fixed_dictionaries(
        {"op": st.just("search")},
        optional={
            "namespace_prefix": st.lists(texts, max_size=3),
            "filter": json_values,
            "limit": st.integers(),
            "offset": st.integers(),
            "query_vector": st.lists(st.floats(), max_size=4),
        },
    ),
    st.fixed_dictionaries(
        {"op": st.just("list_namespaces")},
        optional={"prefix": st.lists(texts, max_size=3), "suffix": json_values, "max_depth": st.integers()},
    ),
    json_values,
)
bodies = st.one_of(
    st.tuples(st.just("/v1/checkpoints/get"), get_bodies | json_values),
    st.tuples(st.just("/v1/checkpoints/list"), list_bodies | json_values),
    st.tuples(st.just("/v1/checkpoints/delta-history"), delta_bodies),
    st.tuples(st.just("/v1/store/batch"), st.fixed_dictionaries({"ops": st.lists(store_ops, max_size=3)})),
)


def _encode(body: Any, fmt: str) -> bytes | None:
    """The body in `fmt`, or None when that format cannot carry it (a client could not send it)."""
    try:
        if fmt == MSGPACK:
            return ormsgpack.packb(body)
        return json.dumps(body, ensure_ascii=False, allow_nan=True).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError, RecursionError):
        return None


@pytest.fixture(scope="module")
def http(stack: Any, saver: KafkaSaver) -> Iterator[httpx.Client]:
    """A client of the real read API process, with `API_THREAD` holding a checkpoint to query."""
    saver.put({"configurable": {"thread_id": API_THREAD, "checkpoint_ns": ""}}, empty_checkpoint(), {}, {})
    assert saver.get_tuple({"configurable": {"thread_id": API_THREAD, "checkpoint_ns": ""}}) is not None
    with httpx.Client(base_url=stack.settings.api_url, timeout=60) as client:
        yield client


@HOSTILE
@given(call=bodies, fmt=st.sampled_from([JSON, MSGPACK]))
@example(call=("/v1/checkpoints/list", {"filter": {"a": float("nan")}}), fmt=MSGPACK)
@example(call=("/v1/checkpoints/list", {"filter": nest(300)}), fmt=MSGPACK)
@example(call=(DELTA, {"thread_id": API_THREAD, "channels": [str(i) for i in range(5000)]}), fmt=JSON)
@example(call=("/v1/checkpoints/list", {"thread_id": API_THREAD, "filter": {"n": 1e300}}), fmt=JSON)
@example(call=("/v1/checkpoints/get", {"thread_id": "x" * 900_000}), fmt=JSON)
@example(call=("/v1/store/batch", {"ops": [{"op": "get", "namespace": ["a"], "key": "\ud800"}]}), fmt=JSON)
@example(call=("/v1/store/batch", {"ops": [{"op": "list_namespaces", "max_depth": 2**31}]}), fmt=JSON)
@example(call=("/v1/store/batch", {"ops": [{"op": "search", "namespace_prefix": ["a"], "offset": LAST}]}), fmt=JSON)
def test_read_api_answers_hostile_bodies_or_refuses_them_clearly(
    http: httpx.Client, call: tuple[str, Any], fmt: str
) -> None:
    path, body = call
    content = _encode(body, fmt)
    if content is None:
        return
    response = http.post(path, content=content, headers={"Content-Type": fmt, "Accept": fmt})
    assert response.status_code < 500, (response.status_code, response.text[:500])
    assert not any(leak in response.text for leak in SQL_LEAKS), response.text[:500]
    if response.status_code >= 400:
        answer = ormsgpack.unpackb(response.content) if fmt == MSGPACK else response.json()
        assert answer["error"] and answer["message"] and answer["retryable"] is False, answer
