"""Store rows of `make bench`: KafkaStore beside AsyncPostgresStore with the same embedder and dims.

Puts (throughput at concurrency 1/16/64), searches (query, filter, both: p50 latency at concurrency 1
and throughput at 16/64), and recall@10 of the read API's HNSW search against exact search on two
corpora (`bench.corpus`).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
from langgraph.store.postgres.aio import AsyncPostgresStore

from bench.corpus import TOPICS, docstring_sentences, memory, templated_memories
from graphledger import KafkaStore
from graphledger.embeddings import HashEmbedder
from graphledger.errors import ConsistencyTimeoutError
from graphledger.settings import Settings
from graphledger_server.devstack.stack import DevStack

CONCURRENCY = (1, 16, 64)
DIMS = 256
"""The vector size of the store rows, as docs/performance.md's rows were measured: `HashEmbedder`'s default, not the
dev stack's (which suits `OnnxEmbedder`)."""
RECALL_QUERIES = 50
VECTOR_INDEX = "store_vectors_embedding_idx"


def index_config(dims: int) -> dict[str, Any]:
    return {"dims": dims, "embed": HashEmbedder(dims), "fields": ["text"]}


async def puts(store: Any, root: str, concurrency: int, total: int) -> float:
    rng = random.Random(concurrency)
    per_worker = max(1, total // concurrency)

    async def worker(w: int) -> None:
        for i in range(per_worker):
            await store.aput((root, f"w{w}"), f"k{i}", memory(rng, i))

    start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return per_worker * concurrency / (time.perf_counter() - start)


# Each worker asks its own question: identical concurrent searches would be de-duplicated by both
# stores' micro-batching and measure nothing.
SEARCH_LIMIT = 10
SEARCHES: dict[str, Callable[[Any, str, int], Awaitable[Any]]] = {
    "query": lambda store, root, w: store.asearch((root,), query=f"likes {TOPICS[w % 10]} #{w}", limit=SEARCH_LIMIT),
    "filter": lambda store, root, w: store.asearch((root,), filter={"rank": {"$gte": 90 - w % 90}}, limit=SEARCH_LIMIT),
    "both": lambda store, root, w: store.asearch(
        (root,), query=f"likes {TOPICS[w % 10]} #{w}", filter={"rank": {"$lt": 10 + w % 90}}, limit=SEARCH_LIMIT
    ),
}


class _Searches:
    """Latencies and short pages of one store's searches, over one or several runs."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.short = 0
        self.seconds = 0.0

    def p50(self) -> float:
        return statistics.median(self.latencies)

    def rate(self) -> float:
        return len(self.latencies) / self.seconds

    def short_share(self) -> float:
        return self.short / len(self.latencies)


async def _search(
    store: Any, root: str, kind: str, concurrency: int, total: int, into: _Searches, first: int = 0
) -> None:
    """Runs `total` searches (numbered from `first`) on `concurrency` workers, adding them to `into`.

    Every search of the bench has at least 10 matching items, so a short page is one the store's
    index search cut short (a filter rejected neighbours it did not scan past)."""
    per_worker = max(1, total // concurrency)

    async def worker(w: int) -> None:
        for i in range(per_worker):
            start = time.perf_counter()
            found = await SEARCHES[kind](store, root, first + w * per_worker + i)
            into.latencies.append((time.perf_counter() - start) * 1000)
            into.short += len(found) < SEARCH_LIMIT

    start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    into.seconds += time.perf_counter() - start


async def _compare_searches(
    ours: KafkaStore, official: AsyncPostgresStore, root: str, kind: str, concurrency: int, total: int
) -> tuple[_Searches, _Searches]:
    """(ours, official). At concurrency 1 the two alternate in rounds of 100 searches, so the
    machine's drift over the run (its speed moves by a fifth between minutes here) falls on both
    alike. Not shorter rounds: the first few searches after the other store's round are slower for
    both (caches gone cold while idle), for ours more (two processes idled, not one), so short rounds
    would measure that switch. Concurrent rows run each store once: their throughput needs the whole run."""
    mine, theirs = _Searches(), _Searches()
    rounds = max(1, total // 100) if concurrency == 1 else 1
    for r in range(rounds):
        first, n = r * (total // rounds), total // rounds
        await _search(official, root, kind, concurrency, n, theirs, first)
        await _search(ours, root, kind, concurrency, n, mine, first)
    return mine, theirs


async def _caught_up(ours: KafkaStore, deadline_s: float = 600.0) -> None:
    """Return once the projection applied every write of `ours` (its vectors are indexed after the
    acknowledgement, at the projector's pace): a read carries the consistency token."""
    give_up = time.monotonic() + deadline_s
    while True:
        try:
            await ours.alist_namespaces(limit=1)
            return
        except ConsistencyTimeoutError:  # the read API's own wait ran out; the projector is still busy
            if time.monotonic() > give_up:
                raise


async def _settle(ours: KafkaStore, settings: Settings) -> None:
    """Searches measure the steady state of both stores: our projection caught up with the puts
    (vectors are indexed by the projector after the acknowledgement), and both tables' planner
    statistics current, as autovacuum keeps them within a minute of a bulk load."""
    await _caught_up(ours)
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        await conn.execute(f"ANALYZE {settings.postgres_schema}.store, {settings.postgres_schema}.store_vectors")
        await conn.execute("ANALYZE public.store, public.store_vectors")  # AsyncPostgresStore's tables
    finally:
        await conn.close()


async def _index_scans(settings: Settings, at_least: int = 0, deadline_s: float = 30.0) -> int:
    """The vector index's scan count, once it reaches `at_least` (backends report it within ~10 s)."""
    conn = await asyncpg.connect(settings.postgres_dsn)
    give_up = time.monotonic() + deadline_s
    try:
        while True:
            scans = await conn.fetchval(
                "SELECT coalesce(sum(idx_scan), 0) FROM pg_stat_user_indexes "
                "WHERE schemaname = $1 AND indexrelname = $2",
                settings.postgres_schema,
                VECTOR_INDEX,
            )
            if scans >= at_least or time.monotonic() > give_up:
                return int(scans)
            await asyncio.sleep(0.5)  # polling a condition with a deadline
    finally:
        await conn.close()


async def _recall_at_10(
    store: KafkaStore, settings: Settings, dims: int, texts: list[str], queries: list[str]
) -> tuple[float, int]:
    """(share of the exact top 10 that the read API's search returns, HNSW index scans the searches made).

    The items are loaded into a namespace of their own and the tables ANALYZEd, so the planner
    knows the namespace is large and uses the index (with stale statistics it may scan the rows,
    exactly, and the row would measure nothing). An item that scores as high as the exact 10th
    counts as a hit: which of several tied items either search lists is arbitrary.
    """
    root = f"recall-{uuid.uuid4().hex[:8]}"
    for start in range(0, len(texts), 500):
        await asyncio.gather(
            *(store.aput((root,), str(i), {"text": texts[i]}) for i in range(start, min(len(texts), start + 500)))
        )
    await _settle(store, settings)
    embedder = HashEmbedder(dims)
    matrix = np.array(embedder.embed_documents(texts), dtype=np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    scans_before = await _index_scans(settings)
    hits = 0
    for query in queries:
        vector = np.array(embedder.embed_query(query), dtype=np.float32)
        scores = matrix @ (vector / np.linalg.norm(vector))
        tenth = np.sort(scores)[-10]
        found = {item.key for item in await store.asearch((root,), query=query, limit=10)}
        hits += sum(1 for key in found if scores[int(key)] >= tenth - 1e-5)
    scans = await _index_scans(settings, scans_before + len(queries)) - scans_before
    return hits / (10 * len(queries)), scans


async def run(stack: DevStack, total: int, recall_items: int) -> list[str]:
    """Runs the store rows; returns them as Markdown table rows."""
    settings = stack.settings
    dims = settings.store_vector_dims or 256
    rows: list[str] = []
    async with (
        KafkaStore(settings, index=index_config(dims)) as ours,
        AsyncPostgresStore.from_conn_string(settings.postgres_dsn, index=index_config(dims)) as official,
    ):
        await official.setup()
        root = f"bench-{uuid.uuid4().hex[:8]}"
        for concurrency in CONCURRENCY:
            n = total if concurrency > 1 else total // 4
            theirs = await puts(official, root, concurrency, n)
            mine = await puts(ours, root, concurrency, n)
            print(
                f"  store.aput         c={concurrency:<3} KafkaStore {mine:9.0f}/s  AsyncPostgresStore "
                f"{theirs:9.0f}/s  ratio {mine / theirs:5.2f}x",
                flush=True,
            )
            rows.append(f"| store.aput | {concurrency} | {mine:,.0f}/s | {theirs:,.0f}/s | {mine / theirs:.2f}x |")
        await _settle(ours, settings)
        for kind in SEARCHES:
            for concurrency in CONCURRENCY:
                mine, theirs = await _compare_searches(ours, official, root, kind, concurrency, max(200, total // 4))
                m_p50, m_rate, m_short = mine.p50(), mine.rate(), mine.short_share()
                t_p50, t_rate, t_short = theirs.p50(), theirs.rate(), theirs.short_share()
                print(
                    f"  search {kind:<7}     c={concurrency:<3} p50 {m_p50:6.2f} ms vs {t_p50:6.2f} ms "
                    f"({m_p50 / t_p50:4.2f}x)  {m_rate:7.0f}/s vs {t_rate:7.0f}/s  "
                    f"short pages {m_short:.0%} vs {t_short:.0%}",
                    flush=True,
                )
                rows.append(
                    f"| store.asearch {kind} | {concurrency} | p50 {m_p50:.2f} ms, {m_rate:,.0f}/s, "
                    f"{m_short:.0%} short pages | p50 {t_p50:.2f} ms, {t_rate:,.0f}/s, {t_short:.0%} short pages | "
                    f"p50 {m_p50 / t_p50:.2f}x |"
                )
        for name, corpus in (("docstring sentences", docstring_sentences), ("templated memories", templated_memories)):
            texts, queries = corpus(recall_items, RECALL_QUERIES)
            recall, scans = await _recall_at_10(ours, settings, dims, texts, queries)
            what = f"{len(texts):,} {name}, ef_search {settings.store_hnsw_ef_search}"
            print(f"  recall@10 of HNSW search over {what}: {recall:.3f} ({scans} index scans, {len(queries)} queries)")
            rows.append(f"| recall@10, HNSW vs exact ({what}) | 1 | {recall:.3f} | – | – |")
    return rows


async def _main(args: argparse.Namespace) -> None:
    work_dir = Path(tempfile.mkdtemp(prefix="graphledger-bench-"))
    with DevStack(work_dir, base=Settings(store_vector_dims=DIMS), log_level="WARNING") as stack:
        print("\n".join(await run(stack, args.total, args.recall_items)))


if __name__ == "__main__":
    # `python -m bench.store`: only the store rows (`python -m bench` runs them after the checkpoint rows).
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--total", type=int, default=4000, help="puts per row at concurrency 16 and 64")
    parser.add_argument("--recall-items", type=int, default=20000, help="items for the HNSW recall@10 row")
    asyncio.run(_main(parser.parse_args()))
