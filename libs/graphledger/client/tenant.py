"""The client's half of tenancy: its writes go out under its tenant's prefix.

Writes travel through Kafka, which the read API never sees, so the client applies the prefix the read
API reads under (`GET /v1/whoami`, asked once at start when a token is set). The server enforces the
prefix on every read; for writes, the boundary is the broker's ACLs (docs/security.md).
"""

from __future__ import annotations

import dataclasses
from typing import assert_never

from graphledger.events import Event, checkpoint, erasure, store
from graphledger.tenancy import scoped_namespace, scoped_thread


def scope_event(event: Event, tenant: str) -> Event:
    """`event` with its threads or namespace under `tenant` ("" : unchanged).

    Every event type is decided here; a new one fails type checking (`assert_never`) until it is.
    Any event naming a thread or a store item is scoped, so a tenant's client can address nothing
    outside its prefix. That includes `ThreadExpire` and `StoreExpire`, which only the sweeper
    publishes (with stored names, through its own publisher, never through here): should a client
    pass one, it can only expire its own tenant's data. `RunsDelete` is left as it is: it names no
    thread, and run ids are global (UUIDs), as in LangGraph.
    """
    if not tenant:
        return event
    match event:
        case (
            checkpoint.CheckpointPut()
            | checkpoint.CheckpointWrites()
            | checkpoint.ThreadDelete()
            | checkpoint.ThreadPrune()
            | checkpoint.ThreadExpire()
        ):
            return dataclasses.replace(event, thread_id=scoped_thread(tenant, event.thread_id))
        case checkpoint.ThreadCopy():
            return dataclasses.replace(
                event,
                source_thread_id=scoped_thread(tenant, event.source_thread_id),
                target_thread_id=scoped_thread(tenant, event.target_thread_id),
            )
        case checkpoint.ThreadCopyBarrier():
            return dataclasses.replace(event, target_thread_id=scoped_thread(tenant, event.target_thread_id))
        case store.StorePut() | store.StoreDelete() | store.StoreRefresh() | store.StoreExpire():
            return dataclasses.replace(event, namespace=scoped_namespace(tenant, event.namespace))
        case checkpoint.RunsDelete():
            return event
        case erasure.ThreadErase() | erasure.NamespaceErase() | erasure.TenantErase():
            return event  # published by the services, naming subjects by reference only
        case _:
            assert_never(event)
