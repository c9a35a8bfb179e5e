"""Erasure end to end (docs/security.md), on a dev stack of its own with two tenants.

- Sentinel strings in graph state, pending writes, metadata, store values and embedded text reach no
  Kafka record (key, value, header, chunk) of any topic, from the first write on.
- After `graphledger erase thread|namespace|tenant`, the erased subjects' sentinels are in no row of
  the projection (dead letters and stored chunks included), their keys are gone, and
  `graphledger replay` rebuilds exactly the live projection from the same log.
- Agent processes (separate OS processes, with their own `KafkaSaver`/`KafkaStore`) that hold a
  subject's key are refused once it is erased; a write racing the erasure is refused or erased,
  never readable.
- A tenant's token cannot obtain another tenant's keys.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiokafka import TopicPartition

from agent_pods import AgentPod
from graphledger import KafkaSaver, KafkaStore
from graphledger.embeddings import HashEmbedder
from graphledger.erasure.sealer import EventSealer
from graphledger.erasure.sealing import SealedSubject, cipher_of, seal, sealed_ref
from graphledger.erasure.subjects import LABEL_SEPARATOR, reference, thread_subject
from graphledger.events import envelope, to_envelope
from graphledger.events.chunks import frame
from graphledger.events.envelope import Envelope
from graphledger.events.erasure import TenantErase, ThreadErase
from graphledger.events.store import StorePut
from graphledger.settings import Settings
from graphledger.tenancy import scoped_namespace, scoped_thread
from graphledger_server.keys.key_store import Erasure, key_store_for
from graphledger_server.keys.source import StoreKeySource
from kafka_clients import raw_consumer, raw_producer
from polling import wait_for
from projection_helpers import cid
from projection_helpers import put as projection_put
from tenant_stack import TenantStack, Victim, chat_graph, tenant_stack, victim_thread

pytestmark = pytest.mark.slow

KEY_CACHE_TTL_S = 600.0
"""Longer than any test: a process that is refused learned of the erasure, its key did not expire."""
SHORT_KEY_CACHE_TTL_S = 2.0
WAIT_S = 90.0


def sentinel(what: str) -> str:
    return f"SENTINEL-{what}-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def erasable() -> Iterator[TenantStack]:
    with tenant_stack(key_cache_ttl_s=KEY_CACHE_TTL_S) as stack:
        yield stack


# -- reading back everything ------------------------------------------------------------------------


async def kafka_records(settings: Settings) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]:
    """Every record of every topic of the deployment (checkpoints, store, dead letters), from offset 0
    up to the high watermark each partition's fetch reports (tansu's listed end offsets run low)."""
    topics = (settings.checkpoint_topic, settings.store_topic, settings.dead_letter_topic)
    consumer = raw_consumer(settings)
    await consumer.start()
    try:
        partitions = [
            TopicPartition(topic, p) for topic in topics for p in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        if not partitions:
            await consumer._client.force_metadata_update()
            partitions = [
                TopicPartition(topic, p) for topic in topics for p in sorted(consumer.partitions_for_topic(topic) or ())
            ]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        records = []
        open_ = set(partitions)
        deadline = time.monotonic() + WAIT_S
        while open_:
            assert time.monotonic() < deadline, f"the log was not read to its end: {sorted(map(str, open_))}"
            batches = await consumer.getmany(*open_, timeout_ms=500)
            for batch in batches.values():
                records.extend((r.key, r.value, list(r.headers)) for r in batch)
            for tp in list(open_):
                end = consumer.highwater(tp)
                if end is not None and await consumer.position(tp) >= end:
                    open_.discard(tp)
        return records
    finally:
        await consumer.stop()


def found_in_log(records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]], text: str) -> bool:
    needle = text.encode()
    for key, value, headers in records:
        parts = [key or b"", value or b""] + [h.encode() for h, _ in headers] + [v or b"" for _, v in headers]
        if any(needle in part for part in parts):
            return True
    return False


async def projection_text(settings: Settings) -> str:
    """Every row of every table of the projection schema as text (bytea as hex), dead letters and
    stored chunks included."""
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        tables = await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = $1 AND table_type = 'BASE TABLE'",
            settings.postgres_schema,
        )
        out = []
        for row in tables:
            rows = await conn.fetch(f'SELECT t::text AS row FROM {settings.postgres_schema}."{row["table_name"]}" t')
            out.extend(r["row"] for r in rows)
        return "\n".join(out)
    finally:
        await conn.close()


def in_projection(text: str, rows: str) -> bool:
    """Whether `text` is in the rows, as text (jsonb, text) or inside a bytea (hex)."""
    return text in rows or text.encode().hex() in rows


# -- the log holds no content -------------------------------------------------------------------------


async def test_no_sentinel_reaches_any_kafka_record(erasable: TenantStack) -> None:
    state, metadata, stored, embedded = (sentinel(w) for w in ("state", "metadata", "stored", "embedded"))
    thread = f"alice@example.com-{uuid.uuid4().hex[:8]}"  # an identifier: not even the record key shows it
    label = f"bob@example-com-{uuid.uuid4().hex[:8]}"  # namespace labels hold no periods
    large = " ".join([state] * 40_000)  # beyond max_message_bytes: published as chunks
    settings = erasable.client("acme")
    dims = erasable.dev.settings.store_vector_dims
    assert dims is not None
    async with (
        KafkaSaver(settings) as saver,
        KafkaStore(settings, index={"dims": dims, "embed": HashEmbedder(dims)}) as store,
    ):
        graph = chat_graph(saver)
        config = {"configurable": {"thread_id": thread}, "metadata": {"note": metadata}}
        await graph.ainvoke({"messages": [state]}, config)
        await graph.ainvoke({"messages": [large]}, config)
        await store.aput(("users", label), "profile", {"text": embedded, "secret": stored})
        # Read back through the projection: the content is there, only the log does not show it.
        assert (await graph.aget_state(config)).values["messages"][0] == state
        assert (await store.aget(("users", label), "profile")).value["secret"] == stored  # type: ignore[union-attr]
        hits = await store.asearch(("users", label), query=embedded)
        assert [h.key for h in hits] == ["profile"]

    # A control written in the clear by a client with sealing off is found: the scan sees every record.
    control = sentinel("control")
    async with KafkaSaver(erasable.client("acme", encrypt_events=False)) as clear:
        await chat_graph(clear).ainvoke({"messages": [control]}, {"configurable": {"thread_id": f"clear-{control}"}})

    records = await kafka_records(settings)
    assert found_in_log(records, control)
    for text in (state, metadata, stored, embedded, thread, label):
        assert not found_in_log(records, text), f"{text} is in the log"
    assert any(any(h == "gl-chunk" for h, _ in headers) for _, _, headers in records), "no chunked event was written"


async def test_a_sealed_event_refused_for_its_content_leaves_that_content_in_no_log_file(erasable: TenantStack) -> None:
    """Its dead-letter reason quotes the bad value; the reason stays in Postgres (where an erasure drops
    it), and the services' log files, like the dead-letter topic, only name the subject."""
    secret = sentinel("reason")
    settings = erasable.client("acme")
    bad = StorePut(scoped_namespace("acme", ("users", f"has.{secret}")), "k", b"{}", None, None)  # '.' is refused
    ref = await seal_and_send(erasable, settings, bad, "acme", only_first_chunk=False)
    query = f"SELECT reason FROM {settings.postgres_schema}.graphledger_dead_letters WHERE subject_ref = $1"

    async def dead_lettered() -> bool:
        conn = await asyncpg.connect(settings.postgres_dsn)
        try:
            return secret in (await conn.fetchval(query, ref) or "")
        finally:
            await conn.close()

    await wait_for(dead_lettered, "the sealed event to be dead-lettered with its reason", timeout_s=WAIT_S)
    logs = {path.name: path.read_text(errors="replace") for path in erasable.dev.log_dir.glob("*.log")}
    assert [name for name, text in logs.items() if secret in text] == []
    assert "projector.log" in logs and ref in logs["projector.log"], "the refusal was not logged"
    assert not found_in_log(await kafka_records(settings), secret)


