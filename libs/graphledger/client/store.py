"""`KafkaStore`: LangGraph's long-term memory store, with writes as Kafka events and reads from the read API.

A batch is validated whole before anything happens, so a bad op publishes nothing. Embedding runs
here, before publishing, so the events carry the vectors and a replay never calls an embedding API
again. A batch reads first (one `POST /v1/store/batch` for all its gets, searches and listings) and
then publishes its puts and deletes, so, as in `InMemoryStore` and `AsyncPostgresStore`, a batch's
reads do not see its own writes; later reads do (they carry the consistency token).

TTL (`TTLConfig`, per-put `ttl`, per-read `refresh_ttl`) works as in the official stores, with the
refresh going through the log: a read with `refresh_ttl` publishes a `store.refresh` for each item
it returned (at most one per item per `store_refresh_coalesce_s`), and the projector restarts the
item's TTL at that event's time. Expired items are never returned; the sweeper deletes them.

Async callers get LangGraph's `AsyncBatchedBaseStore` behaviour: the ops awaited in the same tick
of an event loop run as one batch, identical reads are asked once and a later put to the same key
wins. `AsyncBatchedBaseStore` itself does not fit: it binds to the loop running at construction,
while this store is built anywhere and serves plain threads and any number of loops.
"""

from __future__ import annotations

import asyncio
import math
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from langchain_core.embeddings import Embeddings
from langgraph.store.base import (
    NOT_PROVIDED,
    BaseStore,
    GetOp,
    IndexConfig,
    Item,
    ListNamespacesOp,
    MatchCondition,
    NamespacePath,
    NotProvided,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    _ensure_refresh,
    _ensure_ttl,
    _validate_namespace,
    ensure_embeddings,
)
from langgraph.store.base.batch import _dedupe_ops

from graphledger.answers import ItemAnswer, StoreBatchAnswer
from graphledger.client.refresh import RefreshCoalescer, Target
from graphledger.client.runtime import ClientLifecycle, ClientRuntime
from graphledger.client.store_values import (
    Constant,
    Prepared,
    PreparedRead,
    PreparedWrite,
    TokenizedField,
    decode_result,
    prepare,
    read_answer,
    tokenized_fields,
)
from graphledger.errors import InvalidInputError
from graphledger.events.store import StoreDelete, StorePut, StoreRefresh
from graphledger.settings import Settings
from graphledger.wire import CONSISTENCY_HEADER, OWN_WRITES, SEARCH_CONSISTENCY_HEADER, format_token

STORE_BATCH_PATH = "/v1/store/batch"
SearchConsistency = Literal["log", "own_writes"]


