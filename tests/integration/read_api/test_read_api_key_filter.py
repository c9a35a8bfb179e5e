"""The key filter the read API serves: a partition's words with the offset below which they hold every
key, as the projector committed them together.
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from graphledger.log.key_filter import KeyFilter
from graphledger_server.log.key_filter import record as record_keys
from graphledger_server.log.key_filter import render_record
from graphledger_server.projection.migrate import migrate
from read_api_helpers import SCHEMA, call, ok, running, settings_for


async def test_the_key_filter_is_served_with_the_offset_below_which_it_holds_every_key(pg: Any) -> None:
    """A partition's words and its applied offset, as the projector committed them together; a partition the
    projector had applied before the filter existed is served as not complete, so no client proves with it."""
    dsn = pg.create_database(f"t_{uuid.uuid4().hex[:12]}")
    await migrate(dsn, SCHEMA)
    settings = settings_for(dsn)
    topic, group = settings.checkpoint_topic, settings.projector_group_id
    conn = await asyncpg.connect(dsn)
    try:
        await record_keys(conn, render_record(SCHEMA), topic, [(2, b"thread-a"), (2, b"thread-b"), (1, b"thread-c")])
        insert = f"INSERT INTO {SCHEMA}.graphledger_offsets (consumer_group, topic, partition, next_offset"
        await conn.execute(f"{insert}) VALUES ($1, $2, 2, 40)", group, topic)
        await conn.execute(f"{insert}, key_filter_complete) VALUES ($1, $2, 1, 9, false)", group, topic)
    finally:
        await conn.close()
    async with running(settings) as served:
        copy = KeyFilter.from_answer(await ok(served.client, "/v1/checkpoints/key-filter", {"partition": 2}))
        assert copy is not None and copy.through == 40
        assert copy.may_hold(b"thread-a") and copy.may_hold(b"thread-b") and not copy.may_hold(b"thread-c")
        older = await ok(served.client, "/v1/checkpoints/key-filter", {"partition": 1})
        assert older["complete"] is False and KeyFilter.from_answer(older) is None
        untouched = await ok(served.client, "/v1/checkpoints/key-filter", {"partition": 3})
        assert untouched["through"] == 0 and untouched["complete"] is True and untouched["indexes"] == b""
        refused = await call(served.client, "/v1/checkpoints/key-filter", {"partition": -1})
        assert refused.status_code == 422 and "partition" in refused.text, refused.text
