"""The memory half of `graphledger dev --demo`: the persistence guide's memory store through `KafkaStore`.

As in the guide (LangGraph's persistence docs, "Memory store"): a user's memories live in the namespace
`(user_id, "memories")`; a graph compiled with a checkpointer and a store puts them from a node of one
thread (`update_memory`), and a node of another thread of the same user finds them by meaning
(`call_model`: `store.search(namespace, query=<the user's message>, limit=3)`). The index is the guide's,
`fields` `food_preference` and the whole memory (`$`), embedded in this process by `OnnxEmbedder`
(all-MiniLM-L6-v2, 384 dims, offline). A memory stored with `index=False` comes back too, without a score;
a search with a filter and one with a query and a filter follow. The same steps on `InMemorySaver` and
`InMemoryStore` with the same embedder must find the same memories with the same scores (pgvector keeps
vectors in single precision: scores agree to `SCORE_TOLERANCE`). Last, a memory put with a TTL of a few
seconds is read back, then shown expiring (`InMemoryStore` has no TTL to compare with).

No model runs: `call_model` answers with what it found, and `update_memory` keeps what the user said
about themself as a table (`MEMORIES`) instead of asking a model to extract it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from langgraph.graph import MessagesState

from graphledger.settings import Settings

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.graph import StateGraph
    from langgraph.store.base import BaseStore

FIELDS = ["food_preference", "$"]
"""What of a memory is embedded: the guide's `fields`."""
QUESTION = "What do I like to eat?"
DINNER = {"context": "Discussing dinner plans"}
MEMORIES: dict[str, tuple[dict[str, Any], list[str] | None]] = {
    "Hi! I like pizza.": ({"food_preference": "I like pizza"}, None),
    "We are discussing dinner plans: I love Italian cuisine.": (
        {"food_preference": "I love Italian cuisine", **DINNER},
        ["food_preference"],  # the guide's put with `index=[...]`: only this field is embedded
    ),
}
"""Thread 1's turns, and the memory (with its put's `index`) a model would extract from each."""
UNINDEXED = {"system_info": "Last updated: 2024-01-01"}
"""The guide's memory stored with `index=False`: found by a search, never by its meaning."""
SCORE_TOLERANCE = 1e-4
TTL_MINUTES = 0.05
"""The expiring memory's TTL: 3 seconds."""
EXPIRY_DEADLINE_S = 60.0
POLL_S = 0.2

Found = list[tuple[dict[str, Any], float | None]]
"""What a search found: each memory's value and score, best first."""


class MemoryState(MessagesState):
    recalled: list[dict[str, Any]]
    """What `call_model` found last: `{"value": ..., "score": ...}`, best first."""


@dataclass
class Run:
    """What one store (with its saver) found, step by step."""

    recalled: Found
    """What `call_model` found in thread 2 by the meaning of the user's question, read back from its state."""
    answer: str
    filtered: Found
    """`search(namespace, filter=DINNER)`."""
    both: Found
    """`search(namespace, query="dinner", filter=DINNER)`."""


def build_memory_graph() -> StateGraph[Any]:
    """START → call_model → update_memory → END, over the guide's `MessagesState` (plus what was recalled)."""
    from langgraph.graph import END, START, StateGraph

    workflow = StateGraph(MemoryState).add_sequence([call_model, update_memory])
    workflow.add_edge(START, "call_model")
    workflow.add_edge("update_memory", END)
    return workflow


def call_model(state: MemoryState, config: RunnableConfig, *, store: BaseStore) -> dict[str, Any]:
    """The guide's `call_model`: the memories nearest in meaning to the user's last message, as the answer."""
    from langchain_core.messages import AIMessage

    namespace = (config["configurable"]["user_id"], "memories")
    memories = store.search(namespace, query=str(state["messages"][-1].content), limit=3)
    info = "; ".join(str(d.value.get("food_preference", d.value)) for d in memories)
    return {
        "messages": [AIMessage(f"What I remember of you: {info or 'nothing yet'}")],
        "recalled": [{"value": d.value, "score": d.score} for d in memories],
    }


def update_memory(state: MemoryState, config: RunnableConfig, *, store: BaseStore) -> dict[str, Any]:
    """The guide's `update_memory`: a new memory under a new id, when the user said something about themself."""
    from langchain_core.messages import HumanMessage

    said = next(str(m.content) for m in reversed(state["messages"]) if isinstance(m, HumanMessage))
    if said in MEMORIES:
        memory, index = MEMORIES[said]
        namespace = (config["configurable"]["user_id"], "memories")
        store.put(namespace, str(uuid.uuid4()), memory, index=index)
    return {}


