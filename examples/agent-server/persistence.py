"""The Agent Server's persistence: checkpoints and pending writes through graphledger's `KafkaSaver`,
long-term memory through its `KafkaStore`, both configured from `GRAPHLEDGER_*` variables.

`langgraph.json` names the two factories below. The server enters each when it starts and leaves it
when it stops, which closes the client's Kafka producer and read API sessions (with
`BG_JOB_ISOLATED_LOOPS` on, every background loop enters them again: README.md says why to leave it
off). `KafkaSaver` implements every optional saver method (`adelete_thread`, `adelete_for_runs`,
`acopy_thread`, `aprune`), so the server disables none of its features.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from langgraph.store.base import IndexConfig

from graphledger import KafkaSaver, KafkaStore
from graphledger.embeddings import HashEmbedder

EMBEDDING_DIMS = 384
"""Must equal the projection's `GRAPHLEDGER_STORE_VECTOR_DIMS` (`graphledger dev` uses 384, `OnnxEmbedder`'s)."""

MEMORY_INDEX: IndexConfig = {"dims": EMBEDDING_DIMS, "embed": HashEmbedder(EMBEDDING_DIMS), "fields": ["text"]}
"""What a memory's vector is made from: its "text". HashEmbedder is deterministic and offline but not
semantic; a deployment uses a real model (any LangChain `Embeddings`, or
graphledger.embeddings.OnnxEmbedder at 384 dims)."""


@asynccontextmanager
async def checkpointer() -> AsyncIterator[KafkaSaver]:
    async with KafkaSaver.from_env() as saver:
        yield saver


@asynccontextmanager
async def store() -> AsyncIterator[KafkaStore]:
    async with KafkaStore.from_env(index=MEMORY_INDEX) as memory:
        yield memory
