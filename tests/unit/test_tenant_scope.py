"""`scope_event`: every event type a client can publish lands under its tenant's prefix, or is left
alone on purpose (run ids are global); the empty tenant changes nothing."""

from __future__ import annotations

import pytest

from graphledger.client.tenant import scope_event
from graphledger.events import Event, checkpoint, erasure, store

# Each event type with what a client of tenant "acme" publishes for it.
SCOPED: list[tuple[Event, Event]] = [
    (
        checkpoint.CheckpointPut("t", "", "c1", None, b"{}", b"{}", ()),
        checkpoint.CheckpointPut("acme/t", "", "c1", None, b"{}", b"{}", ()),
    ),
    (
        checkpoint.CheckpointWrites("t", "", "c1", "task", "", False, (checkpoint.Write(0, "ch", "json", b"1"),)),
        checkpoint.CheckpointWrites("acme/t", "", "c1", "task", "", False, (checkpoint.Write(0, "ch", "json", b"1"),)),
    ),
    (checkpoint.ThreadDelete("t"), checkpoint.ThreadDelete("acme/t")),
    (checkpoint.ThreadCopy("t", "u"), checkpoint.ThreadCopy("acme/t", "acme/u")),
    (checkpoint.ThreadCopyBarrier("u", 2, 41), checkpoint.ThreadCopyBarrier("acme/u", 2, 41)),
    (checkpoint.ThreadPrune("t", "keep_latest", 3), checkpoint.ThreadPrune("acme/t", "keep_latest", 3)),
    (checkpoint.ThreadExpire("t", 1_000), checkpoint.ThreadExpire("acme/t", 1_000)),
    (checkpoint.RunsDelete(("run-1",)), checkpoint.RunsDelete(("run-1",))),
    (store.StorePut(("a", "b"), "k", b"{}", 5.0, None), store.StorePut(("acme", "a", "b"), "k", b"{}", 5.0, None)),
    (store.StoreDelete(("a",), "k"), store.StoreDelete(("acme", "a"), "k")),
    (store.StoreRefresh(("a", "b"), "k"), store.StoreRefresh(("acme", "a", "b"), "k")),
    (store.StoreExpire(("a",), "k", 1_000), store.StoreExpire(("acme", "a"), "k", 1_000)),
    # Published by the services, naming subjects by reference: nothing to scope.
    (erasure.ThreadErase("0a1b"), erasure.ThreadErase("0a1b")),
    (erasure.NamespaceErase("0a1b"), erasure.NamespaceErase("0a1b")),
    (erasure.TenantErase("acme"), erasure.TenantErase("acme")),
]


def test_every_event_type_has_a_scoping_case_here() -> None:
    registered = {*checkpoint.CHECKPOINT_EVENT_TYPES.values(), *store.STORE_EVENT_TYPES.values()}
    assert {type(event) for event, _ in SCOPED} == registered


@pytest.mark.parametrize(("event", "scoped"), SCOPED, ids=lambda e: type(e).__name__)
def test_an_event_is_scoped_to_its_tenant(event: Event, scoped: Event) -> None:
    assert scope_event(event, "acme") == scoped


@pytest.mark.parametrize(("event", "scoped"), SCOPED, ids=lambda e: type(e).__name__)
def test_the_empty_tenant_changes_nothing(event: Event, scoped: Event) -> None:
    assert scope_event(event, "") is event


def test_a_scoped_refresh_is_keyed_like_the_scoped_put_of_its_item() -> None:
    """Same Kafka key, so the refresh and the item's puts share a partition and keep their order."""
    put = scope_event(store.StorePut(("a",), "k", b"{}", 5.0, None), "acme")
    refresh = scope_event(store.StoreRefresh(("a",), "k"), "acme")
    assert refresh.key == put.key
