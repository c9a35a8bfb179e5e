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
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import orjson
import ormsgpack
import psycopg
import pytest
import yaml
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2
from hypothesis import example, given
from hypothesis import strategies as st
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import InvalidNamespaceError
from typing_extensions import TypedDict

from graphledger import KafkaSaver, KafkaStore
from graphledger.client.reader import ReadApiClient
from graphledger.erasure.read_api_keys import ReadApiKeySource
from graphledger.erasure.sealer import EventSealer
from graphledger.erasure.sealing import SealedSubject, cipher_of, seal
from graphledger.errors import InvalidInputError, ReadApiError
from graphledger.events import envelope, to_envelope
from graphledger.events.checkpoint import CheckpointPut, ThreadCopyBarrier
from graphledger.events.erasure import NamespaceErase, TenantErase, ThreadErase
from graphledger.pg_text import MAX_JSON_DEPTH
from graphledger.settings import Settings
from graphledger.wire import JSON, MSGPACK
from graphledger_server.projection.checkpoints import to_checkpoint_event
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
from polling import wait_until
from projection_helpers import put
from store_helpers import put as store_put
from tenant_api import TenantApi
from tenant_api import tenant_api as tenant_read_api

WAIT_S = 60.0
DELTA = "/v1/checkpoints/delta-history"
API_THREAD = "hostile-api-thread"
LAST = 2**63 - 1  # the largest count the read API takes (Postgres bigint)
Headers = list[tuple[str, bytes]]


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


def _hostile_records(valid: CheckpointPut) -> dict[str, tuple[bytes, str]]:
    """Records a client could never publish, each with the words its dead-letter reason must name."""
    env = to_envelope(valid)

    def with_payload(**change: Any) -> bytes:
        return envelope.encode(envelope.Envelope(env.type, env.event_id, env.produced_ms, {**env.payload, **change}))

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
        "not bytes": (with_payload(checkpoint={"a": 1}), "checkpoint"),
    }


async def _produce(
    settings: Any, records: list[tuple[bytes, bytes, list[tuple[str, bytes]]]], partition: int
) -> list[int]:
    producer = AIOKafkaProducer(**settings.kafka_client_options(), enable_idempotence=False, acks="all")
    await producer.start()
    try:
        offsets = []
        for value, key, headers in records:
            meta = await producer.send_and_wait(
                settings.checkpoint_topic, value, key=key, partition=partition, headers=headers
            )
            offsets.append(meta.offset)
        return offsets
    finally:
        await producer.stop()


def test_hostile_records_are_dead_lettered_and_the_partition_moves_on(stack: Any, db: psycopg.Connection) -> None:
    thread = f"hostile-{uuid.uuid4()}"
    hostile = _hostile_records(put(thread, 1))

    async def sealed() -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
        """The events a client could publish, sealed as the stack's writers seal them (its unnamed tenant)."""
        agent = Agent(stack.settings, "")
        try:
            return [await agent.sealed(put(long_thread, 1)), await agent.sealed(put(thread, 2))]
        finally:
            await agent.close()

    long_thread = "".join(map(str, range(3000)))  # past Postgres's index: sealed, it names no subject
    (long_key, long_value, long_headers), (key, good, good_headers) = asyncio.run(sealed())
    records = [(v, thread.encode(), [("gl-type", b"checkpoint.put")]) for v, _ in hostile.values()]
    records += [(long_value, long_key, long_headers), (good, key, good_headers)]
    offsets = asyncio.run(_produce(stack.settings, records, partition=1))
    hostile["thread id past the index"] = (long_value, "longer than Postgres indexes")

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


# -- (d) a hostile producer with write access, against another tenant (docs/security.md, "Threat model") --

VICTIM, EVIL = "victim", "evil"
TURN = 3
"""Checkpoints one turn of `_say` writes: its input, the loop's start and `speak`'s, one step each."""
MOVE_ON_S = 10.0
"""Every partition's other subjects are applied this soon after the hostile records."""
CHART_VALUES = Path(__file__).resolve().parents[2] / "charts" / "graphledger" / "values.yaml"


