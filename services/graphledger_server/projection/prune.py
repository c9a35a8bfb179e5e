"""`thread.prune` with strategy `keep_latest`, as the official `_keep_latest` does it, DeltaChannel-safe.

Per namespace the newest `keep` checkpoints (by checkpoint_id; `prune()` keeps 1, the sweeper's
keep-last-N retention N) are kept, each with the parent a pre-v4 checkpoint reads its pending sends
from; a subgraph call's namespace (a ':' in it) goes whole once the root checkpoint it started from is
saved and not kept. Everything else goes with its writes; kept checkpoints whose parent went get a
NULL parent; blobs no kept checkpoint references go.

The official prune refuses threads with a `DeltaChannel`: such a channel stores no value at most
checkpoints, and `get_delta_channel_history` rebuilds it by walking the head's ancestors (from its
parent, along `parent_checkpoint_id`) and replaying their writes until it reaches one that stores a
value for the channel (inline in `channel_values`, or a non-`empty` blob at its version). Here the
prune keeps exactly that walk: every ancestor on it, with its writes, up to and including the one
where the last channel finds its value.

Which channels to walk: those the head's `counters_since_delta_snapshot` lists (LangGraph keeps a
counter for every DeltaChannel not snapshotted at that checkpoint), less those the head stores itself
or has no version of, as the loader (`_delta_channels_to_replay`) decides. A head marked only with
LangGraph.js's `delta_writes_versioned` names no channels, so every unstored versioned channel is
walked: keeping too much is safe, keeping too little loses state. With `keep` N every kept
checkpoint gets its own walk, so each one's state (`get_state` of any kept history entry) is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
from langgraph.checkpoint.serde.types import TASKS

from graphledger_server.sql import render

# Whether checkpoint `c` stores a value for channel `k` where `get_delta_channel_history` looks:
# a non-`empty` blob at the channel's version, or a non-null inline value (psycopg reads a jsonb
# null as None, which the official walk does not take as a value).
_STORED = """(
    coalesce(jsonb_typeof(c.checkpoint -> 'channel_values' -> k) <> 'null', false)
    OR EXISTS (
        SELECT 1 FROM {schema}.checkpoint_blobs b
        WHERE b.thread_id = c.thread_id AND b.checkpoint_ns = c.checkpoint_ns AND b.channel = k
          AND b.version = c.checkpoint -> 'channel_versions' ->> k AND b.type <> 'empty'
    )
)"""

# Per namespace, the newest $2 checkpoints ("heads", rank 1 the newest): each one's parent it reads
# pending sends from when it predates v4, the root checkpoint its subgraph call started from (and
# whether that is saved), and the channels whose DeltaChannel history it needs. $1 -> thread id.
HEADS_SQL = f"""
SELECT
    h.checkpoint_ns,
    h.checkpoint_id AS head,
    h.rank,
    c.parent_checkpoint_id AS parent,
    CASE WHEN (c.checkpoint ->> 'v')::int < 4 AND EXISTS (
        SELECT 1 FROM {{schema}}.checkpoint_writes w
        WHERE w.thread_id = $1::text AND w.checkpoint_ns = h.checkpoint_ns
          AND w.checkpoint_id = c.parent_checkpoint_id AND w.channel = '{TASKS}'
    ) THEN c.parent_checkpoint_id END AS sends_parent,
    c.metadata -> 'parents' ->> '' AS root,
    EXISTS (
        SELECT 1 FROM {{schema}}.checkpoints r
        WHERE r.thread_id = $1::text AND r.checkpoint_ns = ''
          AND r.checkpoint_id = c.metadata -> 'parents' ->> ''
    ) AS root_saved,
    ARRAY(
        SELECT k FROM jsonb_object_keys(
            CASE
                WHEN jsonb_typeof(c.metadata -> 'counters_since_delta_snapshot') = 'object'
                    THEN c.metadata -> 'counters_since_delta_snapshot'
                WHEN c.metadata ? 'delta_writes_versioned'
                     AND jsonb_typeof(c.checkpoint -> 'channel_versions') = 'object'
                    THEN c.checkpoint -> 'channel_versions'
            END
        ) AS k
        WHERE c.checkpoint -> 'channel_versions' ? k AND NOT {_STORED}
        ORDER BY k
    ) AS walk_channels
