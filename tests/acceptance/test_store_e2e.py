"""KafkaStore end to end on the dev stack: writes through Kafka and the projector, reads through the read API.

Each test works under its own namespace root, so the session's shared stack needs no cleanup.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.store.base import BaseStore, GetOp, PutOp, SearchOp
from typing_extensions import TypedDict

from graphledger import KafkaSaver, KafkaStore
from graphledger.embeddings import HashEmbedder
from graphledger.settings import Settings


def _dims(settings: Settings) -> int:
    """The projection's vector size, `GRAPHLEDGER_STORE_VECTOR_DIMS`: the embedder must match it."""
    return int(settings.store_vector_dims)  # type: ignore[attr-defined]


def _index(settings: Settings, fields: list[str] | None = None) -> dict[str, Any]:
    dims = _dims(settings)
    return {"dims": dims, "embed": HashEmbedder(dims), "fields": fields or ["text"]}


@pytest.fixture
def root() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def store(stack: Any) -> Iterator[KafkaStore]:
    with KafkaStore(stack.settings, index=_index(stack.settings)) as s:  # type: ignore[arg-type]
        yield s


def test_put_get_delete_round_trip(store: KafkaStore, root: str) -> None:
    ns = (root, "docs")
    assert store.get(ns, "a") is None
    store.put(ns, "a", {"text": "first", "n": 1, "nested": {"x": [1, "two", None, True, 2.5]}})
    first = store.get(ns, "a")
    assert first is not None
    assert (first.namespace, first.key) == (ns, "a")
    assert first.value == {"text": "first", "n": 1, "nested": {"x": [1, "two", None, True, 2.5]}}
    assert first.created_at.tzinfo is not None and first.updated_at >= first.created_at

    store.put(ns, "a", {"text": "second"})
    second = store.get(ns, "a")
    assert second is not None and second.value == {"text": "second"}
    assert second.created_at == first.created_at  # kept on update
    assert second.updated_at >= first.updated_at

    store.delete(ns, "a")
    assert store.get(ns, "a") is None


async def test_async_round_trip_and_batch_results_in_op_order(stack: Any, root: str) -> None:
    ns = (root, "async")
    async with KafkaStore(stack.settings) as store:
        await asyncio.gather(*(store.aput(ns, f"k{i}", {"i": i}) for i in range(5)))
        items = await asyncio.gather(*(store.aget(ns, f"k{i}") for i in range(5)), store.aget(ns, "missing"))
        assert [None if i is None else i.value for i in items] == [{"i": i} for i in range(5)] + [None]
        results = await store.abatch(
            [GetOp(ns, "k1"), PutOp(ns, "k9", {"i": 9}), SearchOp(ns, {"i": {"$gte": 3}}), GetOp(ns, "k9")]
        )
        assert results[0].value == {"i": 1}  # type: ignore[union-attr]
        assert results[1] is None
        assert sorted(r.key for r in results[2]) == ["k3", "k4"]  # type: ignore[union-attr]
        assert results[3] is None  # a batch's reads do not see its own writes
        assert (await store.aget(ns, "k9")).value == {"i": 9}  # type: ignore[union-attr]


def test_search_with_filters(store: KafkaStore, root: str) -> None:
    ns = (root, "filter")
    rows = {
        "a": {"text": "alpha", "n": 1, "kind": "x", "meta": {"lang": "en", "v": 1}},
        "b": {"text": "beta", "n": 2, "kind": "y", "meta": {"lang": "fr", "v": 2}},
        "c": {"text": "gamma", "n": 3, "kind": "x", "meta": {"lang": "en", "v": 3}},
    }
    for key, value in rows.items():
        store.put(ns, key, value)
    store.put((root, "elsewhere"), "d", {"text": "delta", "n": 1, "kind": "x"})

    def keys(**kwargs: Any) -> list[str]:
        return sorted(item.key for item in store.search(ns, **kwargs))

    assert keys() == ["a", "b", "c"]
    assert keys(filter={"kind": "x"}) == ["a", "c"]
    assert keys(filter={"kind": {"$eq": "y"}}) == ["b"]
    assert keys(filter={"kind": {"$ne": "x"}}) == ["b"]
    assert keys(filter={"n": {"$gt": 1}}) == ["b", "c"]
    assert keys(filter={"n": {"$gte": 2}}) == ["b", "c"]
    assert keys(filter={"n": {"$lt": 2}}) == ["a"]
    assert keys(filter={"n": {"$lte": 2}}) == ["a", "b"]
    assert keys(filter={"n": {"$gt": 1, "$lte": 2}}) == ["b"]
    assert keys(filter={"meta": {"lang": "en"}}) == ["a", "c"]
    assert keys(filter={"kind": "x", "n": {"$gt": 1}}) == ["c"]
    assert sorted(i.key for i in store.search((root,), filter={"n": 1})) == ["a", "d"]

    # Without a query: most recently updated first, paged after ordering.
    ordered = store.search(ns)
    assert [i.updated_at for i in ordered] == sorted((i.updated_at for i in ordered), reverse=True)
    assert all(i.score is None for i in ordered)
    paged = store.search(ns, limit=2) + store.search(ns, limit=2, offset=2)
    assert sorted(i.key for i in paged) == ["a", "b", "c"]


