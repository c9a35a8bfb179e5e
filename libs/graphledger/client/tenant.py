"""The client's half of tenancy: its writes go out under its tenant's prefix.

Writes travel through Kafka, which the read API never sees, so the client applies the prefix the read
API reads under (`GET /v1/whoami`, asked once at start when a token is set). The server enforces the
prefix on every read; for writes, the boundary is the broker's ACLs (docs/security.md).
`delete_for_runs` is not scoped: run ids are global (UUIDs), as in LangGraph.
"""

from __future__ import annotations

import dataclasses

from graphledger.events import Event
from graphledger.events.checkpoint import (
    CheckpointPut,
    CheckpointWrites,
    ThreadCopy,
    ThreadCopyBarrier,
    ThreadDelete,
    ThreadPrune,
)
from graphledger.events.store import StoreDelete, StorePut
from graphledger.tenancy import scoped_namespace, scoped_thread


def scope_event(event: Event, tenant: str) -> Event:
    """`event` with its threads or namespace under `tenant` ("" : unchanged)."""
    if not tenant:
        return event
    if isinstance(event, CheckpointPut | CheckpointWrites | ThreadDelete | ThreadPrune):
        return dataclasses.replace(event, thread_id=scoped_thread(tenant, event.thread_id))
    if isinstance(event, ThreadCopyBarrier):
        return dataclasses.replace(event, target_thread_id=scoped_thread(tenant, event.target_thread_id))
    if isinstance(event, ThreadCopy):
        return ThreadCopy(scoped_thread(tenant, event.source_thread_id), scoped_thread(tenant, event.target_thread_id))
    if isinstance(event, StorePut | StoreDelete):
        return dataclasses.replace(event, namespace=scoped_namespace(tenant, event.namespace))
    return event
