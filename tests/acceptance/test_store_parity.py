"""Parity: the same generated operation sequences against KafkaStore, AsyncPostgresStore and InMemoryStore.

Each seed drives the three stores op by op (puts with index overrides, deletes, gets, searches with
every filter operator, nested and list filters, prefix scopes, queries, limit/offset paging, and
list_namespaces with prefixes, suffixes, `*`, max_depth and paging) and compares after every read:
same items, values and namespaces everywhere; the same order as AsyncPostgresStore (most recently
updated first without a query, by score with one); scores within 1e-4. Every store embeds with the
same `HashEmbedder`. At the end, the official AsyncPostgresStore pointed at the projection schema
reads exactly what KafkaStore reads.

Where a reference documentedly diverges from the store's semantics (docs/architecture.md, "Store"),
the comparison uses the one that follows them, and the generator says which (`Filter.pg` / `Filter.mem`):
- AsyncPostgresStore compares `$gt`/`$gte`/`$lt`/`$lte` as text (10 < 9), reads a missing field as
  SQL NULL (so `$ne` skips it and `{"f": None}` never matches), and rejects nested dict filters:
  such searches are compared with InMemoryStore.
- InMemoryStore converts range operands with `float()` (a string operand raises), orders a search
  without a query by insertion, and keeps namespaces whose items were all deleted (or that a get
  touched): its results are compared as sets, after dropping its empty namespaces.
- Items without vectors: AsyncPostgresStore leaves them out of a query search; InMemoryStore and
  KafkaStore rank them after the scored items. Only the scored part is compared with
  AsyncPostgresStore. InMemoryStore fills that tail ignoring `offset`, so its tail is compared on
  the first page and on the whole result only.
- Vectors on re-put: both references upsert vector rows per field and keep rows of fields the new
  value no longer yields; KafkaStore replaces all of an item's vectors (no orphans). The references
  therefore see an indexed re-put as delete + put; an `index=False` re-put keeps vectors everywhere.
- AsyncPostgresStore fetches `2 * limit + 1` vector rows before de-duplicating and ignores `offset`
  in that bound, so query searches are compared with it on the first page only.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg
import pytest
from langgraph.store.base import SearchItem
from langgraph.store.memory import InMemoryStore
from langgraph.store.postgres import AsyncPostgresStore
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

from graphledger import KafkaStore
from graphledger.embeddings import HashEmbedder

SEEDS = range(4)
OPS_PER_SEED = 110
SCORE_TOLERANCE = 1e-4
EVERYTHING = 10_000

WORDS = "pizza anchovies dog rex market stock report lyon sister river cat garden train music".split()
STRINGS = ["apple", "banana", "Zebra", "éclair"]
TAGS = ["red", "blue", "green"]
SECOND = ["docs", "a-b", "users"]  # "a-b" sorts before "a.…" as text but after ("a", …) as a tuple
THIRD = ["x", "y"]
KEYS = [f"k{i}" for i in range(5)]
INDEXES: list[Literal[False] | list[str] | None] = [None, None, None, False, ["title"], ["text", "title"]]


@dataclass(frozen=True)
class Filter:
    """A filter and which references follow the store's semantics for it on the generated data."""

    value: dict[str, Any]
    pg: bool = True
    mem: bool = True

    def __and__(self, other: Filter) -> Filter:
        return Filter({**self.value, **other.value}, self.pg and other.pg, self.mem and other.mem)


def _filters(rnd: random.Random) -> Filter:
    n = rnd.randint(0, 12)
    pick = rnd.randrange(12)
    options = [
        lambda: Filter({"s": rnd.choice(STRINGS)}),
        lambda: Filter({"s": {"$eq": rnd.choice(STRINGS)}}),
        lambda: Filter({"s": {"$ne": rnd.choice(STRINGS)}}, pg=False),  # "s" may be missing
        lambda: Filter({"n": {rnd.choice(["$gt", "$gte", "$lt", "$lte"]): n}}, pg=False),  # textual in pg
        lambda: Filter({"n": {"$gt": n - 10, "$lte": n + 0.5}}, pg=False),
        lambda: Filter({"n": {"$eq": n}}),
        lambda: Filter({"s": {rnd.choice(["$gt", "$lte"]): rnd.choice(STRINGS)}}, mem=False),  # float("apple")
        lambda: Filter({"meta": {"lang": rnd.choice(["en", "fr"])}}, pg=False),
        lambda: Filter({"meta": {"v": {"$gte": rnd.randint(0, 3)}, "lang": "en"}}, pg=False),
        lambda: Filter({"tags": rnd.sample(TAGS, rnd.randint(0, 2))}),
        lambda: Filter({"s": None}, pg=False),  # matches a missing "s"
        lambda: Filter({"n": {"$ne": n}}),  # "n" is never missing
    ]
    # Half the time a filter both references follow, so every comparison has non-empty answers.
    chosen = options[pick]() if rnd.random() < 0.5 else options[rnd.choice([0, 1, 5, 6, 9, 11])]()
    if rnd.random() < 0.25:
        other = options[rnd.randrange(len(options))]()
        if not set(other.value) & set(chosen.value):
            chosen = chosen & other
    if not (chosen.pg or chosen.mem):  # e.g. a string range and a nested filter: no reference knows it
        return Filter({"n": {"$gte": n}}, pg=False)
    return chosen


