"""The official AsyncPostgresSaver, pointed at the projection, returns the same tuples as KafkaSaver."""

from __future__ import annotations

import uuid

from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from graphledger import KafkaSaver
from graphledger_server.devstack.demo import build_graph


async def test_official_saver_reads_the_same_tuples(stack) -> None:
    settings = stack.settings
    async with KafkaSaver(settings) as saver:
        graph = build_graph().compile(checkpointer=saver)
        config = {"configurable": {"thread_id": str(uuid.uuid4())}}
        await graph.ainvoke({"foo": ""}, config)
        ours = [t async for t in saver.alist(config)]
        latest = await saver.aget_tuple(config)

    async with await AsyncConnection.connect(
        settings.postgres_dsn,
        autocommit=True,
        prepare_threshold=0,
        row_factory=dict_row,
        options=f"-c search_path={settings.postgres_schema}",
    ) as conn:
        official = AsyncPostgresSaver(conn)
        theirs = [t async for t in official.alist(config)]
        assert await official.aget_tuple(config) == latest
        for tup in ours:
            assert await official.aget_tuple(tup.config) == tup
    assert theirs == ours
    assert len(ours) == 4