FROM (
    SELECT * FROM (
        SELECT checkpoint_ns, checkpoint_id,
               row_number() OVER (PARTITION BY checkpoint_ns ORDER BY checkpoint_id DESC) AS rank
        FROM {{schema}}.checkpoints
        WHERE thread_id = $1::text
    ) AS ranked
    WHERE rank <= $2::int
) AS h
CROSS JOIN LATERAL (
    SELECT * FROM {{schema}}.checkpoints
    WHERE thread_id = $1::text AND checkpoint_ns = h.checkpoint_ns AND checkpoint_id = h.checkpoint_id
) AS c
"""

# The ancestors `get_delta_channel_history` reads for the head's channels: from the head's parent
# along parent_checkpoint_id, each row checking off the channels it stores, until none is left.
# Each step is a primary-key lookup. An ancestor must have a smaller id than its child (uuid6 ids are
# time-ordered; the official walk pages downwards from the head on the same assumption), which also
# ends the recursion on corrupt, cyclic parent links.
# $1 -> thread id, $2 namespace, $3 the head's parent id, $4 channels to walk.
DELTA_WALK_SQL = f"""
WITH RECURSIVE walk(checkpoint_id, parent_checkpoint_id, remaining) AS (
    SELECT c.checkpoint_id, c.parent_checkpoint_id,
           ARRAY(SELECT k FROM unnest($4::text[]) AS k WHERE NOT {_STORED})
    FROM {{schema}}.checkpoints c
    WHERE c.thread_id = $1::text AND c.checkpoint_ns = $2::text AND c.checkpoint_id = $3::text
    UNION ALL
    SELECT c.checkpoint_id, c.parent_checkpoint_id,
           ARRAY(SELECT k FROM unnest(w.remaining) AS k WHERE NOT {_STORED})
    FROM walk w
    JOIN {{schema}}.checkpoints c
      ON c.thread_id = $1::text AND c.checkpoint_ns = $2::text
     AND c.checkpoint_id = w.parent_checkpoint_id AND c.checkpoint_id < w.checkpoint_id
    WHERE cardinality(w.remaining) > 0
)
SELECT checkpoint_id FROM walk
"""

# A subgraph call's namespaces, whole. $1 -> thread id, $2 namespaces.
DELETE_NAMESPACES_SQL = """
WITH c AS (DELETE FROM {schema}.checkpoints WHERE thread_id = $1::text AND checkpoint_ns = ANY($2::text[])),
     w AS (DELETE FROM {schema}.checkpoint_writes WHERE thread_id = $1::text AND checkpoint_ns = ANY($2::text[]))
