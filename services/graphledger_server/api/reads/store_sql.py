"""The store reads as SQL: statement templates and the pure builders that fill them, for asyncpg.

Every value a request brings (namespaces, keys, filter paths and operands, the query vector, counts)
is a `$n` parameter with an explicit cast. What is spliced into the text comes from fixed fragments
only: the schema (a checked identifier), pgvector's schema, the vector type and distance operator
(validated literals), and the filter's shape (which fixed fragment each condition uses).

Each template numbers its own parameters `$1`..`$k` (the comment above it lists them); the fragments a
request adds (namespace conditions, the filter) take the numbers after those, in the order
`Params.add` hands them out. A template is rendered once per schema and vector shape and cached
(`_rendered`, `_vector_template`), so building a search's statement is filling in its namespace and
filter fragments, nothing more.

Filters (the language: `graphledger.store_filter`) match as LangGraph's `InMemoryStore` compares
values (`_compare_values` in `langgraph.store.memory`), evaluated on jsonb:
- a field missing from the value reads as JSON null, so `{"f": None}` and `{"f": {"$eq": None}}`
  match it and `$ne` matches it unless the operand is null;
- a dict without `$` keys matches field by field where the value holds an object (a subset match,
  recursively); a list matches a list of the same length element by element;
- `$eq`/`$ne` compare JSON values (numbers numerically: 1 equals 1.0; objects and arrays exactly);
- `$gt`/`$gte`/`$lt`/`$lte` compare numbers numerically and strings by code point; a value of
  another type does not match. `InMemoryStore` converts both sides with `float()` (so it raises on
  strings and missing fields and accepts "5" > 3); `AsyncPostgresStore` compares both sides as text
  (so 10 < 9). Neither is kept.
The one place JSON and Python disagree is kept on JSON's side: `true` is not `1`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from graphledger.store_filter import RANGE_OPERATORS, is_operator_dict
from graphledger_server.opening.vector_index import VectorIndex
from graphledger_server.sql import render

# Every read below has `(s.expires_at IS NULL OR s.expires_at > now())`: rows past their TTL are
# hidden from every read until the sweeper's expiry events delete them.

# $1 prefixes, $2 keys -> unnest(...): the items asked for, pairwise.
GET_SQL = """
SELECT s.prefix, s.key, s.value, s.created_at, s.updated_at, s.expires_at
FROM {schema}.store s
JOIN unnest($1::text[], $2::text[]) AS u(prefix, key) ON s.prefix = u.prefix AND s.key = u.key
WHERE (s.expires_at IS NULL OR s.expires_at > now())
"""

# The rows a store get folds its item's unprojected records onto, expired or not (a put on an expired
# row keeps its created_at), with the TTL a refresh restarts and the transaction's time; one row per
# item asked, its columns null when there is no row. $1 prefixes, $2 keys -> unnest(...), pairwise.
ITEM_ROWS_SQL = """
SELECT u.prefix, u.key, s.value, s.created_at, s.updated_at, s.expires_at,
       coalesce(s.graphledger_ttl_minutes, s.ttl_minutes) AS ttl, now() AS now