# -- erase, then nothing is left and a replay equals the live projection -----------------------------


async def seal_and_send(
    erasable: TenantStack, settings: Settings, event: Any, tenant: str, *, only_first_chunk: bool
) -> str:
    """Publish `event` sealed as a client would, straight to the store topic, and return its subject's
    reference: a bad event becomes a dead letter; with `only_first_chunk`, a large one leaves a stored
    chunk that never completes."""
    pool = await asyncpg.create_pool(erasable.dev.settings.postgres_dsn, min_size=1, max_size=1)
    producer = raw_producer(settings)
    await producer.start()
    try:
        key_store = key_store_for(erasable.dev.settings, pool)
        assert key_store is not None
        sealer = EventSealer(StoreKeySource(key_store, erasable.dev.settings), KEY_CACHE_TTL_S)
        key, sealed = await sealer.seal(event, tenant)
        ref = sealed_ref(sealed)
        assert ref is not None
        records = frame(envelope.encode(sealed), envelope.headers_for(sealed), 10_000, sealed.event_id)
        if only_first_chunk:
            assert len(records) > 1
            records = records[:1]
        for record in records:
            await producer.send_and_wait(
                settings.store_topic, record.value, key=key.encode() if key else None, headers=record.headers
            )
        return ref
    finally:
        await producer.stop()
        await pool.close()