DELETE FROM {schema}.checkpoint_blobs WHERE thread_id = $1::text AND checkpoint_ns = ANY($2::text[])
"""

# Everything of the pruned namespaces but the kept checkpoints, with the writes of the deleted ones
# (writes of a checkpoint not yet put stay, as in the official prune); kept checkpoints whose parent
# goes get a NULL parent. The UPDATE and the DELETE touch disjoint rows. Returns the channel versions
# the deleted checkpoints referenced, for GC_BLOBS_SQL.
# $1 -> thread id, $2 pruned namespaces, $3/$4 -> unnest(checkpoint_ns, checkpoint_id) of the kept.
DELETE_UNKEPT_SQL = """
WITH kept AS (
    SELECT * FROM unnest($3::text[], $4::text[]) AS k(checkpoint_ns, checkpoint_id)
), deleted AS (
    DELETE FROM {schema}.checkpoints c
    WHERE c.thread_id = $1::text AND c.checkpoint_ns = ANY($2::text[])
      AND NOT EXISTS (
          SELECT 1 FROM kept k WHERE k.checkpoint_ns = c.checkpoint_ns AND k.checkpoint_id = c.checkpoint_id
      )
    RETURNING c.checkpoint_ns, c.checkpoint_id, c.checkpoint -> 'channel_versions' AS versions
), w AS (
    DELETE FROM {schema}.checkpoint_writes cw
    USING deleted d
    WHERE cw.thread_id = $1::text AND cw.checkpoint_ns = d.checkpoint_ns AND cw.checkpoint_id = d.checkpoint_id
), parents AS (
    UPDATE {schema}.checkpoints c SET parent_checkpoint_id = NULL
    FROM kept k
    WHERE c.thread_id = $1::text AND c.checkpoint_ns = k.checkpoint_ns AND c.checkpoint_id = k.checkpoint_id
      AND c.parent_checkpoint_id IS NOT NULL
      AND NOT EXISTS (
          SELECT 1 FROM kept p WHERE p.checkpoint_ns = c.checkpoint_ns AND p.checkpoint_id = c.parent_checkpoint_id
      )
)
SELECT DISTINCT $1::text AS thread_id, d.checkpoint_ns, v.key AS channel, v.value AS version
FROM deleted d
CROSS JOIN LATERAL jsonb_each_text(d.versions) AS v
"""


class PruneStatements:
    """The prune statements rendered for one schema."""

    def __init__(self, schema: str) -> None:
        self.heads = render(HEADS_SQL, schema)
        self.delta_walk = render(DELTA_WALK_SQL, schema)
        self.delete_namespaces = render(DELETE_NAMESPACES_SQL, schema)
        self.delete_unkept = render(DELETE_UNKEPT_SQL, schema)


def subgraph_calls(heads: Sequence[asyncpg.Record], kept: dict[str, set[str]]) -> list[str]:
    """Namespaces of subgraph calls (task id after a ':') whose saved root checkpoint is not kept.

    A `checkpointer=True` subgraph's namespace has no ':' and outlives each call; a call's goes with
    the root checkpoint it started from, but only once that one is saved (it may commit later).
    """
    root_kept = kept.get("", set())
    return sorted(
        h["checkpoint_ns"]
        for h in heads
        if h["rank"] == 1 and ":" in h["checkpoint_ns"] and h["root_saved"] and h["root"] not in root_kept
    )


async def plan_keep(
    conn: asyncpg.Connection, sql: PruneStatements, thread_id: str, keep: int = 1
) -> tuple[dict[str, set[str]], list[str]]:
    """What a `keep_latest` prune of `keep` keeps (read only): the checkpoint ids kept per namespace,
    and the subgraph-call namespaces it deletes whole. Empty when the thread has no checkpoint."""
    heads = await conn.fetch(sql.heads, thread_id, keep)
    kept: dict[str, set[str]] = {}
    for h in heads:
        ids = kept.setdefault(h["checkpoint_ns"], set())
        ids.add(h["head"])
        if h["sends_parent"]:
            ids.add(h["sends_parent"])
        if h["walk_channels"] and h["parent"]:
            rows = await conn.fetch(sql.delta_walk, thread_id, h["checkpoint_ns"], h["parent"], h["walk_channels"])
            ids.update(r["checkpoint_id"] for r in rows)
    return kept, subgraph_calls(heads, kept)


async def keep_latest(
    conn: asyncpg.Connection, sql: PruneStatements, thread_id: str, keep: int = 1
) -> list[tuple[str, str, str, str]]:
    """Prune one thread to its newest `keep` checkpoints per namespace; returns the
    `(thread_id, ns, channel, version)` its deleted checkpoints used.

    The caller garbage-collects those blobs in a later statement, which sees the deletion.
    """
    kept, calls = await plan_keep(conn, sql, thread_id, keep)
    if not kept:
        return []
    if calls:
        await conn.execute(sql.delete_namespaces, thread_id, calls)
    pruned = sorted(ns for ns in kept if ns not in calls)
    pairs = [(ns, cid) for ns in pruned for cid in sorted(kept[ns])]
    rows = await conn.fetch(sql.delete_unkept, thread_id, pruned, [ns for ns, _ in pairs], [cid for _, cid in pairs])
    return [(r["thread_id"], r["checkpoint_ns"], r["channel"], r["version"]) for r in rows]
