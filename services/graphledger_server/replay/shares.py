"""A rebuild's load split by partition between worker processes (`replay run --workers N`).

Share `i` of `N` is every `N`-th partition of the source topics in (topic, partition) order, from the
`i`-th: the shares are disjoint and cover every partition, and every process computes the same ones, so
one partition is applied by one process, in log order, as one projector replica applies it. Share 0's
process is the coordinator: it prepares the rebuild schema, loads its share, waits for every other share
to be marked done, then catches up, indexes, verifies and switches with one `Rebuilder` over every
partition, exactly as a run of one worker (`replay/run.py`).

What is done is kept in the rebuild schema's `graphledger_replay_shares` (a row per share beyond the
coordinator's), so a worker that died and starts again (the same index: a local run again, or Kubernetes
re-running an Indexed Job's pod) resumes from the offsets its share stored, and a coordinator that starts
again does not wait for a share that finished. The table goes with the switch.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import asyncpg

from graphledger.errors import GraphledgerError
from graphledger_server.sql import render

TP = tuple[str, int]

SHARES_SQL = """
CREATE TABLE IF NOT EXISTS {schema}.graphledger_replay_shares (
    share int PRIMARY KEY,
    shares int NOT NULL,
    run text NOT NULL,
    records bigint,
    done_at timestamptz
)
"""
# $1 shares, $2 run: marks another run wrote (or another count) start afresh; the offsets, not the marks,
# say where each partition resumes.
RESET_SQL = "DELETE FROM {schema}.graphledger_replay_shares WHERE shares <> $1::int OR run <> $2::text"
ADD_SQL = """
INSERT INTO {schema}.graphledger_replay_shares (share, shares, run)
SELECT s, $1::int, $2::text FROM generate_series(1, $1::int - 1) AS s
ON CONFLICT (share) DO NOTHING
"""
EXISTS_SQL = "SELECT to_regclass($1::text) IS NOT NULL"
STATE_SQL = """
SELECT shares, run, done_at IS NOT NULL AS done FROM {schema}.graphledger_replay_shares WHERE share = $1::int
"""
DONE_SQL = "UPDATE {schema}.graphledger_replay_shares SET done_at = now(), records = $2::bigint WHERE share = $1::int"
LOADED_SQL = "SELECT coalesce(sum(records), 0)::bigint FROM {schema}.graphledger_replay_shares"
PENDING_SQL = "SELECT share FROM {schema}.graphledger_replay_shares WHERE done_at IS NULL ORDER BY share"
DROP_SQL = "DROP TABLE IF EXISTS {schema}.graphledger_replay_shares"

STALL_S = 5.0
"""How long a share may apply nothing before its worker leaves the rest to the coordinator: a copy barrier
can wait for a partition of another share, which that share's worker may have stopped just short of."""


@dataclass(frozen=True, slots=True)
class Share:
    """Share `index` of `count` (0 <= index < count)."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1:
            raise GraphledgerError(f"--workers must be at least 1, not {self.count}")
        if not 0 <= self.index < self.count:
            raise GraphledgerError(f"--worker-index must be from 0 to {self.count - 1} for {self.count} workers, "
                                   f"not {self.index}")  # fmt: skip

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"

    def of(self, partitions: Iterable[TP]) -> list[TP]:
        """This share's partitions of `partitions`, in (topic, partition) order."""
        return sorted(set(partitions))[self.index :: self.count]


async def open_shares(conn: asyncpg.Connection, schema: str, count: int, run: str) -> None:
    """The coordinator's: a row for each other share of `count` in `run`, kept when this run wrote it before
    (a coordinator started again)."""
    async with conn.transaction():
        await conn.execute(render(SHARES_SQL, schema))
        await conn.execute(render(RESET_SQL, schema), count, run)
        await conn.execute(render(ADD_SQL, schema), count, run)


async def opened(conn: asyncpg.Connection, schema: str, share: Share, run: str) -> bool | None:
    """Whether `share` of `run` is done (None: the coordinator has not opened it for this run yet). A count
    other than the coordinator's is refused: the two would split the partitions otherwise."""
    if not await conn.fetchval(EXISTS_SQL, f"{schema}.graphledger_replay_shares"):
        return None
    row = await conn.fetchrow(render(STATE_SQL, schema), share.index)
    if row is None or row["run"] != run:
        return None
    if row["shares"] != share.count:
        raise GraphledgerError(
            f"the coordinator of the rebuild {schema!r} splits it into {row['shares']} shares, this worker was "
            f"started for {share.count}: start every worker with the same --workers"
        )
    return bool(row["done"])


async def mark_done(conn: asyncpg.Connection, schema: str, share: Share, records: int) -> None:
    await conn.execute(render(DONE_SQL, schema), share.index, records)


async def loaded(conn: asyncpg.Connection, schema: str) -> int:
    """The records the other shares' workers applied."""
    return int(await conn.fetchval(render(LOADED_SQL, schema)))


async def pending(conn: asyncpg.Connection, schema: str) -> list[int]:
    """The shares not done yet, beyond the coordinator's."""
    return [r["share"] for r in await conn.fetch(render(PENDING_SQL, schema))]


async def drop_shares(conn: asyncpg.Connection, schema: str) -> None:
    await conn.execute(render(DROP_SQL, schema))


class Stall:
    """Whether a share's load has stopped moving: positions unchanged for `STALL_S`."""

    def __init__(self, stall_s: float = STALL_S) -> None:
        self._stall_s = stall_s
        self._seen: dict[TP, int] = {}
        self._since = time.monotonic()

    def stalled(self, positions: dict[TP, int]) -> bool:
        now = time.monotonic()
        if positions != self._seen:
            self._seen, self._since = dict(positions), now
            return False
        return now - self._since >= self._stall_s