@pytest.fixture(scope="module")
def two_tenants(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TenantApi]:
    with tenant_read_api(stack.settings, (VICTIM, EVIL), tmp_path_factory.mktemp("hostile-tenants")) as api:
        yield api


class Agent:
    """How a tenant's agent seals events (`EventSealer` over its token's `/v1/keys`), for records produced
    by hand: a tenant's own writes placed on chosen partitions, or an attacker's with its own keys."""

    def __init__(self, settings: Settings, tenant: str) -> None:
        self.tenant = tenant
        self._settings = settings
        self._reader = ReadApiClient(settings)
        self.sealer = EventSealer(ReadApiKeySource(self._reader), 60.0)

    async def close(self) -> None:
        await self._reader.close()

    async def sealed(self, event: Any) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
        """Key, value and headers of the record the tenant's client would publish for `event` (names as stored)."""
        key, env = await self.sealer.seal(event, self.tenant)
        assert key is not None
        return key.encode(), envelope.encode(env), envelope.headers_for(env)

    def data_key(self, thread_id: str) -> tuple[str, bytes]:
        """The reference and data key of one of the tenant's threads, as its token is handed them."""
        token = self._settings.api_token
        headers = {"Content-Type": MSGPACK, "Accept": MSGPACK}
        if token is not None:
            headers["Authorization"] = f"Bearer {token.get_secret_value()}"
        body = ormsgpack.packb({"subjects": [{"kind": "thread", "name": thread_id}]})
        answer = ormsgpack.unpackb(
            httpx.post(f"{self._settings.api_url}/v1/keys", content=body, headers=headers).content
        )
        return answer["keys"][0]["ref"], answer["keys"][0]["key"]


def _plain(event: Any, version: int | None = None) -> tuple[bytes, list[tuple[str, bytes]]]:
    env = to_envelope(event)
    if version is not None:
        env = envelope.Envelope(env.type, env.event_id, env.produced_ms, env.payload, version=version)
    return envelope.encode(env), envelope.headers_for(env)


Produced = tuple[str, int, bytes | None, bytes, list[tuple[str, bytes]]]
"""A record as a producer sends it: topic, partition, key, value, headers."""


async def _send(settings: Settings, records: list[Produced]) -> None:
    """Produce `(topic, partition, key, value, headers)` records as they are: a producer with write access."""
    producer = AIOKafkaProducer(**settings.kafka_client_options(), enable_idempotence=False, acks="all")  # type: ignore[arg-type]
    await producer.start()
    try:
        for topic, partition, key, value, headers in records:
            await producer.send_and_wait(topic, value, key=key, partition=partition, headers=headers)
    finally:
        await producer.stop()


def _graphledger(stack: Any, *args: str) -> Any:
    """A `graphledger` command against the stack, its JSON answer."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("GRAPHLEDGER_")} | stack.service_env()
    done = subprocess.run(
        [sys.executable, "-m", "graphledger_server", *args], env=env, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if "--json" in args else done.stdout


def _memory_limit_bytes() -> int:
    limit = yaml.safe_load(CHART_VALUES.read_text())["projector"]["resources"]["limits"]["memory"]
    assert limit.endswith("Gi") or limit.endswith("Mi"), limit
    return int(limit[:-2]) * (1024**3 if limit.endswith("Gi") else 1024**2)


def _peak_rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) * 1024


def _say(saver: KafkaSaver, thread: str, word: str) -> None:
    """One turn of the victim's agent on `thread`."""

    class State(TypedDict):
        said: list[str]

    def speak(state: State) -> dict[str, list[str]]:
        return {"said": [*state.get("said", []), word]}

    builder = StateGraph(State)
    builder.add_node("speak", speak)
    builder.add_edge(START, "speak")
    builder.add_edge("speak", END)
    builder.compile(checkpointer=saver).invoke({"said": []}, {"configurable": {"thread_id": thread}})