class KafkaStore(ClientLifecycle, BaseStore):
    """Store for `graph.compile(store=...)`, sync and async, through graphledger.

    `index` is LangGraph's `IndexConfig` (`dims`, `embed`: a LangChain `Embeddings`, a sync or an
    async function, `fields`: default `["$"]`). `ttl` is LangGraph's `TTLConfig`: `default_ttl`
    (minutes) for puts without `ttl`, `refresh_on_read` (default True) for reads without
    `refresh_ttl`; `sweep_interval_minutes` is the sweeper service's business (`GRAPHLEDGER_SWEEPER_*`).
    Use it as a context manager, or call `close()` when done; it connects on first use.
    """

    supports_ttl: bool = True

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        search_consistency: SearchConsistency = "log",
    ) -> None:
        if search_consistency not in ("log", OWN_WRITES):
            raise InvalidInputError(f"search_consistency must be 'log' or 'own_writes', got {search_consistency!r}")
        self.search_consistency = search_consistency
        self.settings = settings or Settings()
        self.ttl_config = ttl
        self.index_config: IndexConfig | None = None
        self.embeddings: Embeddings | None = None
        self._fields: list[TokenizedField] | None = None
        self._dims = 0
        if index is not None:
            self._configure_index(index)
        self._runtime = ClientRuntime(self.settings, name="graphledger-store")
        self._refreshes = RefreshCoalescer(self.settings.store_refresh_coalesce_s)
        self._batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopBatcher] = weakref.WeakKeyDictionary()
        self._batchers_lock = threading.Lock()

    def _configure_index(self, index: IndexConfig) -> None:
        if not isinstance(index, Mapping):
            raise InvalidInputError(f"index must be an IndexConfig dict, got {type(index).__name__}")
        dims = index.get("dims")
        if isinstance(dims, bool) or not isinstance(dims, int) or dims < 1:
            raise InvalidInputError(f"index dims must be a positive int, got {dims!r}")
        self.index_config = index.copy()
        self.embeddings = ensure_embeddings(index.get("embed"))
        self._fields = tokenized_fields(index.get("fields"))
        self._dims = dims

    @classmethod
    def from_env(
        cls,
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        search_consistency: SearchConsistency = "log",
    ) -> KafkaStore:
        """A store configured from `GRAPHLEDGER_*` environment variables."""
        return cls(Settings(), index=index, ttl=ttl, search_consistency=search_consistency)

    def _read_headers(self) -> dict[str, str] | None:
        """What a batch's reads send besides the body: with `own_writes`, the level and this store's token."""
        if self.search_consistency != OWN_WRITES:
            return None
        token = self._runtime.acked.token(self.settings.store_topic)
        return {SEARCH_CONSISTENCY_HEADER: OWN_WRITES, **({CONSISTENCY_HEADER: format_token(token)} if token else {})}

    # -- batches -------------------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ops from a plain thread: embed here, then read and publish on the client's loop."""
        prepared = self._prepare_all(ops)
        plan = _Plan(prepared)
        vectors, queries = self._embed(plan.texts, plan.queries)
        answer = (
            plan.answered(self._runtime.read(STORE_BATCH_PATH, plan.read_body(queries), self._read_headers()))
            if plan.reads
            else None
        )  # a malformed answer fails before anything is published
        results = plan.results(answer)
        events = [*plan.events(vectors), *self._refresh_events(plan, answer)]
        self._runtime.publish_many(self.settings.store_topic, events)
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await self._aexecute(self._prepare_all(ops))

    async def _aexecute(self, prepared: Sequence[Prepared]) -> list[Result]:
        plan = _Plan(prepared)
        vectors, queries = await self._aembed(plan.texts, plan.queries)
        answer = (
            plan.answered(await self._runtime.aread(STORE_BATCH_PATH, plan.read_body(queries), self._read_headers()))
            if plan.reads
            else None
        )
        results = plan.results(answer)
        events = [*plan.events(vectors), *self._refresh_events(plan, answer)]
        await self._runtime.apublish_many(self.settings.store_topic, events)
        return results

    def _refresh_events(self, plan: _Plan, answer: StoreBatchAnswer | None) -> list[StoreRefresh]:
        """`store.refresh` for the items with a TTL the batch's `refresh_ttl` reads returned, coalesced;
        an item the batch also writes needs none (a put restarts its TTL, a delete leaves nothing)."""
        if answer is None:
            return []
        written = {(w.namespace, w.key) for w in plan.writes}
        found = (t for t in plan.refreshed(answer) if t not in written)
        return [StoreRefresh(namespace, key) for namespace, key in self._refreshes.due(found)]

    def _prepare_all(self, ops: Iterable[Op]) -> list[Prepared]:
        return [prepare(op, index_fields=self._fields) for op in ops]

    # -- embedding: documents for puts, queries for searches -----------------------------------

    def _embed(
        self, texts: list[str], queries: list[str]
    ) -> tuple[dict[str, tuple[float, ...]], dict[str, tuple[float, ...]]]:
        if not texts and not queries:
            return {}, {}
        assert self.embeddings is not None  # prepare() refuses queries and collects no texts without an index
        docs = self.embeddings.embed_documents(texts) if texts else []
        asked = [self.embeddings.embed_query(q) for q in queries]
        return self._checked(texts, docs, "document"), self._checked(queries, asked, "query")

    async def _aembed(
        self, texts: list[str], queries: list[str]
    ) -> tuple[dict[str, tuple[float, ...]], dict[str, tuple[float, ...]]]:
        if not texts and not queries:
            return {}, {}
        assert self.embeddings is not None
        embeddings = self.embeddings
        if not texts and len(queries) == 1:  # a lone search: nothing to gather, two loop turns saved
            return {}, self._checked(queries, [await embeddings.aembed_query(queries[0])], "query")

        async def documents() -> list[list[float]]:
            return await embeddings.aembed_documents(texts) if texts else []

        docs, *asked = await asyncio.gather(documents(), *(embeddings.aembed_query(q) for q in queries))
        return self._checked(texts, docs, "document"), self._checked(queries, asked, "query")

    def _checked(self, texts: list[str], vectors: Any, what: str) -> dict[str, tuple[float, ...]]:
        """Vectors as the events carry them; an embedder's wrong answer fails before publishing."""
        vectors = list(vectors)
        if len(vectors) != len(texts):
            raise InvalidInputError(f"the embedder returned {len(vectors)} {what} vectors for {len(texts)} texts")
        out: dict[str, tuple[float, ...]] = {}
        for text, vector in zip(texts, vectors, strict=True):
            values = tuple(map(float, vector))
            if len(values) != self._dims:
                raise InvalidInputError(
                    f"the embedder returned a {what} vector of {len(values)} dims; the index has dims={self._dims}"
                )
            # A finite sum means every value is finite (NaN and infinities propagate); only a sum that
            # overflowed needs the values looked at one by one.
            if not math.isfinite(sum(values)) and not all(map(math.isfinite, values)):
                raise InvalidInputError(f"the embedder returned a {what} vector holding NaN or infinity")
            out[text] = values
        return out

    # -- async convenience methods: micro-batched per event loop, like AsyncBatchedBaseStore ----

    async def aget(
        self,
        namespace: tuple[str, ...],
        key: str,
        *,
        refresh_ttl: bool | None = None,
    ) -> Item | None:
        item: Item | None = await self._enqueue(
            GetOp(namespace, key, refresh_ttl=_ensure_refresh(self.ttl_config, refresh_ttl))
        )
        return item

    async def asearch(
        self,
        namespace_prefix: tuple[str, ...],
        /,
        *,
        query: str | None = None,
        filter: dict[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        refresh_ttl: bool | None = None,
    ) -> list[SearchItem]:
        op = SearchOp(
            namespace_prefix, filter, limit, offset, query, refresh_ttl=_ensure_refresh(self.ttl_config, refresh_ttl)
        )
        items: list[SearchItem] = await self._enqueue(op)
        return items

    async def aput(
        self,
        namespace: tuple[str, ...],
        key: str,
        value: Mapping[str, Any],
        index: Literal[False] | list[str] | None = None,
        *,
        ttl: float | NotProvided | None = NOT_PROVIDED,
    ) -> None:
        _validate_namespace(namespace)
        if ttl not in (NOT_PROVIDED, None) and not self.supports_ttl:
            raise NotImplementedError(
                f"TTL is not supported by {self.__class__.__name__}. "
                f"Use a store implementation that supports TTL or set ttl=None."
            )
        await self._enqueue(PutOp(namespace, str(key), value, index=index, ttl=_ensure_ttl(self.ttl_config, ttl)))

    async def adelete(self, namespace: tuple[str, ...], key: str) -> None:
        await self._enqueue(PutOp(namespace, str(key), None))

    # -- erasure (docs/security.md) ---------------------------------------------------------------

    def erase_namespace(self, namespace: tuple[str, ...]) -> None:
        """Erase a store subject for good: the items of `namespace` and below, which must be the first
        `erasure_namespace_depth` labels of their namespaces or fewer (e.g. `("users", "42")`). Their data
        key is destroyed, so no copy of their events in the log can be read again, and the projection drops
        them; the namespace cannot be written again."""
        _validate_namespace(namespace)
        self._runtime.erase({"namespace": list(namespace)})

    async def aerase_namespace(self, namespace: tuple[str, ...]) -> None:
        _validate_namespace(namespace)
        await self._runtime.aerase({"namespace": list(namespace)})

    def erase_tenant(self) -> None:
        """Erase everything of this client's tenant (its token's), store items and threads alike."""
        self._runtime.erase({"tenant": True})

    async def aerase_tenant(self) -> None:
        await self._runtime.aerase({"tenant": True})

    async def alist_namespaces(
        self,
        *,
        prefix: NamespacePath | None = None,
        suffix: NamespacePath | None = None,
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[tuple[str, ...]]:
        conditions = []
        if prefix:
            conditions.append(MatchCondition(match_type="prefix", path=prefix))
        if suffix:
            conditions.append(MatchCondition(match_type="suffix", path=suffix))
        op = ListNamespacesOp(match_conditions=tuple(conditions), max_depth=max_depth, limit=limit, offset=offset)
        namespaces: list[tuple[str, ...]] = await self._enqueue(op)
        return namespaces

    async def _enqueue(self, op: Op) -> Any:
        # Validate now, in the caller: a bad op fails its own call and never the batch it would join.
        prepared = prepare(op, index_fields=self._fields)
        loop = asyncio.get_running_loop()
        with self._batchers_lock:
            batcher = self._batchers.get(loop)
            if batcher is None:
                batcher = self._batchers[loop] = _LoopBatcher(self, loop)
        return await batcher.submit(op, prepared)


class _Plan:
    """One batch after validation: the writes (last per item wins), the reads, what to embed."""

    def __init__(self, prepared: Sequence[Prepared]) -> None:
        self.prepared = prepared
        self.reads = [p for p in prepared if isinstance(p, PreparedRead)]
        writes: dict[tuple[tuple[str, ...], str], PreparedWrite] = {}
        for p in prepared:
            if isinstance(p, PreparedWrite):
                writes[(p.namespace, p.key)] = p  # as both LangGraph stores: the last write wins
        self.writes = list(writes.values())
        self.texts = list(dict.fromkeys(text for w in self.writes for _, text in w.texts or ()))
        self.queries = list(dict.fromkeys(r.query for r in self.reads if r.query))

    def read_body(self, query_vectors: dict[str, tuple[float, ...]]) -> dict[str, Any]:
        ops = [{**r.body, "query_vector": list(query_vectors[r.query])} if r.query else r.body for r in self.reads]
        return {"ops": ops}

    def events(self, vectors: dict[str, tuple[float, ...]]) -> list[StorePut | StoreDelete]:
        return [w.event(vectors) for w in self.writes]

    def answered(self, answer: Any) -> StoreBatchAnswer:
        """The read API's answer to the reads; a malformed one is a `ReadApiError`."""
        return read_answer(self.reads, answer)

    def refreshed(self, answer: StoreBatchAnswer) -> list[Target]:
        """The items with a TTL (an `expires_at`) returned by reads with `refresh_ttl`, in order. Items
        without a TTL have nothing to refresh."""
        out: list[Target] = []
        for read, result in zip(self.reads, answer.results, strict=True):
            if not read.refresh:
                continue
            items = [result] if isinstance(result, ItemAnswer) else result or ()
            out.extend(
                (tuple(item.namespace), item.key)
                for item in items
                if isinstance(item, ItemAnswer) and item.expires_at is not None
            )
        return out

    def results(self, answer: StoreBatchAnswer | None) -> list[Result]:
        answered = zip(self.reads, answer.results, strict=True) if answer is not None else ()
        decoded = iter([decode_result(read.kind, result) for read, result in answered])
        results: list[Result] = []
        for p in self.prepared:
            if isinstance(p, PreparedRead):
                results.append(next(decoded))
            elif isinstance(p, Constant):
                results.append(p.result)
            else:
                results.append(None)
        return results


class _LoopBatcher:
    """The ops awaited on one event loop in one tick, run as one deduplicated batch.

    The first op of a tick schedules a flush with `call_soon`, which runs after every task already
    ready in that tick (e.g. all of an `asyncio.gather`) has queued its op. Batches of later ticks
    run concurrently with earlier ones; ops of one tick share one read API call.
    """

    def __init__(self, store: KafkaStore, loop: asyncio.AbstractEventLoop) -> None:
        self._store = weakref.ref(store)
        self._loop = loop
        self._pending: list[tuple[asyncio.Future[Any], Op, Prepared]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, op: Op, prepared: Prepared) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = self._loop.create_future()
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append((future, op, prepared))
        return future

    def _flush(self) -> None:
        # A cancelled caller's op is left out.
        items = [(future, op, prepared) for future, op, prepared in self._pending if not future.done()]
        self._pending = []
        if items:
            task = self._loop.create_task(self._run(items))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, items: list[tuple[asyncio.Future[Any], Op, Prepared]]) -> None:
        futures = [future for future, _, _ in items]
        try:
            store = self._store()
            if store is None:
                raise RuntimeError("the KafkaStore was garbage-collected with operations pending")
            prepared_of = {id(op): prepared for _, op, prepared in items}
            listen, ops = _dedupe_ops([op for _, op, _ in items])
            results = await store._aexecute([prepared_of[id(op)] for op in ops])
            if listen is not None:
                results = [results[i] for i in listen]
        except asyncio.CancelledError:
            for future in futures:
                future.cancel()
            raise
        except Exception as exc:
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
            return
        for future, result in zip(futures, results, strict=True):
            if not future.done():
                future.set_result(result)