FROM unnest($1::text[], $2::text[]) AS u(prefix, key)
LEFT JOIN {schema}.store s ON s.prefix = u.prefix AND s.key = u.key
"""

# As AsyncPostgresStore orders a search without a query (most recently updated first), plus a
# tie-break so paging is stable when two items share an update time. $1 limit, $2 offset.
SEARCH_ALL_SQL = """
SELECT s.prefix, s.key, s.value, s.created_at, s.updated_at, s.expires_at, NULL::float8 AS score
FROM {schema}.store s
WHERE (s.expires_at IS NULL OR s.expires_at > now()) AND {filter}
ORDER BY s.updated_at DESC, s.prefix, s.key
LIMIT $1::bigint OFFSET $2::bigint
"""

# The same below a namespace prefix, in two parts merged by update time: the namespace itself, read
# newest first from `graphledger_store_recent_idx` and stopped after a page of matches (the common
# case: one user's memories), and the namespaces below it (a range of the same index, then sorted).
# $1 limit, $2 offset, $3 the namespace (dot-joined), $4 the LIKE pattern of the namespaces below it,
# $5 the window each part reads (limit + offset).
SEARCH_SQL = """
SELECT s.prefix, s.key, s.value, s.created_at, s.updated_at, s.expires_at, NULL::float8 AS score FROM (
    (SELECT s.prefix, s.key, s.value, s.created_at, s.updated_at, s.expires_at FROM {schema}.store s
     WHERE s.prefix = $3::text AND (s.expires_at IS NULL OR s.expires_at > now()) AND {filter}
     ORDER BY s.updated_at DESC, s.key LIMIT $5::bigint)
    UNION ALL
    (SELECT s.prefix, s.key, s.value, s.created_at, s.updated_at, s.expires_at FROM {schema}.store s
     WHERE s.prefix LIKE $4::text ESCAPE '\\' AND (s.expires_at IS NULL OR s.expires_at > now()) AND {filter}
     ORDER BY s.updated_at DESC, s.prefix, s.key LIMIT $5::bigint)
) s
ORDER BY s.updated_at DESC, s.prefix, s.key
LIMIT $1::bigint OFFSET $2::bigint
"""

# An index search that continues past the nearest `ef_search` rows when the filter or namespace
# rejects some of them, for one statement (inside its transaction). Not the default: an iterative scan
# costs more even when it never iterates (0.3-0.5 ms at ef_search 100, measured: it keeps every
# discarded candidate), so searches try without one first (`StoreReader._index_page`).
ITERATIVE_SCAN_SQL = "SET LOCAL hnsw.iterative_scan = strict_order"

# Exact search: every vector of every matching item scored, max-pooled per item; items without
# vectors follow, most recently updated first (as InMemoryStore fills the tail), then one
# LIMIT/OFFSET over the whole ranking. `{op}` is the distance operator, `{score}` turns the best
# (smallest) distance into the score AsyncPostgresStore reports. The query vector arrives as
# pgvector's text form, which Postgres parses faster than a driver adapts a float8[].
# $1 the query vector, $2 limit, $3 offset.
EXACT_VECTOR_SEARCH_SQL = """
WITH q AS MATERIALIZED (
    SELECT $1::{ext}.{vector_type} AS v
), items AS MATERIALIZED (
    SELECT s.prefix, s.key, s.value, s.created_at, s.updated_at, s.expires_at
    FROM {schema}.store s
    WHERE {namespace} AND (s.expires_at IS NULL OR s.expires_at > now()) AND {filter}
), best AS (
    SELECT sv.prefix, sv.key, min(sv.embedding OPERATOR({ext}.{op}) (SELECT v FROM q)) AS dist
    FROM items i
    JOIN {schema}.store_vectors sv ON sv.prefix = i.prefix AND sv.key = i.key
    GROUP BY sv.prefix, sv.key
)
SELECT i.prefix, i.key, i.value, i.created_at, i.updated_at, i.expires_at, {score} AS score
FROM items i
LEFT JOIN best b ON b.prefix = i.prefix AND b.key = i.key
ORDER BY b.dist IS NULL, b.dist, i.updated_at DESC, i.prefix, i.key
LIMIT $2::bigint OFFSET $3::bigint
"""

# Index search, one round trip: `scope` counts the matching items up to `exact_max` + 1; when more
# match (`large`), the nearest vector rows of matching items come from the HNSW index (ORDER BY
# distance LIMIT), max-pooled per item. When few match, the index scan never starts (a one-time
# filter) and the caller runs the exact search: in a small namespace it is cheap, and an index scan
# would have to pass over most of the graph to find its items. Every answer has at least the row
# carrying `large`; its item columns are NULL when the page is empty.
# $1 the query vector, $2 limit, $3 offset, $4 candidates, $5 exact_max.
INDEX_VECTOR_SEARCH_SQL = """
WITH q AS MATERIALIZED (
    SELECT $1::{ext}.{vector_type} AS v
), scope AS MATERIALIZED (
    SELECT count(*) > $5::bigint AS large FROM (
        SELECT 1 FROM {schema}.store s
        WHERE {namespace} AND (s.expires_at IS NULL OR s.expires_at > now()) AND {filter}
        LIMIT $5::bigint + 1
    ) AS x
), candidates AS MATERIALIZED (
    SELECT s.prefix, s.key, s.value, s.created_at, s.updated_at, s.expires_at,
           sv.embedding OPERATOR({ext}.{op}) (SELECT v FROM q) AS dist
    FROM {schema}.store_vectors sv
    JOIN {schema}.store s ON s.prefix = sv.prefix AND s.key = sv.key
    WHERE (SELECT large FROM scope) AND {vector_namespace}
      AND (s.expires_at IS NULL OR s.expires_at > now()) AND {filter}
    ORDER BY sv.embedding OPERATOR({ext}.{op}) (SELECT v FROM q)
    LIMIT $4::bigint
), page AS (
    SELECT b.prefix, b.key, b.value, b.created_at, b.updated_at, b.expires_at, {score} AS score, b.dist
    FROM (SELECT DISTINCT ON (prefix, key) * FROM candidates ORDER BY prefix, key, dist) AS b
    ORDER BY b.dist, b.updated_at DESC, b.prefix, b.key
    LIMIT $2::bigint OFFSET $3::bigint
)
SELECT scope.large, page.prefix, page.key, page.value, page.created_at, page.updated_at, page.expires_at, page.score
FROM scope LEFT JOIN page ON true
ORDER BY page.dist, page.updated_at DESC, page.prefix, page.key
"""

# The same index search once the scope is known to be large (`scope_verdicts`): no count, and no
# CTEs for the planner to plan (0.1-0.3 ms less per search, measured); the query vector parameter
# appears twice but is sent once. $1 the query vector, $2 limit, $3 offset; `{candidates}` a literal.
# Written so that Postgres keeps one generic plan of the prepared statement instead of planning every
# search anew (0.2 ms of planning, 1.1 against 0.8 ms a search at 9,000 vectors, measured): it keeps
# the generic plan once that is estimated no dearer than the searches' custom plans, and a generic
# plan guesses that a parameter's LIMIT keeps a tenth of the rows and that a namespace or filter
# condition on parameters keeps a fraction of a percent, so it would cost the index scan many times
# over. Hence the candidates' LIMIT is a literal (rounded up to a power of two: few statements to
# prepare) and the conditions are guessed to keep nearly every row, as `search_statement` guesses its
# filter: true of a large scope, the only one this statement searches, whose plan is always the scan
# of the index.
INDEX_VECTOR_PAGE_SQL = """
SELECT b.prefix, b.key, b.value, b.created_at, b.updated_at, b.expires_at, {score} AS score
FROM (
    SELECT DISTINCT ON (c.prefix, c.key) * FROM (
        SELECT s.prefix, s.key, s.value, s.created_at, s.updated_at, s.expires_at,
               sv.embedding OPERATOR({ext}.{op}) $1::{ext}.{vector_type} AS dist
        FROM {schema}.store_vectors sv
        JOIN {schema}.store s ON s.prefix = sv.prefix AND s.key = sv.key
        WHERE (CASE WHEN {vector_namespace} THEN 1 ELSE 0 END) <> 0
          AND (s.expires_at IS NULL OR s.expires_at > now()) AND (CASE WHEN {filter} THEN 1 ELSE 0 END) <> 0
        ORDER BY sv.embedding OPERATOR({ext}.{op}) $1::{ext}.{vector_type}
        LIMIT {candidates}
    ) AS c
    ORDER BY c.prefix, c.key, c.dist
) AS b
ORDER BY b.dist, b.updated_at DESC, b.prefix, b.key
LIMIT $2::bigint OFFSET $3::bigint
"""

# Vector rows and items, as the planner's statistics count them (-1 until the first ANALYZE or VACUUM).
STATISTICS_SQL = """
SELECT v.reltuples AS vectors, s.reltuples AS items
FROM pg_class v, pg_class s
WHERE v.oid = '{schema}.store_vectors'::regclass AND s.oid = '{schema}.store'::regclass
"""

# AsyncPostgresStore's score per distance: higher is closer.
SCORES = {"cosine": "1 - b.dist", "l2": "-b.dist", "inner_product": "-b.dist"}

# list_namespaces: the distinct namespaces of live items matching the prefix and suffix patterns
# (`*` matches any one label), truncated to max_depth and deduplicated, ordered as AsyncPostgresStore
# orders them (by the dot-joined text; here byte-wise, whatever the database's collation).
# `{narrow}` restricts the scan with the pattern's leading literal labels (the prefix index).
# $1 the prefix pattern (labels, `*` for any one), $2 the suffix pattern, $3 max_depth, $4 limit, $5 offset;
# each null when not asked for.
LIST_NAMESPACES_SQL = """
WITH labelled AS (
    SELECT string_to_array(n.prefix, '.') AS labels
    FROM (
        SELECT DISTINCT s.prefix FROM {schema}.store s
        WHERE {narrow} AND (s.expires_at IS NULL OR s.expires_at > now())
    ) AS n
), matched AS (
    SELECT CASE WHEN $3::int IS NULL THEN l.labels ELSE l.labels[1:$3::int] END AS labels
    FROM labelled l
    WHERE ($1::text[] IS NULL OR (
            cardinality(l.labels) >= cardinality($1::text[])
            AND NOT EXISTS (
                SELECT 1 FROM unnest($1::text[]) WITH ORDINALITY AS p(label, i)
                WHERE p.label <> '*' AND p.label IS DISTINCT FROM l.labels[p.i::int])))
      AND ($2::text[] IS NULL OR (
            cardinality(l.labels) >= cardinality($2::text[])
            AND NOT EXISTS (
                SELECT 1 FROM unnest($2::text[]) WITH ORDINALITY AS p(label, i)
                WHERE p.label <> '*' AND p.label IS DISTINCT FROM
                    l.labels[cardinality(l.labels) - cardinality($2::text[]) + p.i::int])))
)
SELECT labels FROM matched
GROUP BY labels
ORDER BY array_to_string(labels, '.') COLLATE "C"
LIMIT $4::bigint OFFSET $5::bigint
"""

MAX_ARRAY_SUBSCRIPT = 2**31 - 1
MAX_BIGINT = 2**63 - 1
"""LIMIT and OFFSET are bigints: a page's end or a candidate count past this is clamped to it."""

