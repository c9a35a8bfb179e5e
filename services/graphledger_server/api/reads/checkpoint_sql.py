"""The statements of the checkpoint reads beyond the official saver's own: named constants and the pure
builders that shape them (placeholders `%(name)s`, psycopg's; the schema is the session's search path).

A get of a namespace's newest checkpoint reads, besides the saver's answer, what a client needs to hold
the thread from it: the thread's namespaces, the writes of checkpoints whose puts are still to come, and
the namespace's blob ceilings; a read that folds the thread's unprojected records reads them with the
projection's applied offset in one statement (`THROUGH_NEWEST_SQL`).
"""

from __future__ import annotations

import functools

from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from graphledger_server.log.offsets import SNAPSHOT_OFFSET_SQL


def _skip_scan(table: str, name: str) -> str:
    """The CTE `name` of the thread's namespaces in `table`, by a skip scan of its primary key: one index
    probe per namespace however many rows each holds (and a final null)."""
    return f"""{name} AS (
    (SELECT checkpoint_ns FROM {table} WHERE thread_id = %(thread)s ORDER BY checkpoint_ns LIMIT 1)
    UNION ALL
    SELECT (SELECT n.checkpoint_ns FROM {table} n
            WHERE n.thread_id = %(thread)s AND n.checkpoint_ns > {name}.checkpoint_ns
            ORDER BY n.checkpoint_ns LIMIT 1)
    FROM {name} WHERE {name}.checkpoint_ns IS NOT NULL
)"""


# Every namespace of a thread, a checkpoint's or a pending write's (writes can reach a namespace before
# any put there: a put of their checkpoint must then be read with them). %(thread)s -> the stored thread
# id; at most %(most)s.
THREAD_NAMESPACES_SQL = f"""
WITH RECURSIVE {_skip_scan("checkpoints", "c")}, {_skip_scan("checkpoint_writes", "w")}
SELECT checkpoint_ns FROM (
    (SELECT checkpoint_ns FROM c WHERE checkpoint_ns IS NOT NULL LIMIT %(most)s)
    UNION
    (SELECT checkpoint_ns FROM w WHERE checkpoint_ns IS NOT NULL LIMIT %(most)s)
) named ORDER BY checkpoint_ns LIMIT %(most)s
"""
# The writes of a namespace's checkpoints newer than an answer's: writes that reached the log before
# their put. %(thread)s, %(ns)s, %(newest)s -> the stored thread id, the namespace, the answer's checkpoint
# id ('' for none). Given the id, not found again here: a put applied since would hide its writes.
LATER_WRITES_SQL = """
SELECT checkpoint_id, task_id, task_path, idx, channel, type, blob FROM checkpoint_writes
WHERE thread_id = %(thread)s AND checkpoint_ns = %(ns)s AND checkpoint_id > %(newest)s
ORDER BY checkpoint_id, task_path, task_id, idx
LIMIT %(most)s
"""
MAX_LATER_WRITES = 1000
MAX_NAMESPACES = 1000
"""Most namespaces a get names; a thread with more answers without the list (the client then asks for each)."""

# Whether the projection holds writes of a checkpoint newer than the namespace's newest (writes that
# reached the log before their put): a put of it among the unprojected records would come with them,
# which the fold does not know. %(thread)s, %(ns)s, %(newest)s -> the newest id ('': none).
EARLY_WRITES_SQL = """
SELECT EXISTS (
    SELECT 1 FROM checkpoint_writes
    WHERE thread_id = %(thread)s AND checkpoint_ns = %(ns)s AND checkpoint_id > %(newest)s
) AS early
"""

# Per channel of a namespace, the counter of its blob rows' highest version (`thread.version_counter`;
# 2^63 when that version has no counter), as one jsonb object: a put naming a version with a counter
# above it names no row, so a client holding the namespace answers it without asking. Versions with a
# counter sort by it, and above them only versions without one: one skip scan of the primary key over
# the channels and one backward index probe each, however many rows the namespace holds. %(thread)s, %(ns)s.
BLOB_CEILINGS_SQL = """
WITH RECURSIVE channels AS (
    (SELECT channel FROM checkpoint_blobs WHERE thread_id = %(thread)s AND checkpoint_ns = %(ns)s
     ORDER BY channel LIMIT 1)
    UNION ALL
    SELECT (SELECT b.channel FROM checkpoint_blobs b
            WHERE b.thread_id = %(thread)s AND b.checkpoint_ns = %(ns)s AND b.channel > channels.channel
            ORDER BY b.channel LIMIT 1)
    FROM channels WHERE channels.channel IS NOT NULL
)
SELECT coalesce(jsonb_object_agg(
    channel,
    CASE WHEN top ~ '^[0-9]{32}([.]|$)' THEN left(top, 32)::numeric ELSE 9223372036854775808 END
), '{}'::jsonb) AS ceilings
FROM (
    SELECT channel, (
        SELECT b.version FROM checkpoint_blobs b
        WHERE b.thread_id = %(thread)s AND b.checkpoint_ns = %(ns)s AND b.channel = channels.channel
        ORDER BY b.version DESC LIMIT 1
    ) AS top
    FROM channels WHERE channel IS NOT NULL
) tops
"""