def _value(rnd: random.Random, key: str) -> dict[str, Any]:
    # A unique token per value keeps scores apart, so rankings have no ties to argue about.
    value: dict[str, Any] = {
        "text": f"{' '.join(rnd.sample(WORDS, 3))} {key}x{rnd.randrange(10**6)}",
        "n": rnd.choice([rnd.randint(-2, 12), rnd.randint(0, 12) + 0.5]),
        "tags": rnd.sample(TAGS, rnd.randint(0, 2)),
    }
    if rnd.random() < 0.7:
        value["s"] = rnd.choice(STRINGS)
    if rnd.random() < 0.6:
        value["meta"] = {"lang": rnd.choice(["en", "fr"]), "v": rnd.randint(0, 3)}
    if rnd.random() < 0.5:
        value["title"] = f"{rnd.choice(WORDS)} title {rnd.randrange(10**6)}"
    if rnd.random() < 0.1:
        del value["text"]  # nothing to embed under the default fields
    return value


# -- the three stores ---------------------------------------------------------------------------------


@dataclass
class Stores:
    ours: KafkaStore
    pg: AsyncPostgresStore
    mem: InMemoryStore
    root: str
    namespaces: list[tuple[str, ...]] = field(default_factory=list)
    compared: Counter[str] = field(default_factory=Counter)
    """Non-empty answers compared, per kind, so a seed that stops exercising something fails."""


def _index(dims: int) -> dict[str, Any]:
    return {"dims": dims, "embed": HashEmbedder(dims), "fields": ["text"]}


@asynccontextmanager
async def official_store(dsn: str, dims: int, schema: str | None = None) -> AsyncIterator[AsyncPostgresStore]:
    """AsyncPostgresStore as `from_conn_string` connects it; on `schema` (pgvector via public) if given."""
    options = {"options": f"-c search_path={schema},public"} if schema else {}
    async with await psycopg.AsyncConnection.connect(
        make_conninfo(dsn, **options), autocommit=True, prepare_threshold=0, row_factory=dict_row
    ) as conn:
        yield AsyncPostgresStore(conn, index=_index(dims))  # type: ignore[arg-type]


def _database(dsn: str) -> str:
    """A new database on the stack's Postgres, for the official store to own."""
    name = f"parity_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return make_conninfo(dsn, dbname=name)


# -- comparisons -------------------------------------------------------------------------------------


def _tie_group(full: Sequence[SearchItem], position: int, *, by_score: bool) -> set[str]:
    """The keys that may stand at `position` of `full`: those ranking equal to it."""
    anchor = full[position]
    if by_score and anchor.score is not None:
        return {i.key for i in full if i.score is not None and abs(i.score - anchor.score) <= SCORE_TOLERANCE}
    if by_score:
        return {i.key for i in full if i.score is None}
    return {i.key for i in full if i.updated_at == anchor.updated_at}


def _same_ranking(
    ours_full: Sequence[SearchItem], offset: int, theirs: Sequence[SearchItem], *, by_score: bool
) -> None:
    """`theirs` is the page at `offset` of our full ranking, up to ties in our ranking."""
    assert len(theirs) == len(ours_full[offset : offset + len(theirs)])
    ours_by_key = {(i.namespace, i.key): i for i in ours_full}
    for position, item in enumerate(theirs, start=offset):
        assert item.key in _tie_group(ours_full, position, by_score=by_score), (position, item.key)
        mine = ours_by_key[(item.namespace, item.key)]
        assert mine.value == item.value
        if by_score:
            assert mine.score is not None and item.score is not None
            assert abs(mine.score - item.score) <= SCORE_TOLERANCE


