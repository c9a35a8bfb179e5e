"""`scope_event`: every event type a client can publish lands under its tenant's prefix, or is left
alone on purpose (run ids are global); the empty tenant changes nothing."""

from __future__ import annotations

import pytest

from graphledger.client.tenant import scope_event
from graphledger.events import Event
from graphledger.events.checkpoint import (
    CHECKPOINT_EVENT_TYPES,
    CheckpointPut,
    CheckpointWrites,
    RunsDelete,
    ThreadCopy,
    ThreadDelete,
    ThreadExpire,
    ThreadPrune,
    Write,
)
from graphledger.events.store import STORE_EVENT_TYPES, StoreDelete, StoreExpire, StorePut, StoreRefresh

# Each event type with what a client of tenant "acme" publishes for it.
SCOPED: list[tuple[Event, Event]] = [
    (
        CheckpointPut("t", "", "c1", None, b"{}", b"{}", ()),
        CheckpointPut("acme/t", "", "c1", None, b"{}", b"{}", ()),
    ),
    (
        CheckpointWrites("t", "", "c1", "task", "", False, (Write(0, "ch", "json", b"1"),)),
        CheckpointWrites("acme/t", "", "c1", "task", "", False, (Write(0, "ch", "json", b"1"),)),
    ),
    (ThreadDelete("t"), ThreadDelete("acme/t")),
    (ThreadCopy("t", "u"), ThreadCopy("acme/t", "acme/u")),
    (ThreadPrune("t", "keep_latest", 3), ThreadPrune("acme/t", "keep_latest", 3)),
    (ThreadExpire("t", 1_000), ThreadExpire("acme/t", 1_000)),
    (RunsDelete(("run-1",)), RunsDelete(("run-1",))),
    (StorePut(("a", "b"), "k", b"{}", 5.0, None), StorePut(("acme", "a", "b"), "k", b"{}", 5.0, None)),
    (StoreDelete(("a",), "k"), StoreDelete(("acme", "a"), "k")),
    (StoreRefresh(("a", "b"), "k"), StoreRefresh(("acme", "a", "b"), "k")),
    (StoreExpire(("a",), "k", 1_000), StoreExpire(("acme", "a"), "k", 1_000)),
]


def test_every_event_type_has_a_scoping_case_here() -> None:
    registered = {*CHECKPOINT_EVENT_TYPES.values(), *STORE_EVENT_TYPES.values()}
    assert {type(event) for event, _ in SCOPED} == registered


@pytest.mark.parametrize(("event", "scoped"), SCOPED, ids=lambda e: type(e).__name__)
def test_an_event_is_scoped_to_its_tenant(event: Event, scoped: Event) -> None:
    assert scope_event(event, "acme") == scoped


@pytest.mark.parametrize(("event", "scoped"), SCOPED, ids=lambda e: type(e).__name__)
def test_the_empty_tenant_changes_nothing(event: Event, scoped: Event) -> None:
    assert scope_event(event, "") is event


def test_a_scoped_refresh_is_keyed_like_the_scoped_put_of_its_item() -> None:
    """Same Kafka key, so the refresh and the item's puts share a partition and keep their order."""
    put = scope_event(StorePut(("a",), "k", b"{}", 5.0, None), "acme")
    refresh = scope_event(StoreRefresh(("a",), "k"), "acme")
    assert refresh.key == put.key