async def test_erasing_a_thread_a_namespace_and_a_tenant_leaves_nothing_and_replay_agrees(
    erasable: TenantStack,
) -> None:
    run = uuid.uuid4().hex[:8]
    erased = {w: sentinel(w) for w in ("thread", "copied", "namespace", "tenant", "tenant-item")}
    kept = {w: sentinel(w) for w in ("thread", "item", "sibling")}
    acme, beta = erasable.client("acme"), erasable.client("beta")
    dims = erasable.dev.settings.store_vector_dims
    assert dims is not None
    index = {"dims": dims, "embed": HashEmbedder(dims)}
    gone_thread, copy, kept_thread, beta_thread = (f"{w}-{run}" for w in ("gone", "copy", "kept", "beta"))
    gone_ns, kept_ns = ("users", f"42-{run}"), ("users", f"43-{run}")
    async with KafkaSaver(acme) as saver, KafkaStore(acme, index=index) as store:  # type: ignore[arg-type]
        graph = chat_graph(saver)
        await graph.ainvoke({"messages": [erased["thread"]]}, {"configurable": {"thread_id": gone_thread}})
        await saver.acopy_thread(gone_thread, copy)
        await graph.ainvoke({"messages": [erased["copied"]]}, {"configurable": {"thread_id": copy}})
        await graph.ainvoke({"messages": [kept["thread"]]}, {"configurable": {"thread_id": kept_thread}})
        await store.aput(gone_ns, "a", {"text": erased["namespace"]})
        await store.aput((*gone_ns, "deeper"), "b", {"text": erased["namespace"]})
        await store.aput(kept_ns, "a", {"text": kept["item"]})
        await store.aput(("users",), "sibling", {"text": kept["sibling"]})
        # A sealed event of the erased namespace that is dead-lettered (its vector has the wrong dims),
        # and the first chunk of one that never completes.
        stored_ns = scoped_namespace("acme", gone_ns)
        bad = StorePut(stored_ns, "bad", json.dumps({"text": erased["namespace"]}).encode(), None, (("text", (1.0,)),))
        ref = await seal_and_send(erasable, acme, bad, "acme", only_first_chunk=False)
        big = StorePut(
            stored_ns, "big", json.dumps({"text": " ".join([erased["namespace"]] * 2000)}).encode(), None, None
        )
        assert await seal_and_send(erasable, acme, big, "acme", only_first_chunk=True) == ref
        assert (await graph.aget_state({"configurable": {"thread_id": copy}})).values["messages"][0] == erased["thread"]
    async with KafkaSaver(beta) as beta_saver, KafkaStore(beta, index=index) as beta_store:  # type: ignore[arg-type]
        await chat_graph(beta_saver).ainvoke(
            {"messages": [erased["tenant"]]}, {"configurable": {"thread_id": beta_thread}}
        )
        await beta_store.aput(("users", run), "x", {"text": erased["tenant-item"]})

    settings = erasable.dev.settings

    async def traces(ref: str) -> tuple[int, int]:
        """The dead letters and stored chunks of the subject `ref` (sealed: no sentinel shows in them)."""
        conn = await asyncpg.connect(settings.postgres_dsn)
        try:
            schema = settings.postgres_schema
            letters = f"SELECT count(*) FROM {schema}.graphledger_dead_letters WHERE subject_ref = $1"
            chunks = f"SELECT count(*) FROM {schema}.graphledger_chunks WHERE subject_ref = $1"
            return await conn.fetchval(letters, ref), await conn.fetchval(chunks, ref)
        finally:
            await conn.close()

    async def everything_projected() -> bool:
        rows = await projection_text(settings)
        projected = all(in_projection(text, rows) for text in [*erased.values(), *kept.values()])
        return projected and await traces(ref) == (1, 1)

    await wait_for(everything_projected, "every sentinel to be projected (the check below can fail)", timeout_s=WAIT_S)

    erasable.graphledger("erase", "thread", gone_thread, "--tenant", "acme", "--by", "test")
    erasable.graphledger("erase", "namespace", *gone_ns, "--tenant", "acme", "--by", "test")
    report = json.loads(erasable.graphledger("erase", "tenant", "beta", "--by", "test", "--json"))
    assert report["erased"] == [{"kind": "tenant", "ref": "beta"}]

    left: list[str] = []

    async def erased_rows_gone() -> bool:
        rows = await projection_text(settings)
        left[:] = [what for what, text in erased.items() if in_projection(text, rows)]
        if await traces(ref) != (0, 0):
            left.append("the namespace's dead letter or chunk")
        return not left

    try:
        await wait_for(
            erased_rows_gone, "the erased subjects' rows, dead letters and chunks to be dropped", timeout_s=WAIT_S
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; left: {left}") from None
    rows = await projection_text(settings)
    assert all(in_projection(text, rows) for text in kept.values()), "an erasure dropped another subject's rows"

    # Their keys are gone (tombstones), and the audit table says who erased what.
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        keys = settings.key_store_schema
        # A tombstone for each erased subject (the thread, its copy, the namespace), and none of their
        # keys left: neither their own nor the fresh keys writers bound to them.
        tombstones = await conn.fetch(f"SELECT ref FROM {keys}.data_keys WHERE wrapped IS NULL")
        assert len(tombstones) >= 3
        live_bound = f"SELECT count(*) FROM {keys}.fresh_keys WHERE ref = ANY($1::text[]) AND wrapped IS NOT NULL"
        assert await conn.fetchval(live_bound, [r["ref"] for r in tombstones]) == 0
        for table in ("data_keys", "fresh_keys"):
            live = f"SELECT count(*) FROM {keys}.{table} WHERE tenant = 'beta' AND wrapped IS NOT NULL"
            assert await conn.fetchval(live) == 0, f"a live key of the erased tenant in {table}"
        assert await conn.fetchval(f"SELECT wrapped FROM {keys}.tenant_keys WHERE tenant = 'beta'") is None
        audit = await conn.fetch(f"SELECT kind, tenant, erased_by FROM {keys}.erasures ORDER BY id")
        assert {(r["kind"], r["tenant"], r["erased_by"]) for r in audit} >= {
            ("thread", "acme", "test"),
            ("namespace", "acme", "test"),
            ("tenant", "beta", "test"),
        }
    finally:
        await conn.close()

    # Reads answer as for subjects that never existed; the rest reads as before.
    async with KafkaSaver(acme) as saver, KafkaStore(acme) as store:
        assert await saver.aget_tuple({"configurable": {"thread_id": gone_thread}}) is None
        assert await saver.aget_tuple({"configurable": {"thread_id": copy}}) is None
        kept_state = await chat_graph(saver).aget_state({"configurable": {"thread_id": kept_thread}})
        assert kept_state.values["messages"][0] == kept["thread"]
        assert await store.aget(gone_ns, "a") is None
        assert (await store.aget(kept_ns, "a")).value == {"text": kept["item"]}  # type: ignore[union-attr]

    # The same log rebuilt into a fresh schema equals the live projection, table by table.
    out = erasable.graphledger("replay", "run", "--no-switch")
    assert "rebuilt" in out


async def test_erasing_a_namespace_shorter_than_the_subjects_erases_the_subjects_below_it(
    erasable: TenantStack,
) -> None:
    """With subjects of two labels, `("org",)` is the subject of the items right in it, and erasing it
    erases `("org", "team")` (and what is below that) too, each under its own key: a replay agrees."""
    run = uuid.uuid4().hex[:8]
    org, kept = f"org-{run}", f"keep-{run}"
    erased = {w: sentinel(w) for w in ("top", "team", "deep")}
    survivor = sentinel("kept")
    async with KafkaStore(erasable.client("acme")) as store:
        await store.aput((org,), "top", {"text": erased["top"]})
        await store.aput((org, "team"), "x", {"text": erased["team"]})
        await store.aput((org, "team", "deep"), "y", {"text": erased["deep"]})
        await store.aput((kept, "team"), "z", {"text": survivor})
        assert (await store.aget((org, "team", "deep"), "y")) is not None
    settings = erasable.dev.settings
    rows = await projection_text(settings)
    assert all(in_projection(text, rows) for text in [*erased.values(), survivor])

    report = json.loads(erasable.graphledger("erase", "namespace", org, "--tenant", "acme", "--json"))
    assert len(report["erased"]) == 2  # ("acme", org) and ("acme", org, "team")

    async def gone() -> bool:
        rows = await projection_text(settings)
        return not any(in_projection(text, rows) for text in erased.values())

    await wait_for(gone, "the items of the namespace and of those below it to be dropped", timeout_s=WAIT_S)
    assert in_projection(survivor, await projection_text(settings))
    erasable.graphledger("replay", "run", "--no-switch")


# -- writers that hold a key ---------------------------------------------------------------------------


def test_an_agent_holding_the_key_is_refused_after_the_erasure(erasable: TenantStack, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:8]
    thread = f"held-{run}"
    pod = AgentPod("holder", erasable.agent_env("acme"), tmp_path)
    try:
        assert pod.call("turn", thread=thread, text="hello")["ok"]
        erasable.graphledger("erase", "thread", thread, "--tenant", "acme")
        # Its key is cached for KEY_CACHE_TTL_S, far longer than this test: the turn's read tells it.
        refused = pod.call("turn", thread=thread, text="again")
        assert not refused["ok"] and "SubjectErasedError" in refused["error"], refused
        assert not refused["retryable"]
        assert pod.call("turn", thread=f"other-{run}", text="hello")["ok"]  # other threads carry on
    finally:
        pod.close()


async def test_writes_racing_an_erasure_are_refused_or_erased_never_readable(
    erasable: TenantStack, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    thread, namespace = f"racing-{run}", ("users", f"racing-{run}")
    env = erasable.agent_env("acme", key_cache_ttl_s=str(SHORT_KEY_CACHE_TTL_S))
    pod = AgentPod("racer", env, tmp_path)
    try:
        assert pod.call("turn", thread=thread, text="first")["ok"]
        assert pod.call("store_put", namespace=list(namespace), key="k0", value={"n": 0})["ok"]
        turns = [pod.send("turn", thread=thread, text=f"turn {i}") for i in range(20)]
        puts = [
            pod.send("store_put", namespace=list(namespace), key=f"k{i + 1}", value={"n": i + 1}) for i in range(20)
        ]
        await asyncio.to_thread(erasable.graphledger, "erase", "thread", thread, "--tenant", "acme")
        await asyncio.to_thread(erasable.graphledger, "erase", "namespace", *namespace, "--tenant", "acme")
        answers = [await asyncio.to_thread(pod.answer, command) for command in [*turns, *puts]]
        for answer in answers:
            assert answer["ok"] or "SubjectErasedError" in answer["error"], answer
        # Once refused, a writer stays refused: its next turn is refused at once, and its store writes
        # once its cached key expires (SHORT_KEY_CACHE_TTL_S); until then they are sealed under the
        # destroyed key.
        refused = pod.call("turn", thread=thread, text="after")
        assert not refused["ok"] and "SubjectErasedError" in refused["error"], refused

        async def put_refused() -> bool:
            answer = await asyncio.to_thread(pod.call, "store_put", namespace=list(namespace), key="late", value={})
            return not answer["ok"] and "SubjectErasedError" in answer["error"]

        await wait_for(put_refused, "the store write to be refused once the cached key expired", timeout_s=WAIT_S)
    finally:
        pod.close()

    # Every write above was acknowledged; reads reflect all of them (consistent reads), and none is readable.
    async with KafkaSaver(erasable.client("acme")) as saver, KafkaStore(erasable.client("acme")) as store:
        assert await saver.aget_tuple({"configurable": {"thread_id": thread}}) is None
        assert await store.asearch(namespace, limit=100) == []
        for i in range(21):
            assert await store.aget(namespace, f"k{i}") is None


async def test_a_write_whose_key_was_erased_under_it_reads_as_erased_never_as_before_it(
    erasable: TenantStack, tmp_path: Path
) -> None:
    """An eraser records the erasure in the key store, then publishes its events, and can die in between.
    A turn acknowledged before the erasure, opened neither by the projector nor by the read API before
    its key was destroyed, must not vanish from a thread that still reads as its earlier turn: another
    pod (holding the key and the earlier turn) reads the thread as erased, through the read API's
    read-through while the projector is down, and from the projection after."""
    run = uuid.uuid4().hex[:8]
    thread = f"under-{run}"
    stored = scoped_thread("acme", thread)
    writer = AgentPod("writer", erasable.agent_env("acme"), tmp_path)
    reader = AgentPod("reader", erasable.agent_env("acme"), tmp_path)
    settings = erasable.dev.settings
    pool = await asyncpg.create_pool(settings.postgres_dsn, min_size=1, max_size=1)
    try:
        assert writer.call("turn", thread=thread, text="first")["ok"]
        assert reader.call("state", thread=thread)["messages"] == ["first", "reply to first"]

        async def projected() -> bool:
            query = f"SELECT count(*) FROM {settings.postgres_schema}.checkpoints WHERE thread_id = $1"
            return bool(await pool.fetchval(query, stored))

        await wait_for(projected, "the first turn to be projected", timeout_s=WAIT_S)
        erasable.dev.stop_api()  # the key caches of the read API and of the projector go with them
        erasable.dev.start_api()
        erasable.dev.kill_projector(signal.SIGTERM)
        assert writer.call("turn", thread=thread, text="second")["ok"]
        keys = key_store_for(settings, pool)
        assert keys is not None
        ref = reference(await keys.hash_key("acme"), thread_subject("acme", stored))
        await keys.erase(Erasure("thread", "acme", ref), "an eraser that died before publishing")

        # The read API finds the second turn's key erased: it waits for the projector, which is down
        # (and rejoins its group slowly on tansu): the read is erased, or retryably refused.
        answer = reader.call("state", thread=thread)
        refused = not answer["ok"] and answer["retryable"] and "consistency_timeout" in answer["error"]
        assert refused or answer["messages"] == [], answer
        erasable.dev.start_projector()
        assert reader.call("state", thread=thread)["messages"] == []
        await wait_for(lambda: _not(projected()), "the projection to drop the thread", timeout_s=WAIT_S)
    finally:
        if not erasable.dev.children["projector"].running:
            erasable.dev.start_projector()
        writer.close()
        reader.close()
        await pool.close()


async def test_a_forged_erasure_is_dead_lettered_and_erases_nothing(erasable: TenantStack) -> None:
    """A producer with write access publishes erasures no eraser asked for: a `thread.erase` naming a
    thread's reference (its record key, which anyone reading Kafka sees) and a `tenant.erase` of its
    tenant, on every partition. The key store records neither, so the projector dead-letters them, and
    the victim's checkpoints, old and new, stay readable."""
    run = uuid.uuid4().hex[:8]
    thread = f"victim-{run}"
    stored = scoped_thread("acme", thread)
    settings = erasable.dev.settings
    pool = await asyncpg.create_pool(settings.postgres_dsn, min_size=1, max_size=1)
    schema = settings.postgres_schema
    producer = raw_producer(settings)
    await producer.start()
    try:
        async with KafkaSaver(erasable.client("acme")) as saver:
            graph = chat_graph(saver)
            config = {"configurable": {"thread_id": thread}}
            await graph.ainvoke({"messages": ["before"]}, config)
            ref = saver._runtime.record_key_of_thread(thread)
            assert ref is not None
            forged: list[tuple[str, Any]] = [(settings.checkpoint_topic, ThreadErase(ref.decode()))]
            forged += [(topic, TenantErase("acme")) for topic in (settings.checkpoint_topic, settings.store_topic)]
            offsets = []
            for topic, event in forged:
                env = to_envelope(event)
                for partition in range(settings.topic_partitions):
                    sent = await producer.send_and_wait(
                        topic, envelope.encode(env), key=ref, partition=partition, headers=envelope.headers_for(env)
                    )
                    offsets.append((topic, partition, sent.offset))

            async def dead_lettered() -> bool:
                query = (
                    f'SELECT count(*) FROM {schema}.graphledger_dead_letters WHERE (topic, partition, "offset") IN '
                    "(SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[])) AND reason LIKE '%records no erasure%'"
                )
                found = await pool.fetchval(query, *map(list, zip(*offsets, strict=True)))
                return bool(found == len(offsets))

            await wait_for(dead_lettered, "every forged erasure to be dead-lettered", timeout_s=WAIT_S)
            await graph.ainvoke({"messages": ["after"]}, config)
        async with KafkaSaver(erasable.client("acme")) as reader:
            state = await chat_graph(reader).aget_state(config)
            assert state.values["messages"] == ["before", "reply to before", "after", "reply to after"]
        checkpoints = f"SELECT count(*) FROM {schema}.checkpoints WHERE thread_id = $1"
        assert await pool.fetchval(checkpoints, stored) > 0
    finally:
        await producer.stop()
        await pool.close()


CHECKPOINT_ROWS = "SELECT count(*) FROM {schema}.checkpoints WHERE thread_id = $1 AND checkpoint_id = $2"


async def _forge(erasable: TenantStack, victim: Victim, forged: Envelope, forged_id: str, words: str) -> None:
    """Publish `forged` (a put of checkpoint `forged_id`) among the victim's records; wait for its dead
    letter, whose reason names `words`, and check that acme reads its thread as before and that the
    forged checkpoint has no row."""
    settings = erasable.dev.settings
    schema = settings.postgres_schema
    sent = await victim.producer.send_and_wait(
        settings.checkpoint_topic, envelope.encode(forged), key=victim.record_key, headers=envelope.headers_for(forged)
    )

    async def dead_lettered() -> bool:
        reason = await victim.pool.fetchval(
            f"SELECT reason FROM {schema}.graphledger_dead_letters "
            'WHERE topic = $1 AND partition = $2 AND "offset" = $3',
            settings.checkpoint_topic,
            sent.partition,
            sent.offset,
        )
        return reason is not None and words in reason

    await wait_for(dead_lettered, f"the forged record to be dead-lettered ({words})", timeout_s=WAIT_S)
    async with KafkaSaver(erasable.client("acme")) as reader:
        state = await chat_graph(reader).aget_state(victim.config)
        assert state.values["messages"] == ["mine", "reply to mine"]
    assert await victim.pool.fetchval(CHECKPOINT_ROWS.format(schema=schema), victim.stored, forged_id) == 0


async def test_an_event_sealed_with_another_tenants_key_is_dead_lettered(erasable: TenantStack) -> None:
    """Another tenant's agent seals a put naming acme's thread under a key of its own, claiming acme's
    subject inside the seal, and publishes it among acme's records. The key store made that key for the
    other tenant, so the projector (and the read API's read-through) refuse it: acme's thread reads as
    before."""
    async with victim_thread(erasable, "victim") as victim:
        keys = key_store_for(erasable.dev.settings, victim.pool)
        assert keys is not None
        attacker = f"evil{uuid.uuid4().hex[:8]}"  # a tenant of its own (this module's other tests erase beta)
        own = scoped_thread(attacker, "x")
        evil_ref = reference(await keys.hash_key(attacker), thread_subject(attacker, own))
        evil_key = (await keys.data_keys([(evil_ref, thread_subject(attacker, own))]))[evil_ref]
        assert isinstance(evil_key, bytes)
        forged = seal(
            to_envelope(projection_put(victim.stored, 99)),
            SealedSubject(evil_ref, "thread", "acme", victim.stored),
            cipher_of(evil_key),
        )
        await _forge(erasable, victim, forged, cid(99), "another tenant than its key's")


async def test_an_event_in_the_clear_naming_a_sealed_tenants_thread_is_dead_lettered(erasable: TenantStack) -> None:
    """Any producer can publish a put in the clear naming acme's thread (its record key is in the log for
    anyone to read). It proves no key, so with encryption on the projector dead-letters it (replay and the
    read API's read-through decide the same: `admission.in_the_clear`); acme reads its thread as before and
    its next turn applies after it."""
    async with victim_thread(erasable, "victim-clear") as victim:
        clear = to_envelope(projection_put(victim.stored, 98))
        await _forge(erasable, victim, clear, cid(98), "in the clear while encryption is on")
        async with KafkaSaver(erasable.client("acme")) as writer:
            graph = chat_graph(writer)
            await graph.ainvoke({"messages": ["again"]}, victim.config)
            newest = (await graph.aget_state(victim.config)).config["configurable"]["checkpoint_id"]
        rows = CHECKPOINT_ROWS.format(schema=erasable.dev.settings.postgres_schema)

        async def next_turn_applied() -> bool:
            return await victim.pool.fetchval(rows, victim.stored, newest) == 1

        await wait_for(next_turn_applied, "acme's next turn to be applied after the forged put", timeout_s=WAIT_S)


async def _not(condition: Awaitable[bool]) -> bool:
    return not await condition


def test_a_token_gets_no_key_of_another_tenant(erasable: TenantStack) -> None:
    mine = erasable.post("/v1/keys", {"subjects": [{"kind": "thread", "name": "acme/t"}]}, "acme")
    assert mine.status_code == 200, mine.text
    for name in ("beta/t", "t", "acmex/t"):
        theirs = erasable.post("/v1/keys", {"subjects": [{"kind": "thread", "name": name}]}, "acme")
        assert theirs.status_code == 403, (name, theirs.text)
        assert "keys" not in theirs.json()
    beta_users = LABEL_SEPARATOR.join(("beta", "users", "1"))
    namespace = erasable.post("/v1/keys", {"subjects": [{"kind": "namespace", "name": beta_users}]}, "acme")
    assert namespace.status_code == 403, namespace.text