def _as_set(items: Sequence[SearchItem]) -> dict[tuple[tuple[str, ...], str], Any]:
    return {(i.namespace, i.key): i.value for i in items}


def _rows(items: Sequence[Any]) -> dict[tuple[tuple[str, ...], str], tuple[Any, ...]]:
    """Items as the rows they were read from: value and both timestamps."""
    return {(i.namespace, i.key): (i.value, i.created_at, i.updated_at) for i in items}


def _scored(items: Sequence[SearchItem]) -> list[SearchItem]:
    return [i for i in items if i.score is not None]


async def _compare_search(s: Stores, rnd: random.Random) -> None:
    depth = rnd.randint(1, 3)
    prefix = (s.root, *rnd.choice(s.namespaces or [(s.root,)])[1:])[:depth]
    flt = _filters(rnd) if rnd.random() < 0.6 else Filter({})
    query = " ".join(rnd.sample(WORDS, rnd.randint(1, 2))) if rnd.random() < 0.45 else None
    limit = rnd.choice([1, 2, 3, 5, 10])
    offset = rnd.choice([0, 0, 1, 2, limit])
    kwargs: dict[str, Any] = {"query": query, "filter": flt.value or None}

    page = await s.ours.asearch(prefix, limit=limit, offset=offset, **kwargs)
    full = await s.ours.asearch(prefix, limit=EVERYTHING, **kwargs)
    context = f"search {prefix} {kwargs} limit={limit} offset={offset}"
    # Paging is a window on one stable ranking.
    assert [(i.key, i.score) for i in page] == [(i.key, i.score) for i in full[offset : offset + limit]], context
    if query is None:
        assert all(i.score is None for i in full)
        assert [i.updated_at for i in full] == sorted((i.updated_at for i in full), reverse=True), context
    else:
        scored = _scored(full)
        assert full[: len(scored)] == scored, context  # items without vectors only at the tail
        assert [i.score for i in scored] == sorted((i.score for i in scored), reverse=True), context  # type: ignore[type-var]

    if flt.pg and (query is None or offset == 0):
        theirs = await s.pg.asearch(prefix, limit=limit, offset=offset, **kwargs)
        if query is None:
            _same_ranking(full, offset, theirs, by_score=False)
        else:  # AsyncPostgresStore returns only items with vectors
            assert len(theirs) == len(_scored(page)), context
            _same_ranking(full, 0, theirs, by_score=True)
        s.compared["pg " + ("query" if query else "filter" if flt.value else "plain")] += bool(theirs)
    if flt.mem:
        mem_full = await s.mem.asearch(prefix, limit=EVERYTHING, **kwargs)
        assert _as_set(mem_full) == _as_set(full), context
        s.compared["mem " + ("query" if query else "filter" if flt.value else "plain")] += bool(full)
        if query is not None:
            _same_ranking(full, 0, _scored(mem_full), by_score=True)
            if offset == 0:
                mem_page = await s.mem.asearch(prefix, limit=limit, **kwargs)
                n = len(_scored(mem_page))
                _same_ranking(full, 0, mem_page[:n], by_score=True)
                tail = {i.key for i in full if i.score is None}
                assert len(mem_page) == len(page) and {i.key for i in mem_page[n:]} <= tail, context


def _list_args(rnd: random.Random, root: str) -> dict[str, Any]:
    prefix = rnd.choice([(root,), (root, "*"), (root, "docs"), (root, "*", "x"), (root, rnd.choice(SECOND))])
    suffix = rnd.choice([None, None, None, ("x",), ("*",), ("deep",), ("*", "y"), (rnd.choice(SECOND), "*")])
    return {
        "prefix": prefix,
        "suffix": suffix,
        "max_depth": rnd.choice([None, None, 1, 2, 3, 4]),
        "limit": rnd.choice([100, 100, 1, 2, 3]),
        "offset": rnd.choice([0, 0, 1, 2]),
    }


def _matches(ns: tuple[str, ...], pattern: tuple[str, ...] | None, *, suffix: bool) -> bool:
    if pattern is None:
        return True
    if len(ns) < len(pattern):
        return False
    labels = ns[len(ns) - len(pattern) :] if suffix else ns[: len(pattern)]
    return all(p in ("*", label) for p, label in zip(pattern, labels, strict=True))