def test_a_hostile_producer_harms_no_other_tenant_and_stops_no_partition(
    stack: Any, two_tenants: TenantApi, db: psycopg.Connection
) -> None:
    settings: Settings = stack.settings
    partitions = range(settings.topic_partitions)
    run = uuid.uuid4().hex[:8]
    conversation, memories = f"conv-{run}", ("memories", run)
    projector_pid = stack.pids()["projector"]
    victim_saver = KafkaSaver(two_tenants.settings(VICTIM))
    victim_store = KafkaStore(two_tenants.settings(VICTIM))
    with victim_saver, victim_store:
        # The victim's data before the attack: a conversation turn and a memory, in the projection.
        _say(victim_saver, conversation, "before")
        victim_store.put(memories, "old", {"said": "before"})
        stored_thread = f"{VICTIM}/{conversation}"

        def projected(thread: str, words: int) -> bool:
            row = db.execute(
                "SELECT count(*) FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = ''", (thread,)
            ).fetchone()
            return row is not None and row[0] >= words

        wait_until(lambda: projected(stored_thread, TURN), WAIT_S, "the victim's first turn in the projection")

        async def attack() -> float:
            victim, evil = Agent(two_tenants.settings(VICTIM), VICTIM), Agent(two_tenants.settings(EVIL), EVIL)
            try:
                # What anyone reads in the log: the victim's thread's record key and subject reference.
                thread_key, _, thread_headers = await victim.sealed(put(stored_thread, 99))
                thread_ref = dict(thread_headers)[envelope.HEADER_SUBJECT].decode()
                thread_partition = (murmur2(thread_key) & 0x7FFFFFFF) % settings.topic_partitions
                *_, store_headers = await victim.sealed(store_put((VICTIM, *memories), "old", {"said": "forged"}))
                namespace_ref = dict(store_headers)[envelope.HEADER_SUBJECT].decode()
                ck, st = settings.checkpoint_topic, settings.store_topic
                hostile: list[Produced] = []
                for topic in (ck, st):
                    for p in partitions:
                        hostile.append((topic, p, None, *_plain(TenantErase(VICTIM))))  # a forged tenant erasure
                        hostile.append((topic, p, os.urandom(16), *_plain(put("x", 1), version=99)))  # no version
                hostile += [
                    (ck, thread_partition, thread_key, *_plain(ThreadErase(thread_ref))),  # a forged thread erasure
                    *[(st, p, None, *_plain(NamespaceErase(namespace_ref))) for p in partitions],
                    # The victim's thread and memory in the clear, for a deployment that seals.
                    (ck, thread_partition, thread_key, *_plain(put(stored_thread, 50))),
                    (ck, thread_partition, thread_key, *_plain(ThreadCopyBarrier(stored_thread, 0, 2**62))),
                    (st, 0, b"forged", *_plain(store_put((VICTIM, *memories), "old", {"said": "forged"}))),
                ]
                # Sealed with the attacker's own keys: claiming the victim's thread inside the seal, and its
                # own thread with a barrier at 2^62 (which parks only that thread).
                evil_thread = f"{EVIL}/x-{run}"
                evil_ref, evil_key = evil.data_key(evil_thread)
                for tenant, name in ((VICTIM, stored_thread), (EVIL, stored_thread)):
                    forged = seal(
                        to_envelope(put(stored_thread, 51)),
                        SealedSubject(evil_ref, "thread", tenant, name),
                        cipher_of(evil_key),
                    )
                    hostile.append(
                        (ck, thread_partition, thread_key, envelope.encode(forged), envelope.headers_for(forged))
                    )
                evil_barrier = await evil.sealed(ThreadCopyBarrier(evil_thread, 1, 2**62))
                hostile.append((ck, (murmur2(evil_barrier[0]) & 0x7FFFFFFF) % settings.topic_partitions, *evil_barrier))
                await _send(settings, hostile)
                await produce_batch(settings, ck, 0, zstd_bomb(2 * 1024**3))  # 2 GB of zeros in ~120 KB
                # Then, on every partition, another subject of the victim's: it must apply within MOVE_ON_S.
                sentinels = [(ck, p, *await victim.sealed(put(f"{VICTIM}/sentinel-{run}-{p}", 1))) for p in partitions]
                sentinels += [
                    (st, p, *await victim.sealed(store_put((VICTIM, "sentinel", run, str(p)), "k", {"p": p})))
                    for p in partitions
                ]
                await _send(settings, sentinels)
                return time.monotonic()
            finally:
                await victim.close()
                await evil.close()

        started = datetime.now(UTC).isoformat()
        sent = asyncio.run(attack())

        def behind() -> list[str]:
            """The sentinels not applied yet, as `topic:partition`."""
            checkpoints = db.execute(
                "SELECT thread_id FROM checkpoints WHERE starts_with(thread_id, %s)", (f"{VICTIM}/sentinel-{run}-",)
            ).fetchall()
            items = db.execute(
                "SELECT prefix FROM store WHERE starts_with(prefix, %s)", (f"{VICTIM}.sentinel.{run}.",)
            ).fetchall()
            done = {f"{ck}:{t.rsplit('-', 1)[1]}" for (t,) in checkpoints} | {
                f"{st}:{prefix.rsplit('.', 1)[1]}" for (prefix,) in items
            }
            return [f"{topic}:{p}" for topic in (ck, st) for p in partitions if f"{topic}:{p}" not in done]

        ck, st = settings.checkpoint_topic, settings.store_topic
        try:
            wait_until(lambda: not behind(), sent + MOVE_ON_S - time.monotonic(), "every partition's other subjects")
        except TimeoutError:
            projector_log = (stack.log_dir / "projector.log").read_text().splitlines()[-40:]
            raise AssertionError(
                f"partitions {behind()}: their other subjects did not move on within {MOVE_ON_S:g}s\n"
                + "\n".join(projector_log)
            ) from None

        # The victim: its old data and its keys are there, and its new writes apply.
        _say(victim_saver, conversation, "after")
        victim_store.put(memories, "new", {"said": "after"})
        wait_until(lambda: projected(stored_thread, 2 * TURN), WAIT_S, "the victim's turn after the attack")
        state = victim_saver.get_tuple({"configurable": {"thread_id": conversation}})
        assert state is not None and state.checkpoint["channel_values"]["said"] == ["after"]
        history = list(victim_saver.list({"configurable": {"thread_id": conversation}}))
        # Both turns' checkpoints, newest first, and nothing else.
        assert [c.metadata["step"] for c in history] == list(range(2 * TURN - 2, -2, -1)), history
        assert (victim_store.get(memories, "old") or _missing()).value == {"said": "before"}
        assert (victim_store.get(memories, "new") or _missing()).value == {"said": "after"}

    # The projector never crashed, and stayed under the memory limit the chart gives it.
    assert stack.pids()["projector"] == projector_pid
    assert _peak_rss_bytes(projector_pid) < _memory_limit_bytes()

    # What `graphledger` reports: the attacker's parked subjects and the dead letters.
    parked = [
        p for p in _graphledger(stack, "parked", "list", "--json", "--limit", "10000") if p["parked_at"] > started
    ]
    causes = [p["cause"] for p in parked]
    assert causes.count("newer_version") == 2 * len(partitions) and causes.count("beyond_log") == 1, parked
    letters = _graphledger(stack, "dlq", "list", "--json", "--limit", "10000")
    reasons = [letter["reason"] for letter in letters if letter["recorded_at"] > started]
    assert sum("the key store records no erasure" in r for r in reasons) == 3 * len(partitions) + 1, reasons
    assert sum("in the clear names a subject's data" in r for r in reasons) == 3, reasons
    assert any("of another tenant than its key's" in r for r in reasons)
    assert any("outside that tenant" in r for r in reasons)
    assert any(r.startswith("unreadable record batch") and "zstd" in r for r in reasons)


def _missing() -> Any:
    raise AssertionError("the victim's item is missing")