# A get's namespaces and blob ceilings, on one connection. %(thread)s, %(ns)s, %(most)s.
NAMESPACES_AND_CEILINGS_SQL = f"SELECT ARRAY({THREAD_NAMESPACES_SQL}) AS namespaces, ({BLOB_CEILINGS_SQL}) AS ceilings"

# What the one-writer rule holds of a thread (`graphledger.ownership`): its operation count, and the lead of a
# namespace (no row: open). %(thread)s, %(ns)s.
BASIS_SQL = """
SELECT coalesce((SELECT operations FROM graphledger_thread_ledgers WHERE thread_id = %(thread)s), 0) AS operations
"""
LEAD_SQL = """
SELECT lead, lead_run, lead_id, lead_writer FROM graphledger_thread_leads
WHERE thread_id = %(thread)s AND checkpoint_ns = %(ns)s
"""
THREAD_BASIS_SQL = (
    "SELECT g.operations, l.lead, l.lead_run, l.lead_id, l.lead_writer"
    f" FROM ({BASIS_SQL}) g LEFT JOIN LATERAL ({LEAD_SQL}) l ON true"
)
"""A thread's basis on its own, read before the checkpoint a get answers after waiting for the projection: an
operation or a put in between makes its writer's intent stale, so the writer is refused, never wrongly let on."""


# What a get of a namespace's newest checkpoint folds the thread's unprojected records onto, in one
# statement, so in one snapshot (a projector batch commits rows and offsets at once): the projection's
# applied offset on the thread's partition, every namespace of the thread (at most %(most)s), the newest
# checkpoint's row as the official saver selects it (its columns null without one), whether writes
# of a newer checkpoint wait for their put (as EARLY_WRITES_SQL), the blob ceilings and whether the
# thread was erased (ERASED_SQL), and the one-writer rule's basis (BASIS_SQL, LEAD_SQL). One round trip: the reads
# that hop between processes pay for each.
# %(group)s, %(topic)s, %(partition)s, %(thread)s, %(ns)s, %(most)s, %(ref)s (the thread's reference).
THROUGH_NEWEST_SQL = f"""
SELECT o.applied, n.namespaces, t.*, e.early, b.ceilings, ({{erased}}) AS erased, g.operations, l.lead, l.lead_run,
       l.lead_id, l.lead_writer
FROM (SELECT coalesce(({SNAPSHOT_OFFSET_SQL}), 0) AS applied) o
CROSS JOIN LATERAL ({BASIS_SQL}) g
LEFT JOIN LATERAL ({LEAD_SQL}) l ON true
CROSS JOIN LATERAL (SELECT ARRAY({THREAD_NAMESPACES_SQL}) AS namespaces) n
LEFT JOIN LATERAL (
    {AsyncPostgresSaver.SELECT_SQL} WHERE thread_id = %(thread)s AND checkpoint_ns = %(ns)s
    ORDER BY checkpoint_id DESC LIMIT 1
) t ON true
CROSS JOIN LATERAL (
    SELECT EXISTS (
        SELECT 1 FROM checkpoint_writes w
        WHERE w.thread_id = %(thread)s AND w.checkpoint_ns = %(ns)s AND w.checkpoint_id > coalesce(t.checkpoint_id, '')
    ) AS early
) e
CROSS JOIN LATERAL ({BLOB_CEILINGS_SQL}) b
"""
# The key store's record of an erased subject: its data key row, the key gone (`keys/key_store.py`).
ERASED_SQL = "EXISTS (SELECT 1 FROM {schema}.data_keys k WHERE k.ref = %(ref)s AND k.wrapped IS NULL)"
NOT_SEALED_SQL = "false"
"""Without a key store nothing records an erasure: a thread's rows are dropped, and it reads as new."""


@functools.cache
def through_newest_sql(key_store_schema: str | None) -> str:
    """THROUGH_NEWEST_SQL asking the key store in `key_store_schema` (None: none) whether the thread was erased."""
    erased = ERASED_SQL.format(schema=key_store_schema) if key_store_schema is not None else NOT_SEALED_SQL
    return THROUGH_NEWEST_SQL.replace("{erased}", erased)  # not format: the statement has braces of its own


# The one-writer rule's refusals among a thread's records at %(offsets)s of %(topic)s:%(partition)s.
REFUSALS_SQL = """
SELECT "offset", reason, superseded_by FROM graphledger_refusals
WHERE topic = %(topic)s AND partition = %(partition)s AND "offset" = ANY(%(offsets)s) AND thread_id = %(thread)s
ORDER BY "offset"
"""