async def _compare_list(s: Stores, rnd: random.Random) -> None:
    args = _list_args(rnd, s.root)
    ours = await s.ours.alist_namespaces(**args)
    theirs = await s.pg.alist_namespaces(**args)
    assert ours == theirs, f"list_namespaces {args}"
    # InMemoryStore's namespaces, without those it keeps after their last item went, then the same
    # pipeline (match, truncate, dedupe, sort as AsyncPostgresStore sorts, page).
    live = [ns for ns, items in s.mem._data.items() if items]
    matched = [
        ns for ns in live if _matches(ns, args["prefix"], suffix=False) and _matches(ns, args["suffix"], suffix=True)
    ]
    depth = args["max_depth"]
    truncated = {ns[:depth] if depth is not None else ns for ns in matched}
    expected = sorted(truncated, key=".".join)[args["offset"] : args["offset"] + args["limit"]]
    assert ours == expected, f"list_namespaces {args} (InMemoryStore)"
    s.compared["list"] += bool(ours)


async def _step(s: Stores, rnd: random.Random) -> None:
    roll = rnd.random()
    if roll < 0.45 or not s.namespaces:
        ns = rnd.choice(
            [
                (s.root, rnd.choice(SECOND)),
                (s.root, rnd.choice(SECOND), rnd.choice(THIRD)),
                (s.root, "users", "x", "deep"),
            ]
        )
        key = rnd.choice(KEYS)
        value, index = _value(rnd, key), rnd.choice(INDEXES)
        await s.ours.aput(ns, key, value, index=index)
        if index is not False:
            # The references keep vectors of fields a re-put no longer yields; ours replaces them all.
            await s.pg.adelete(ns, key)
            await s.mem.adelete(ns, key)
        await s.pg.aput(ns, key, value, index=index)
        await s.mem.aput(ns, key, value, index=index)
        if ns not in s.namespaces:
            s.namespaces.append(ns)
    elif roll < 0.5:
        ns, key = rnd.choice(s.namespaces), rnd.choice(KEYS)
        for store in (s.ours, s.pg, s.mem):
            await store.adelete(ns, key)
    elif roll < 0.58:
        ns, key = rnd.choice(s.namespaces), rnd.choice(KEYS)
        got = [await store.aget(ns, key) for store in (s.ours, s.pg, s.mem)]
        values = [None if g is None else g.value for g in got]
        assert values[0] == values[1] == values[2], (ns, key, values)
    elif roll < 0.9:
        await _compare_search(s, rnd)
    else:
        await _compare_list(s, rnd)


# -- the suite ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
async def test_generated_sequences_agree_across_the_three_stores(stack: Any, seed: int) -> None:
    settings = stack.settings
    dims = int(settings.store_vector_dims)
    rnd = random.Random(seed)
    root = f"parity{seed}x{uuid.uuid4().hex[:8]}"
    async with (
        KafkaStore(settings, index=_index(dims)) as ours,  # type: ignore[arg-type]
        official_store(_database(settings.postgres_dsn), dims) as pg,
    ):
        await pg.setup()
        s = Stores(ours, pg, InMemoryStore(index=_index(dims)), root)  # type: ignore[arg-type]
        for _ in range(OPS_PER_SEED):
            await _step(s, rnd)

        # Everything, at the end, in every store.
        ours_all = await ours.asearch((root,), limit=EVERYTHING)
        assert _as_set(ours_all) == _as_set(await pg.asearch((root,), limit=EVERYTHING))
        assert _as_set(ours_all) == _as_set(await s.mem.asearch((root,), limit=EVERYTHING))
        assert ours_all, "the sequence wrote nothing"
        kinds = [f"{ref} {kind}" for ref in ("pg", "mem") for kind in ("plain", "filter", "query")] + ["list"]
        assert all(s.compared[kind] for kind in kinds), s.compared

        # The official store, pointed at the projection schema, reads exactly the same rows.
        async with official_store(settings.postgres_dsn, dims, settings.postgres_schema) as official:
            await official.setup()  # finds nothing to do
            theirs_all = await official.asearch((root,), limit=EVERYTHING)
            _same_ranking(ours_all, 0, theirs_all, by_score=False)
            assert _rows(theirs_all) == _rows(ours_all)
            for item in ours_all[:10]:
                official_item = await official.aget(item.namespace, item.key)
                assert official_item is not None and _rows([official_item]) == _rows([item])
            query = rnd.choice(WORDS)
            ours_ranked = _scored(await ours.asearch((root,), query=query, limit=20))
            _same_ranking(ours_ranked, 0, await official.asearch((root,), query=query, limit=20), by_score=True)
            assert await official.alist_namespaces(prefix=(root,)) == await ours.alist_namespaces(prefix=(root,))
