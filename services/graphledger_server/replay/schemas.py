"""The schemas a replay works with, found by name and by a comment it writes on them.

For the projection schema `S` (`GRAPHLEDGER_POSTGRES_SCHEMA`): the rebuild is built in `S_rebuild`;
the switch renames `S` to `S_old_<UTC time>` and `S_rebuild` to `S`, in one transaction. Everyone
(projector, read API, an official saver on the projection) names `S` and so follows the switch. Old
schemas stay until `graphledger replay drop-old` drops them; the comment on each says what it is, so
the drop never touches a schema a replay did not retire.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg

from graphledger.errors import GraphledgerError
from graphledger_server.sql import check_schema

REBUILD_SUFFIX = "_rebuild"
OLD_INFIX = "_old_"
MARK = "graphledger replay:"
REBUILD_MARK = MARK + " rebuild of {live}"
OLD_MARK = MARK + " {live} until the switch at {at}"


def rebuild_name(live: str) -> str:
    return _checked(f"{live}{REBUILD_SUFFIX}", live)


def old_name(live: str, at: datetime) -> str:
    return _checked(f"{live}{OLD_INFIX}{at.astimezone(UTC):%Y%m%d%H%M%S}", live)


def _checked(name: str, live: str) -> str:
    try:
        return check_schema(name)
    except ValueError:
        raise GraphledgerError(
            f"schema {live!r} is too long for a replay: {name!r} exceeds Postgres' 63-character names"
        ) from None


@dataclass(frozen=True, slots=True)
class SchemaInfo:
    name: str
    role: str
    """`live`, `rebuild` or `old`."""
    comment: str | None
    bytes: int


# Schemas named like the live one's replay schemas, with their comment and total relation size.
LIST_SQL = """
SELECT n.nspname AS name, obj_description(n.oid, 'pg_namespace') AS comment,
       coalesce((SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c
                 WHERE c.relnamespace = n.oid AND c.relkind IN ('r', 'm')), 0)::bigint AS bytes
FROM pg_namespace n
WHERE n.nspname = $1::text OR n.nspname = $2::text OR starts_with(n.nspname, $3::text)
ORDER BY n.nspname
"""


async def list_schemas(conn: asyncpg.Connection, live: str) -> list[SchemaInfo]:
    """The live schema, its rebuild in progress (if any) and the old schemas its replays retired."""
    rows = await conn.fetch(LIST_SQL, live, rebuild_name(live), f"{live}{OLD_INFIX}")
    found = []
    for r in rows:
        if r["name"] == live:
            role = "live"
        elif r["name"] == rebuild_name(live):
            role = "rebuild"
        elif (r["comment"] or "").startswith(OLD_MARK.format(live=live, at="")):
            role = "old"
        else:
            continue  # named like ours, not made by a replay
        found.append(SchemaInfo(r["name"], role, r["comment"], r["bytes"]))
    return found


async def drop_old(conn: asyncpg.Connection, live: str, names: list[str] | None = None) -> list[str]:
    """Drop the named old schemas (every old schema of `live` without names); returns those dropped.

    A name that is not an old schema of `live` is refused, whatever else was asked.
    """
    old = {s.name for s in await list_schemas(conn, live) if s.role == "old"}
    wanted = sorted(old) if names is None else list(dict.fromkeys(names))
    unknown = [n for n in wanted if n not in old]
    if unknown:
        raise GraphledgerError(
            f"not an old schema of {live!r} retired by a replay: {', '.join(unknown)} "
            f"(old schemas: {', '.join(sorted(old)) or 'none'})"
        )
    for name in wanted:
        await conn.execute(f"DROP SCHEMA {check_schema(name)} CASCADE")
    return wanted


async def drop_rebuild(conn: asyncpg.Connection, live: str) -> bool:
    """Drop an unfinished rebuild of `live`; whether there was one."""
    name = rebuild_name(live)
    exists = await conn.fetchval("SELECT to_regnamespace($1::text) IS NOT NULL", name)
    if exists:
        await conn.execute(f"DROP SCHEMA {name} CASCADE")
    return bool(exists)


async def mark_rebuild(conn: asyncpg.Connection, live: str) -> None:
    await conn.execute(f"COMMENT ON SCHEMA {rebuild_name(live)} IS '{REBUILD_MARK.format(live=live)}'")


async def switch(conn: asyncpg.Connection, live: str, at: datetime) -> str:
    """Inside the caller's transaction: retire `live` under an old name and give its name to the rebuild.

    Returns the old schema's name. Nothing is copied: both renames are catalog updates, visible to
    everyone at once when the transaction commits.
    """
    retired = old_name(live, at)
    await conn.execute(f"ALTER SCHEMA {check_schema(live)} RENAME TO {retired}")
    await conn.execute(f"ALTER SCHEMA {rebuild_name(live)} RENAME TO {live}")
    await conn.execute(f"COMMENT ON SCHEMA {retired} IS '{OLD_MARK.format(live=live, at=at.isoformat())}'")
    await conn.execute(f"COMMENT ON SCHEMA {live} IS NULL")
    return retired
