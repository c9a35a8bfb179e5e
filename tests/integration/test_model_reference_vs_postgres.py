"""The reference of the model-based test answers as the official `AsyncPostgresSaver` does: the same
random scripts (`model_ops.Generator`, one agent, no concurrency) applied to both, every read compared.
The official saver has no `copy_thread`, `delete_for_runs` or erasure: those are left out here."""

from __future__ import annotations

import os
from typing import Any

import pytest
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from model_check import _ordered
from model_ops import Generator, build_graph
from model_reference import ReferenceSaver

SEEDS = [int(s) for s in os.environ.get("GRAPHLEDGER_MODEL_REFERENCE_SEEDS", "1,2,3").split(",")]
UNOFFICIAL = ("copy_thread", "delete_for_runs", "erase", "turn")
"""Kinds the official saver does not answer as the reference does: copies, deletes of runs, erasure, and turns
(the one-writer rule is graphledger's)."""


async def _apply(saver: Any, graph: Any, kind: str, a: dict[str, Any]) -> Any:
    match kind:
        case "put":
            configurable = {"thread_id": a["thread"], "checkpoint_ns": a["ns"], **a["extra"]}
            if a["parent"] is not None:
                configurable["checkpoint_id"] = a["parent"]
            await saver.aput({"configurable": configurable}, a["checkpoint"], a["metadata"], a["new_versions"])
        case "put_writes":
            config = {
                "configurable": {
                    "thread_id": a["thread"],
                    "checkpoint_ns": a["ns"],
                    "checkpoint_id": a["checkpoint_id"],
                }
            }
            await saver.aput_writes(config, a["writes"], a["task_id"], a["task_path"])
        case "delete_thread":
            await saver.adelete_thread(a["thread"])
        case "prune":
            await saver.aprune(a["threads"], strategy=a["strategy"])
        case "get_tuple":
            configurable = {"thread_id": a["thread"], "checkpoint_ns": a["ns"]}
            if a["checkpoint_id"] is not None:
                configurable["checkpoint_id"] = a["checkpoint_id"]
            return await saver.aget_tuple({"configurable": configurable})
        case "list":
            configurable = {"thread_id": a["thread"]}
            if a["ns"] is not None:
                configurable["checkpoint_ns"] = a["ns"]
            before = {"configurable": {"checkpoint_id": a["before"]}} if a["before"] else None
            found = saver.alist({"configurable": configurable}, filter=a["filter"], before=before, limit=a["limit"])
            return [t async for t in found]
        case "list_all":
            return [t async for t in saver.alist(None, filter=a["filter"])]
        case "get_state":
            return await graph.aget_state({"configurable": {"thread_id": a["thread"]}})
        case _:
            raise AssertionError(kind)
    return None


@pytest.mark.parametrize("seed", SEEDS)
async def test_the_reference_answers_as_the_official_postgres_saver(fresh_database: str, seed: int) -> None:
    script = Generator(seed, agents=1, prefix=f"s{seed}", excluded=UNOFFICIAL).script(400, faults_every=10**9)
    reference = ReferenceSaver()
    reference_graph = build_graph(reference)
    async with AsyncPostgresSaver.from_conn_string(fresh_database) as official:
        await official.setup()
        official_graph = build_graph(official)
        for op in script.ops:
            theirs = await _apply(official, official_graph, op.kind, op.args)
            ours = await _apply(reference, reference_graph, op.kind, op.args)
            assert ours == theirs, f"seed {seed} op#{op.index} {op.kind} {op.args}"
            assert _ordered(ours) == _ordered(theirs), f"key order: seed {seed} op#{op.index} {op.kind}"