def test_search_with_a_query_ranks_by_similarity(store: KafkaStore, root: str) -> None:
    ns = (root, "memories")
    store.put(ns, "pizza", {"text": "I like pizza with anchovies"})
    store.put(ns, "dog", {"text": "My dog is called Rex"})
    store.put(ns, "market", {"text": "The stock market fell"})
    found = store.search(ns, query="pizza anchovies", limit=3)
    assert found[0].key == "pizza"
    assert all(i.score is not None for i in found)
    assert [i.score for i in found] == sorted((i.score for i in found), reverse=True)  # type: ignore[type-var]
    # Cosine similarity, as AsyncPostgresStore scores by default (halfvec storage rounds a little).
    assert found[0].score == pytest.approx(_cosine(store, "pizza anchovies", "I like pizza with anchovies"), abs=5e-3)
    assert store.search(ns, query="dog Rex", limit=1)[0].key == "dog"
    assert [i.key for i in store.search(ns, query="pizza", filter={"text": "My dog is called Rex"})] == ["dog"]

    # An update re-embeds: the item now scores as its new text does.
    store.put(ns, "pizza", {"text": "Quarterly report about markets"})
    after = {i.key: i.score for i in store.search(ns, query="pizza anchovies", limit=3)}
    assert after["pizza"] == pytest.approx(
        _cosine(store, "pizza anchovies", "Quarterly report about markets"), abs=5e-3
    )
    assert after["pizza"] < found[0].score - 0.2  # type: ignore[operator]


def _cosine(store: KafkaStore, query: str, text: str) -> float:
    assert store.embeddings is not None
    a, b = store.embeddings.embed_query(query), store.embeddings.embed_query(text)
    return sum(x * y for x, y in zip(a, b, strict=True))  # HashEmbedder vectors have unit length


def test_items_without_vectors_fill_the_tail_of_a_query_search(store: KafkaStore, root: str) -> None:
    ns = (root, "tail")
    store.put(ns, "indexed", {"text": "pizza"})
    store.put(ns, "unindexed", {"text": "pizza"}, index=False)
    found = store.search(ns, query="pizza", limit=10)
    assert [(i.key, i.score is None) for i in found] == [("indexed", False), ("unindexed", True)]


def test_list_namespaces(store: KafkaStore, root: str) -> None:
    for ns in [(root, "a", "x"), (root, "a", "y", "deep"), (root, "b", "x"), (root, "c")]:
        store.put(ns, "k", {"text": "v"})
    assert store.list_namespaces(prefix=(root,)) == sorted(
        [(root, "a", "x"), (root, "a", "y", "deep"), (root, "b", "x"), (root, "c")]
    )
    assert store.list_namespaces(prefix=(root, "a")) == [(root, "a", "x"), (root, "a", "y", "deep")]
    assert store.list_namespaces(prefix=(root, "*", "x")) == [(root, "a", "x"), (root, "b", "x")]
    assert store.list_namespaces(prefix=(root,), suffix=("x",)) == [(root, "a", "x"), (root, "b", "x")]
    assert store.list_namespaces(prefix=(root,), max_depth=2) == [(root, "a"), (root, "b"), (root, "c")]
    assert store.list_namespaces(prefix=(root,), max_depth=2, limit=1, offset=1) == [(root, "b")]


# -- the cross-thread memory example of LangGraph's persistence guide ----------------------------------


class ChatState(TypedDict):
    message: str
    recalled: list[str]


@dataclass
class UserContext:
    user_id: str


def remember(state: ChatState, runtime: Runtime[UserContext]) -> dict[str, Any]:
    """Writes the message as a memory through `runtime.store`."""
    assert runtime.store is not None
    namespace = ("users", runtime.context.user_id, "memories")
    runtime.store.put(namespace, str(uuid.uuid4()), {"text": state["message"]})
    return {}


async def recall(state: ChatState, config: RunnableConfig, *, store: BaseStore) -> dict[str, Any]:
    """Finds the memories closest to the message through the injected `store`."""
    user_id = config["configurable"]["user_id"]
    found = await store.asearch(("users", user_id, "memories"), query=state["message"], limit=2)
    return {"recalled": [item.value["text"] for item in found]}


def _memory_graph(saver: KafkaSaver, store: KafkaStore) -> Any:
    graph = StateGraph(ChatState, context_schema=UserContext)
    graph.add_node(remember)
    graph.add_node(recall)
    graph.add_conditional_edges(START, lambda s: "remember" if s["message"].startswith("remember") else "recall")
    graph.add_edge("remember", END)
    graph.add_edge("recall", END)
    return graph.compile(checkpointer=saver, store=store)


async def test_a_memory_written_in_one_thread_is_found_by_query_in_another(stack: Any) -> None:
    user_id = f"u{uuid.uuid4().hex[:8]}"
    settings = stack.settings
    async with KafkaSaver(settings) as saver, KafkaStore(settings, index=_index(settings)) as store:
        graph = _memory_graph(saver, store)
        context = UserContext(user_id)
        for message in ["remember: I like pizza with anchovies", "remember: my sister lives in Lyon"]:
            config = {"configurable": {"thread_id": str(uuid.uuid4()), "user_id": user_id}}
            # Thread 1 (and a second): sync invoke, so the node's store.put takes the plain-thread path.
            await asyncio.to_thread(graph.invoke, {"message": message, "recalled": []}, config, context=context)

        thread_2 = {"configurable": {"thread_id": str(uuid.uuid4()), "user_id": user_id}}
        out = await graph.ainvoke({"message": "which pizza do I like?", "recalled": []}, thread_2, context=context)
        assert out["recalled"][0] == "remember: I like pizza with anchovies"

        # Another user's namespace holds nothing of it.
        other = {"configurable": {"thread_id": str(uuid.uuid4()), "user_id": "someone-else"}}
        out = await graph.ainvoke({"message": "pizza", "recalled": []}, other, context=UserContext("someone-else"))
        assert out["recalled"] == []
        assert len(await store.asearch(("users", user_id, "memories"))) == 2