Statement = tuple[str, list[Any]]
"""A statement's text and its arguments, `$1` first: `conn.fetch(sql, *args)`."""


class Params:
    """The arguments of one statement: a template's own (`$1`..`$k`, in order), then one per `add`."""

    def __init__(self, *template_values: Any) -> None:
        self.values: list[Any] = list(template_values)

    def add(self, value: Any) -> str:
        """A new argument's placeholder (`$n`)."""
        self.values.append(value)
        return f"${len(self.values)}"


@functools.lru_cache(maxsize=64)
def _rendered(template: str, schema: str) -> str:
    return render(template, schema)


@functools.lru_cache(maxsize=64)
def _vector_template(template: str, schema: str, ext: str, index: VectorIndex) -> str:
    """A vector search template with everything but its namespace and filter fragments filled in."""
    return (
        render(template, schema)
        .replace("{ext}", ext)
        .replace("{vector_type}", index.vector_type)
        .replace("{op}", index.operator)
        .replace("{score}", SCORES[index.distance])
    )


def escape_like(text: str) -> str:
    """`text` matched literally by LIKE (with ESCAPE '\\'): labels may hold `%` and `_`."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def namespace_condition(labels: Sequence[str], params: Params, column: str = "s.prefix") -> str:
    """The namespace itself or anything below it (`("a",)` does not cover `("ab",)`); index-friendly."""
    if not labels:
        return "TRUE"
    prefix = ".".join(labels)
    exact, below = params.add(prefix), params.add(escape_like(prefix) + ".%")
    return f"({column} = {exact}::text OR {column} LIKE {below}::text ESCAPE '\\')"


def compile_filter(filter: dict[str, Any] | None, params: Params, column: str = "s.value") -> str:
    """A filter `check_filter` accepted as one boolean SQL expression on the jsonb `column`."""
    if not filter:
        return "TRUE"
    return " AND ".join(_condition(column, [field], condition, params) for field, condition in filter.items())


def _at(column: str, path: list[str], params: Params) -> str:
    """The jsonb at `path` (SQL NULL where the value has nothing there)."""
    if len(path) == 1:
        return f"({column} -> {params.add(path[0])}::text)"
    return f"({column} #> {params.add(path)}::text[])"


def _condition(column: str, path: list[str], condition: Any, params: Params) -> str:
    at = _at(column, path, params)
    if isinstance(condition, dict):
        if is_operator_dict(condition):
            return "(" + " AND ".join(_operator(at, op, operand, params) for op, operand in condition.items()) + ")"
        parts = [f"jsonb_typeof({at}) = 'object'"]
        parts += [_condition(column, [*path, key], sub, params) for key, sub in condition.items()]
        return "(" + " AND ".join(parts) + ")"
    if isinstance(condition, list):
        length = params.add(len(condition))
        parts = [f"CASE WHEN jsonb_typeof({at}) = 'array' THEN jsonb_array_length({at}) = {length}::int ELSE false END"]
        parts += [_condition(column, [*path, str(i)], sub, params) for i, sub in enumerate(condition)]
        return "(" + " AND ".join(parts) + ")"
    return _equals(at, condition, params)


def _equals(at: str, operand: Any, params: Params) -> str:
    # A missing field reads as JSON null.
    if operand is None:
        return f"({at} IS NULL OR {at} = 'null'::jsonb)"
    return f"{at} = {params.add(json.dumps(operand))}::jsonb"


def _operator(at: str, operator: str, operand: Any, params: Params) -> str:
    # CASE, not AND: Postgres estimates `jsonb_typeof(x) = 'number' AND x < n` to match almost no
    # rows and then prefers a full scan to the vector index; an opaque CASE keeps its default guess.
    if operator == "$eq":
        return _equals(at, operand, params)
    if operator == "$ne":
        if operand is None:
            return f"({at} IS NOT NULL AND {at} <> 'null'::jsonb)"
        return f"({at} IS NULL OR {at} <> {params.add(json.dumps(operand))}::jsonb)"
    sql = RANGE_OPERATORS[operator]
    if isinstance(operand, str):
        return (
            f"CASE WHEN jsonb_typeof({at}) = 'string' "
            f"THEN ({at} #>> '{{}}') COLLATE \"C\" {sql} {params.add(operand)}::text ELSE false END"
        )
    # jsonb compares two numbers numerically.
    number = params.add(json.dumps(operand))
    return f"CASE WHEN jsonb_typeof({at}) = 'number' THEN {at} {sql} {number}::jsonb ELSE false END"


# --- statements -------------------------------------------------------------------------------------


def item_rows_statement(schema: str, items: Sequence[tuple[str, str]]) -> Statement:
    return _rendered(ITEM_ROWS_SQL, schema), [[p for p, _ in items], [k for _, k in items]]


def get_statement(schema: str, items: Sequence[tuple[str, str]]) -> Statement:
    return _rendered(GET_SQL, schema), [[p for p, _ in items], [k for _, k in items]]


def search_statement(
    schema: str, namespace_prefix: Sequence[str], filter: dict[str, Any] | None, limit: int, offset: int
) -> Statement:
    if namespace_prefix:
        prefix = ".".join(namespace_prefix)
        template = SEARCH_SQL
        params = Params(limit, offset, prefix, escape_like(prefix) + ".%", min(limit + offset, MAX_BIGINT))
    else:
        template = SEARCH_ALL_SQL
        params = Params(limit, offset)
    condition = compile_filter(filter, params)
    if filter:
        # Postgres guesses a jsonb condition matches a fraction of a percent of the rows, so it would
        # filter and sort the whole namespace rather than walk the recent-items index and stop after
        # a page. As `<> 0` the same condition is guessed to match nearly every row: the index walk
        # wins (0.1 ms against 0.9 ms for a page of 2,000 items), and a selective filter costs at
        # most the scan it would have had anyway.
        condition = f"(CASE WHEN {condition} THEN 1 ELSE 0 END) <> 0"
    return _rendered(template, schema).replace("{filter}", condition), params.values


def vector_text(vector: Sequence[float]) -> str:
    """pgvector's text form of a (finite) vector; `repr` keeps every float's digits."""
    return "[" + ",".join(map(repr, vector)) + "]"


def vector_search_statement(
    schema: str,
    ext: str,
    index: VectorIndex,
    namespace_prefix: Sequence[str],
    filter: dict[str, Any] | None,
    query: Sequence[float],
    limit: int,
    offset: int,
    *,
    index_scope: tuple[int, int] | None = None,
) -> Statement:
    """The exact search, or with `index_scope` = (exact_max, candidates) the index search over the
    `candidates` nearest vector rows where more than `exact_max` items match (exact_max < 0: the
    scope is known to be large, so nothing is counted and the rows have no `large` column)."""
    params = Params(vector_text(query), limit, offset)
    if index_scope is None:
        sql = _vector_template(EXACT_VECTOR_SEARCH_SQL, schema, ext, index)
    else:
        exact_max, candidates = index_scope
        if exact_max >= 0:
            sql = _vector_template(INDEX_VECTOR_SEARCH_SQL, schema, ext, index)
            params.values += [min(candidates, MAX_BIGINT), exact_max]
        else:
            power_of_two = 1 << max(0, candidates - 1).bit_length()
            sql = _vector_template(INDEX_VECTOR_PAGE_SQL, schema, ext, index)
            sql = sql.replace("{candidates}", str(min(power_of_two, MAX_BIGINT)))
        sql = sql.replace("{vector_namespace}", namespace_condition(namespace_prefix, params, "sv.prefix"))
    if "{namespace}" in sql:  # not in the page statement, which filters on the vector rows' prefix
        sql = sql.replace("{namespace}", namespace_condition(namespace_prefix, params))
    return sql.replace("{filter}", compile_filter(filter, params)), params.values


def list_namespaces_statement(
    schema: str,
    prefix: Sequence[str] | None,
    suffix: Sequence[str] | None,
    max_depth: int | None,
    limit: int,
    offset: int,
) -> Statement:
    params = Params(
        list(prefix) if prefix else None,
        list(suffix) if suffix else None,
        # Array subscripts are 32-bit; no namespace has that many labels, so a deeper max_depth
        # truncates nothing either way.
        None if max_depth is None else min(max_depth, MAX_ARRAY_SUBSCRIPT),
        limit,
        offset,
    )
    sql = _rendered(LIST_NAMESPACES_SQL, schema).replace("{narrow}", _narrow(prefix or (), params))
    return sql, params.values


def _narrow(prefix: Sequence[str], params: Params) -> str:
    """The leading literal labels of a prefix pattern as an index-friendly condition on `s.prefix`."""
    literal = list(prefix[: prefix.index("*")] if "*" in prefix else prefix)
    if not literal:
        return "TRUE"
    if len(literal) == len(prefix):
        return namespace_condition(literal, params)
    # A wildcard follows: at least one more label.
    return f"s.prefix LIKE {params.add(escape_like('.'.join(literal)) + '.%')}::text ESCAPE '\\'"
