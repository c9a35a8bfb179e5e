"""KafkaStore's client side without a server: validation, the events it publishes, embedding, what it asks
the read API and how it decodes the answers, micro-batching.

Publishing goes to `FakeTopics` and reads to `FakeReadApi`, which answers `/v1/store/batch` with canned
results and records every request (`fakes.py`). The events on a real broker are
`integration/test_store_client_kafka.py`; `acceptance/test_store_e2e.py` runs the same client against the
dev stack's read API.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
)

from fakes import FakeReadApi, FakeTopics, client_settings
from graphledger import KafkaStore
from graphledger.embeddings import HashEmbedder
from graphledger.errors import InvalidInputError, ReadApiError
from graphledger.events.store import StoreDelete, StorePut, StoreRefresh
from graphledger.settings import Settings
from graphledger.wire import CONSISTENCY_HEADER, SEARCH_CONSISTENCY_HEADER, parse_token

DIMS = 64
T0 = "2025-01-02T03:04:05.123456+00:00"
T1 = "2025-01-02T03:04:06+00:00"


def _item(namespace: list[str], key: str, value: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"namespace": namespace, "key": key, "value": value, "created_at": T0, "updated_at": T1, **extra}


EXPIRES = "2999-01-01T00:00:00+00:00"


def _default_answer(op: dict[str, Any]) -> Any:
    if op["op"] == "get":  # an item with a TTL, unless its key says otherwise
        expires = None if op["key"].startswith("no-ttl") else EXPIRES
        return _item(op["namespace"], op["key"], {"k": op["key"]}, expires_at=expires)
    if op["op"] == "search":
        return [_item([*op["namespace_prefix"], "x"], "a", {"n": 1}, score=0.5, expires_at=EXPIRES)]
    return [["a", "b"], ["a", "c"]]


@pytest.fixture
def api() -> Iterator[FakeReadApi]:
    server = FakeReadApi(_default_answer)
    yield server
    server.close()


@pytest.fixture
def settings(topics: FakeTopics, api: FakeReadApi) -> Settings:
    """Settings of a store publishing to `topics` and reading from `api`."""
    return client_settings(api.url)


@pytest.fixture
async def store(settings: Settings) -> Any:
    async with KafkaStore(settings) as s:
        yield s


@pytest.fixture
async def indexed(settings: Settings) -> Any:
    index = {"dims": DIMS, "embed": HashEmbedder(DIMS), "fields": ["text", "tags[*]"]}
    async with KafkaStore(settings, index=index) as s:
        yield s


# -- bad input: a clear error, nothing published, nothing read -------------------------------------


class _Weird:
    pass


BAD_NAMESPACES = [(), ("a.b",), ("a", ""), ("a", 1), ("langgraph", "x"), ("a\x00",), "users"]


@pytest.mark.parametrize("namespace", BAD_NAMESPACES)
async def test_invalid_namespaces_raise_langgraphs_error_and_publish_nothing(
    topics: FakeTopics, settings: Settings, store: KafkaStore, api: FakeReadApi, namespace: Any
) -> None:
    with pytest.raises(InvalidNamespaceError):
        await store.aput(namespace, "k", {"a": 1})
    with pytest.raises(InvalidNamespaceError):
        await asyncio.to_thread(store.put, namespace, "k", {"a": 1})
    with pytest.raises(InvalidNamespaceError):
        await store.abatch([PutOp(("ok",), "k", {"a": 1}), PutOp(namespace, "k", {"a": 1})])
    assert topics.records == []
    assert api.requests == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([1, 2], "store value must be a dict, got list"),
        ("text", "store value must be a dict, got str"),
        (7, "store value must be a dict, got int"),
        ({"a": "x\x00y"}, r"store value\.a contains a NUL character"),
        ({"deep": [{"b": ["\x00"]}]}, r"store value\.deep\[0\]\.b\[0\] contains a NUL"),
        ({"k\x00": 1}, "key 'k\\\\x00' contains a NUL"),
        ({"a": "\ud800"}, "lone surrogate"),
        ({"a": float("nan")}, "nan, which JSON cannot hold"),
        ({"a": [float("inf")]}, "inf, which JSON cannot hold"),
        ({"a": _Weird()}, "_Weird, which is not JSON-serializable"),
        ({"a": {1, 2}}, "set, which is not JSON-serializable"),
    ],
)
async def test_bad_values_are_refused_and_publish_nothing(
    topics: FakeTopics, settings: Settings, store: KafkaStore, api: FakeReadApi, value: Any, message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        await store.aput(("ns",), "k", value)
    with pytest.raises(InvalidInputError, match=message):
        await asyncio.to_thread(store.batch, [PutOp(("ns",), "ok", {"a": 1}), PutOp(("ns",), "k", value)])
    assert topics.records == []
    assert api.requests == []


@pytest.mark.parametrize(
    ("filter", "message"),
    [
        ({"a": {"$in": [1, 2]}}, r"Unsupported operator: '\$in'"),
        ({"a": {"$gt": 1, "b": 2}}, "Unsupported operator: 'b'"),
        ({"a": {"nested": {"$regex": "x"}}}, r"Unsupported operator: '\$regex' in filter\.a\.nested"),
        ({"a": "x\x00"}, "contains a NUL"),
        ({"a": {"$eq": float("nan")}}, "nan"),
        ({"a": {"$gt": [1]}}, r"filter\.a\.\$gt is \[1\]"),
        ("a=1", "filter is 'a=1': not a dict"),
        ({1: "a"}, "filter has a key 1: not a string"),
    ],
)
async def test_bad_filters_are_refused_and_publish_nothing(
    topics: FakeTopics, settings: Settings, store: KafkaStore, api: FakeReadApi, filter: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        await store.asearch(("ns",), filter=filter)
    with pytest.raises(InvalidInputError, match=message):
        await store.abatch([PutOp(("ns",), "k", {"a": 1}), SearchOp(("ns",), filter)])
    assert topics.records == []
    assert api.requests == []


async def test_a_query_without_an_index_is_refused_and_publishes_nothing(
    topics: FakeTopics, settings: Settings, store: KafkaStore, api: FakeReadApi
) -> None:
    with pytest.raises(InvalidInputError, match="search with a query needs a KafkaStore built with index"):
        await store.asearch(("ns",), query="pizza")
    with pytest.raises(InvalidInputError, match="needs a KafkaStore built with index"):
        await asyncio.to_thread(store.batch, [PutOp(("ns",), "k", {"a": 1}), SearchOp(("ns",), query="pizza")])
    assert topics.records == []
    assert api.requests == []


@pytest.mark.parametrize(
    ("op", "error", "message"),
    [
        (PutOp(("ns",), "k\x00", {"a": 1}), InvalidInputError, "store key 'k\\\\x00' contains a NUL"),
        (PutOp(("ns",), 3.5, {"a": 1}), InvalidInputError, "store key must be a str, got float"),  # type: ignore[arg-type]
        (PutOp(("ns",), "k", {"a": 1}, index="text"), InvalidInputError, "index must be False, None or a list"),  # type: ignore[arg-type]
        (PutOp(("ns",), "k", {"a": 1}, ttl=float("inf")), InvalidInputError, "ttl must be a finite number"),
        (SearchOp(("ns",), limit=-1), InvalidInputError, "limit must be an int from 0"),
        (ListNamespacesOp(max_depth=-2), InvalidInputError, "max_depth must be an int from 0"),
        (
            ListNamespacesOp(match_conditions=(MatchCondition("infix", ("a",)),)),  # type: ignore[arg-type]
            InvalidInputError,
            "Unsupported match type",
        ),
        (GetOp(("a.b",), "k"), InvalidNamespaceError, "cannot contain periods"),
    ],
)
async def test_other_bad_ops_fail_the_whole_batch_before_anything_happens(
    topics: FakeTopics,
    settings: Settings,
    store: KafkaStore,
    api: FakeReadApi,
    op: Any,
    error: type[Exception],
    message: str,
) -> None:
    with pytest.raises(error, match=message):
        await store.abatch([PutOp(("ns",), "ok", {"a": 1}), GetOp(("ns",), "ok"), op])
    assert topics.records == []
    assert api.requests == []


async def test_ttl_puts_carry_their_minutes_and_refreshing_reads_publish_coalesced_refreshes(
    topics: FakeTopics,
    settings: Settings,
) -> None:
    hourly = settings.model_copy(update={"store_refresh_coalesce_s": 3600})
    async with KafkaStore(hourly, ttl={"default_ttl": 2.5}) as store:
        assert store.supports_ttl is True
        await store.aput(("ns",), "default", {"a": 1})
        await store.aput(("ns",), "short", {"a": 1}, ttl=0.02)
        await asyncio.to_thread(store.put, ("ns",), "none", {"a": 1}, ttl=None)
        for _ in range(3):  # refresh_on_read defaults to True with a TTL config: one refresh per window
            await store.aget(("ns",), "hot")
        await store.aget(("ns",), "quiet", refresh_ttl=False)
        await store.aget(("ns",), "no-ttl")  # nothing to refresh: the answer has no expires_at
        await store.asearch(("ns",))  # the fake API returns item ("ns", "x") / "a"
    events = topics.events()
    puts = {e.item_key: e.ttl_minutes for e in events if isinstance(e, StorePut)}
    assert puts == {"default": 2.5, "short": 0.02, "none": None}
    refreshed = sorted((e.namespace, e.item_key) for e in events if isinstance(e, StoreRefresh))
    assert refreshed == [(("ns",), "hot"), (("ns", "x"), "a")]


async def test_a_ttl_beyond_the_int_column_is_refused(store: KafkaStore) -> None:
    with pytest.raises(InvalidInputError, match=r"ttl 3000000000\.0 minutes is beyond"):
        await store.aput(("ns",), "k", {"a": 1}, ttl=3e9)


async def test_an_embedder_with_the_wrong_dims_fails_before_publishing(
    topics: FakeTopics, settings: Settings, api: FakeReadApi
) -> None:
    async with KafkaStore(settings, index={"dims": DIMS + 1, "embed": HashEmbedder(DIMS)}) as store:
        with pytest.raises(InvalidInputError, match=f"vector of {DIMS} dims; the index has dims={DIMS + 1}"):
            await store.aput(("ns",), "k", {"text": "hello"})
        with pytest.raises(InvalidInputError, match="query vector"):
            await store.asearch(("ns",), query="hello")
    assert topics.records == []
    assert api.requests == []


def test_an_index_needs_positive_dims_and_an_embedder() -> None:
    with pytest.raises(InvalidInputError, match="dims must be a positive int"):
        KafkaStore(Settings(), index={"embed": HashEmbedder(4)})  # type: ignore[typeddict-item]
    with pytest.raises(ValueError, match="embed must be provided"):
        KafkaStore(Settings(), index={"dims": 4})


# -- writes: the events on the topic ----------------------------------------------------------------


async def test_puts_carry_vectors_named_as_asyncpostgresstore_names_them(
    topics: FakeTopics, settings: Settings, indexed: KafkaStore, api: FakeReadApi
) -> None:
    embed = HashEmbedder(DIMS)
    value = {"text": "I like pizza", "tags": ["food", "italy"], "other": "ignored"}
    await indexed.aput(("users", "u1"), "default-fields", value)
    await indexed.aput(("users", "u1"), "override", value, index=["other", "tags[-1]"])
    await indexed.aput(("users", "u1"), "not-indexed", value, index=False)
    await indexed.aput(("users", "u1"), "nothing-to-embed", {"unrelated": 1})
    await indexed.adelete(("users", "u1"), "gone")
    published = [(r.partition, r.key, r.event) for r in topics.records]
    events = {event.item_key: (partition, key, event) for partition, key, event in published}

    default = events["default-fields"][2]
    assert isinstance(default, StorePut)
    assert default.namespace == ("users", "u1")
    assert json.loads(default.value_json) == value
    assert default.ttl_minutes is None
    assert default.vectors is not None
    assert [path for path, _ in default.vectors] == ["text", "tags[*].0", "tags[*].1"]
    vectors = dict(default.vectors)
    assert vectors["text"] == pytest.approx(embed.embed_query("I like pizza"))
    assert vectors["tags[*].1"] == pytest.approx(embed.embed_query("italy"))

    override = events["override"][2]
    assert isinstance(override, StorePut) and override.vectors is not None
    assert [path for path, _ in override.vectors] == ["other", "tags[-1]"]
    assert events["not-indexed"][2].vectors is None  # type: ignore[union-attr]
    assert events["nothing-to-embed"][2].vectors == ()  # type: ignore[union-attr]
    assert events["gone"][2] == StoreDelete(("users", "u1"), "gone")
    for _, kafka_key, event in events.values():
        assert kafka_key == event.key
    assert api.requests == []  # writes alone ask the read API nothing


async def test_a_store_without_index_publishes_puts_without_vectors(
    topics: FakeTopics, settings: Settings, store: KafkaStore
) -> None:
    await store.aput(("docs",), "a", {"text": "x"}, index=["text"])  # ignored without an index, as in LangGraph
    await asyncio.to_thread(store.put, ("docs",), 42, {"text": "y"})  # type: ignore[arg-type]
    events = {e.item_key: e for e in topics.events()}
    assert events["a"].vectors is None and events["42"].vectors is None  # type: ignore[union-attr]


async def test_embed_accepts_sync_and_async_functions(topics: FakeTopics, settings: Settings) -> None:
    embed = HashEmbedder(8)
    calls: list[str] = []

    def sync_embed(texts: list[str]) -> list[list[float]]:
        calls.append("sync")
        return embed.embed_documents(list(texts))

    async def async_embed(texts: list[str]) -> list[list[float]]:
        calls.append("async")
        return embed.embed_documents(list(texts))

    for fn in (sync_embed, async_embed):
        async with KafkaStore(settings, index={"dims": 8, "embed": fn}) as store:
            await store.aput(("ns",), fn.__name__, {"text": "hello"})
    await asyncio.to_thread(_sync_put, settings, sync_embed)
    assert calls == ["sync", "async", "sync"]
    events = {e.item_key: e for e in topics.events()}
    assert set(events) == {"sync_embed", "async_embed", "from-thread"}
    for event in events.values():
        assert isinstance(event, StorePut)
        assert dict(event.vectors or ())["$"] == pytest.approx(embed.embed_query('{"text": "hello"}'))


def _sync_put(settings: Settings, fn: Callable[[list[str]], list[list[float]]]) -> None:
    with KafkaStore(settings, index={"dims": 8, "embed": fn}) as store:
        store.put(("ns",), "from-thread", {"text": "hello"})


# -- reads: what goes to the read API and how answers decode ----------------------------------------


async def test_reads_send_the_contract_bodies_and_decode_items(indexed: KafkaStore, api: FakeReadApi) -> None:
    item = await indexed.aget(("users", "u1"), "k1")
    assert item is not None
    assert (item.namespace, item.key, item.value) == (("users", "u1"), "k1", {"k": "k1"})
    assert item.created_at == datetime(2025, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    assert item.updated_at == datetime(2025, 1, 2, 3, 4, 6, tzinfo=UTC)

    found = await indexed.asearch(("users",), query="pizza", filter={"n": {"$gte": 1}}, limit=3, offset=1)
    assert [(r.namespace, r.key, r.score) for r in found] == [(("users", "x"), "a", 0.5)]
    plain = await indexed.asearch(("users",))
    assert plain[0].score == 0.5

    namespaces = await indexed.alist_namespaces(prefix=("a", "*"), suffix=("c",), max_depth=2, limit=5, offset=1)
    assert namespaces == [("a", "b"), ("a", "c")]

    assert api.ops() == [
        [{"op": "get", "namespace": ["users", "u1"], "key": "k1"}],
        [
            {
                "op": "search",
                "namespace_prefix": ["users"],
                "limit": 3,
                "offset": 1,
                "filter": {"n": {"$gte": 1}},
                "query_vector": pytest.approx(HashEmbedder(DIMS).embed_query("pizza")),
            }
        ],
        [{"op": "search", "namespace_prefix": ["users"], "limit": 10, "offset": 0}],
        [{"op": "list_namespaces", "limit": 5, "offset": 1, "max_depth": 2, "prefix": ["a", "*"], "suffix": ["c"]}],
    ]
    assert all(path == "/v1/store/batch" for path, _, _ in api.requests)


async def test_missing_items_and_empty_answers_decode(store: KafkaStore, api: FakeReadApi) -> None:
    api.answer = lambda op: None if op["op"] == "get" else []
    assert await store.aget(("a",), "missing") is None
    assert await store.asearch(("a",)) == []
    assert await store.alist_namespaces() == []


async def test_reads_need_no_token_the_read_api_finds_acknowledged_writes_in_the_log(
    store: KafkaStore, api: FakeReadApi
) -> None:
    await store.aput(("a",), "k", {"v": 1})
    await store.aget(("a",), "k")
    await store.asearch(("a",))
    assert store.consistency_token
    for _, headers, _ in api.requests:
        sent = {h.lower() for h in headers}
        assert CONSISTENCY_HEADER.lower() not in sent and SEARCH_CONSISTENCY_HEADER.lower() not in sent


async def test_an_own_writes_store_sends_its_token_and_level(settings: Settings, api: FakeReadApi) -> None:
    async with KafkaStore(settings, search_consistency="own_writes") as store:
        await store.asearch(("a",))
        assert CONSISTENCY_HEADER.lower() not in {h.lower() for h in api.requests[0][1]}  # nothing written yet
        await store.aput(("a",), "k", {"v": 1})
        await store.asearch(("a",))
        headers = {h.lower(): v for h, v in api.requests[1][1].items()}
        assert headers[SEARCH_CONSISTENCY_HEADER.lower()] == "own_writes"
        token = parse_token(headers[CONSISTENCY_HEADER.lower()])
        assert token == store.consistency_token
        assert {topic for topic, _ in token} == {store.settings.store_topic}


def test_an_unknown_search_consistency_is_refused(settings: Settings) -> None:
    with pytest.raises(InvalidInputError, match="search_consistency"):
        KafkaStore(settings, search_consistency="eventual")  # type: ignore[arg-type]


async def test_a_batch_reads_before_it_writes(settings: Settings, api: FakeReadApi) -> None:
    # As in InMemoryStore and AsyncPostgresStore, a batch's reads do not see its own writes: the read
    # goes out before the put is published, so it carries no token of it (an own-writes store sends one).
    async with KafkaStore(settings, search_consistency="own_writes") as store:
        results = await store.abatch([PutOp(("a",), "k", {"v": 1}), GetOp(("a",), "k")])
        assert results[0] is None and results[1] is not None
        assert CONSISTENCY_HEADER.lower() not in {h.lower() for h in api.requests[0][1]}
        assert store.consistency_token  # the put was published after the read


async def test_several_conditions_of_one_kind_merge_or_answer_empty(store: KafkaStore, api: FakeReadApi) -> None:
    both = ListNamespacesOp(
        match_conditions=(MatchCondition("prefix", ("a", "*")), MatchCondition("prefix", ("*", "b", "c")))
    )
    never = ListNamespacesOp(match_conditions=(MatchCondition("suffix", ("x",)), MatchCondition("suffix", ("y",))))
    results = await store.abatch([both, never])
    assert results[1] == []
    assert api.ops() == [[{"op": "list_namespaces", "limit": 100, "offset": 0, "prefix": ["a", "b", "c"]}]]


# -- micro-batching --------------------------------------------------------------------------------


async def test_gathered_async_reads_share_one_request_and_ask_duplicates_once(
    store: KafkaStore, api: FakeReadApi
) -> None:
    keys = ["a", "b", "c", "a", "b"]
    items = await asyncio.gather(*(store.aget(("ns",), k) for k in keys), store.alist_namespaces())
    assert [i.key for i in items[:5]] == keys  # type: ignore[union-attr]
    assert items[5] == [("a", "b"), ("a", "c")]
    assert len(api.requests) == 1
    assert [op.get("key") for op in api.ops()[0]] == ["a", "b", "c", None]

    # Searches with a filter (unhashable ops) deduplicate too.
    await asyncio.gather(*(store.asearch(("ns",), filter={"x": {"$gt": 1}}) for _ in range(3)))
    assert len(api.requests) == 2 and len(api.ops()[1]) == 1


async def test_gathered_puts_to_one_key_publish_only_the_last(
    topics: FakeTopics, settings: Settings, store: KafkaStore
) -> None:
    await asyncio.gather(*(store.aput(("ns",), "same", {"i": i}) for i in range(5)), store.aput(("ns",), "other", {}))
    events = topics.events()
    assert sorted((e.item_key, json.loads(e.value_json)) for e in events) == [  # type: ignore[union-attr]
        ("other", {}),
        ("same", {"i": 4}),
    ]


async def test_a_bad_call_fails_alone_and_does_not_poison_its_tick(store: KafkaStore, api: FakeReadApi) -> None:
    good, bad = await asyncio.gather(
        store.aget(("ns",), "k"), store.aput(("ns",), "k", {"a": "\x00"}), return_exceptions=True
    )
    assert good.key == "k"  # type: ignore[union-attr]
    assert isinstance(bad, InvalidInputError)
    assert len(api.requests) == 1


async def test_a_failing_batch_fails_every_caller_of_its_tick(store: KafkaStore, api: FakeReadApi) -> None:
    def boom(op: dict[str, Any]) -> Any:
        raise RuntimeError("server bug")

    api.answer = boom
    results = await asyncio.gather(store.aget(("ns",), "a"), store.aget(("ns",), "b"), return_exceptions=True)
    assert isinstance(results[0], ReadApiError) and "server bug" in str(results[0])
    assert results[0] is results[1]
    assert len(api.requests) == 1


async def test_cancelled_callers_are_left_out_of_the_batch(store: KafkaStore, api: FakeReadApi) -> None:
    # Tasks run in creation order: the first queues its op and schedules the tick's flush, the second
    # cancels the first (whose op is then already queued) and queues its own before the flush runs.
    task = asyncio.ensure_future(store.aget(("ns",), "cancelled"))

    async def cancel_then_get() -> Any:
        task.cancel()
        return await store.aget(("ns",), "kept")

    kept = await asyncio.ensure_future(cancel_then_get())
    assert kept is not None and kept.key == "kept"
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [op["key"] for ops in api.ops() for op in ops] == ["kept"]


def test_sync_calls_from_threads_and_several_event_loops(settings: Settings, api: FakeReadApi) -> None:
    with KafkaStore(settings) as store:
        assert store.get(("ns",), "sync").key == "sync"  # type: ignore[union-attr]

        def in_own_loop(key: str) -> str:
            async def main() -> str:
                item = await store.aget(("ns",), key)
                return item.key  # type: ignore[union-attr]

            return asyncio.run(main())

        threads_results: list[str] = []
        workers = [threading.Thread(target=lambda k=k: threads_results.append(in_own_loop(k))) for k in "xyz"]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert sorted(threads_results) == ["x", "y", "z"]
    assert len(api.requests) == 4