def run_memory_demo(settings: Settings, out: TextIO) -> list[str]:
    """The memory example through the stack and in memory; the differences found (empty: none).

    `ImportError` naming the extra to install when `OnnxEmbedder` cannot load."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.store.memory import InMemoryStore

    from graphledger import KafkaSaver, KafkaStore
    from graphledger.embeddings import OnnxEmbedder

    embedder = OnnxEmbedder()
    embedder.embed_query(QUESTION)  # loads the model, or fails naming the extra
    index: Any = {"dims": OnnxEmbedder.dims, "embed": embedder, "fields": FIELDS}
    print(
        f"\ndemo: the guide's memory store: KafkaStore(index={{'dims': {OnnxEmbedder.dims}, "
        f"'embed': OnnxEmbedder(), 'fields': {FIELDS}}}) and KafkaSaver, graph START → call_model → "
        "update_memory → END",
        file=out,
    )
    reference = _run(InMemorySaver(), InMemoryStore(index=index), f"reference-{uuid.uuid4().hex[:8]}", None)
    with KafkaSaver(settings) as saver, KafkaStore(settings, index=index) as store:
        user = f"demo-user-{uuid.uuid4().hex[:8]}"
        ours = _run(saver, store, user, out)
        expired = _expire(store, (user, "memories"), out)
    return _compare(ours, reference) + expired


def _run(saver: BaseCheckpointSaver[Any], store: BaseStore, user: str, out: TextIO | None) -> Run:
    say = _printer(out)
    namespace = (user, "memories")
    graph = build_memory_graph().compile(checkpointer=saver, store=store)
    first, second = (f"memory-{n}-{uuid.uuid4().hex[:8]}" for n in (1, 2))
    say(f"  thread {first!r}, user {user!r}: update_memory puts what the user says into {namespace!r}")
    for text in MEMORIES:
        graph.invoke({"messages": [{"role": "user", "content": text}]}, _config(first, user))
        memory, fields = MEMORIES[text]
        shown = f", index={fields!r}" if fields is not None else ""
        say(f"    user: {text!r:<60} → store.put(namespace, <uuid>, {memory!r}{shown})")
    store.put(namespace, str(uuid.uuid4()), UNINDEXED, index=False)
    say(f"    and from outside the graph:    store.put(namespace, <uuid>, {UNINDEXED!r}, index=False)")

    say(f"  thread {second!r}, same user: call_model searches the memories with the user's message")
    graph.invoke({"messages": [{"role": "user", "content": QUESTION}]}, _config(second, user))
    state = graph.get_state(_config(second, user)).values  # read back through the saver
    recalled = [(dict(found["value"]), found["score"]) for found in state["recalled"]]
    say(f"    user: {QUESTION!r} → store.search(namespace, query=..., limit=3) found, best first:")
    _show(say, recalled)
    answer = str(state["messages"][-1].content)
    say(f"    call_model: {answer!r}")
    filtered = [(dict(item.value), item.score) for item in store.search(namespace, filter=DINNER)]
    say(f"  store.search(namespace, filter={DINNER!r}):")
    _show(say, filtered)
    both = [(dict(item.value), item.score) for item in store.search(namespace, query="dinner", filter=DINNER)]
    say(f"  store.search(namespace, query='dinner', filter={DINNER!r}):")
    _show(say, both)
    return Run(recalled, answer, filtered, both)


def _expire(store: BaseStore, namespace: tuple[str, ...], out: TextIO) -> list[str]:
    """A memory with a TTL, read back at once and polled (reads that do not refresh it) until it is gone."""
    memory = {"food_preference": "Today I feel like sushi"}
    store.put(namespace, "today", memory, ttl=TTL_MINUTES)
    seconds = TTL_MINUTES * 60
    print(f"  store.put(namespace, 'today', {memory!r}, ttl={TTL_MINUTES}): {seconds:g} seconds to live", file=out)
    item = store.get(namespace, "today", refresh_ttl=False)
    print(f"    get right away  → {item.value if item else None!r}", file=out)
    if item is None or item.value != memory:
        return [f"memory: the memory with a TTL read back as {item!r}, not {memory!r}"]
    started = time.monotonic()
    while store.get(namespace, "today", refresh_ttl=False) is not None:
        if time.monotonic() - started > EXPIRY_DEADLINE_S:
            return [f"memory: the memory with a {seconds:g} s TTL was still there after {EXPIRY_DEADLINE_S:g} s"]
        time.sleep(POLL_S)  # polling what the demo shows, with a deadline
    found = [item.key for item in store.search(namespace, limit=10)]
    print(
        f"    get after {time.monotonic() - started:.1f} s → None: expired (reads hide it at once, the sweeper "
        f"deletes it); a search finds {len(found)} memories, none of them 'today'",
        file=out,
    )
    return ["memory: the expired memory is still found by a search"] if "today" in found else []


def _compare(ours: Run, reference: Run) -> list[str]:
    problems = []
    for label, mine, theirs in (
        ("call_model's search", ours.recalled, reference.recalled),
        ("the filtered search", ours.filtered, reference.filtered),
        ("the search with query and filter", ours.both, reference.both),
    ):
        if not _same(mine, theirs):
            problems.append(f"memory: {label} found {mine!r} where InMemoryStore found {theirs!r}")
    if ours.answer != reference.answer:
        problems.append(
            f"memory: call_model answered {ours.answer!r} where with InMemoryStore it answered {reference.answer!r}"
        )
    if len(ours.recalled) != 3 or ours.recalled[-1] != (UNINDEXED, None):
        problems.append(
            f"memory: call_model found {ours.recalled!r}: not both food memories and, last, the unindexed one"
        )
    return problems


def _same(mine: Found, theirs: Found) -> bool:
    return len(mine) == len(theirs) and all(
        a == b and (x is None) == (y is None) and (x is None or y is None or abs(x - y) <= SCORE_TOLERANCE)
        for (a, x), (b, y) in zip(mine, theirs, strict=True)
    )


def _show(say: Callable[[str], None], found: Found) -> None:
    for value, score in found:
        say(f"      {'-' if score is None else f'{score:.3f}':>6}  {value!r}")


def _config(thread_id: str, user_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "user_id": user_id}}


def _printer(out: TextIO | None) -> Callable[[str], None]:
    return (lambda line: print(line, file=out)) if out is not None else (lambda line: None)
