"""Whose data each event carries, and the keyed hashes that stand for identifiers in the log
(`graphledger.erasure.subjects`), pure."""

from __future__ import annotations

import re

import pytest

from graphledger.erasure.subjects import (
    REFERENCE_BYTES,
    Subject,
    item_record_key,
    namespace_subject,
    record_key,
    reference,
    subject_of,
    thread_record_key,
    thread_subject,
)
from graphledger.events import Event
from graphledger.events.checkpoint import (
    CheckpointPut,
    CheckpointWrites,
    RunsDelete,
    ThreadCopy,
    ThreadCopyBarrier,
    ThreadDelete,
    ThreadExpire,
    ThreadPrune,
    Write,
)
from graphledger.events.erasure import NamespaceErase, TenantErase, ThreadErase
from graphledger.events.store import StoreDelete, StoreExpire, StorePut, StoreRefresh

HASH_KEY = b"\x01" * 32
OTHER_HASH_KEY = b"\x02" * 32
THREAD = "acme/alice@example-com"
NAMESPACE = ("acme", "users", "alice@example-com", "memories")
ITEM = "favourite-food"
HEX_KEY = re.compile(f"[0-9a-f]{{{2 * REFERENCE_BYTES}}}")

THREAD_EVENTS: list[Event] = [
    CheckpointPut(THREAD, "", "cp-1", None, b"{}", b"{}", ()),
    CheckpointWrites(THREAD, "", "cp-1", "task", "", False, (Write(0, "messages", "msgpack", b"x"),)),
    ThreadDelete(THREAD),
    ThreadPrune(THREAD, "keep_latest"),
    ThreadExpire(THREAD, 0),
]
STORE_EVENTS: list[Event] = [
    StorePut(NAMESPACE, ITEM, b"{}", None, None),
    StoreDelete(NAMESPACE, ITEM),
    StoreRefresh(NAMESPACE, ITEM),
    StoreExpire(NAMESPACE, ITEM, 0),
]


@pytest.mark.parametrize("event", THREAD_EVENTS, ids=lambda e: e.TYPE)
def test_a_checkpoint_event_is_its_threads_data(event: Event) -> None:
    assert subject_of(event, "acme", 2) == Subject("thread", "acme", THREAD)


def test_a_copy_and_its_barrier_are_the_target_threads_data() -> None:
    target = Subject("thread", "acme", "acme/copy")
    assert subject_of(ThreadCopy(THREAD, "acme/copy"), "acme", 2) == target
    assert subject_of(ThreadCopyBarrier("acme/copy", 0, 7), "acme", 2) == target


@pytest.mark.parametrize(
    "event",
    [RunsDelete(("run-1",)), ThreadErase("0a" * 16), NamespaceErase("0a" * 16), TenantErase("acme")],
    ids=lambda e: e.TYPE,
)
def test_run_deletions_and_erasures_carry_no_ones_data(event: Event) -> None:
    assert subject_of(event, "acme", 2) is None


@pytest.mark.parametrize("event", STORE_EVENTS, ids=lambda e: e.TYPE)
def test_a_store_event_is_the_data_of_its_namespaces_first_labels_after_the_tenants(event: Event) -> None:
    assert subject_of(event, "acme", 2) == Subject("namespace", "acme", "acme.users.alice@example-com")
    assert subject_of(event, "acme", 1) == Subject("namespace", "acme", "acme.users")


def test_without_a_tenant_a_store_subject_is_the_namespaces_first_labels() -> None:
    assert namespace_subject("", ("users", "42", "memories"), 2) == Subject("namespace", "", "users.42")


def test_a_namespace_shorter_than_the_depth_is_a_subject_of_its_own() -> None:
    assert namespace_subject("acme", ("acme", "users"), 2) == Subject("namespace", "acme", "acme.users")
    assert namespace_subject("", ("users",), 2) == Subject("namespace", "", "users")


def test_a_reference_is_a_keyed_hash_of_kind_and_name_alone() -> None:
    thread = thread_subject("acme", THREAD)
    ref = reference(HASH_KEY, thread)
    assert HEX_KEY.fullmatch(ref)
    assert reference(HASH_KEY, thread_subject("acme", THREAD)) == ref
    assert reference(OTHER_HASH_KEY, thread) != ref
    assert reference(HASH_KEY, Subject("namespace", "acme", THREAD)) != ref
    # The tenant is not hashed: its hashing key is its own, and a thread's name carries its prefix.
    assert reference(HASH_KEY, thread_subject("", THREAD)) == ref


@pytest.mark.parametrize("event", THREAD_EVENTS, ids=lambda e: e.TYPE)
def test_a_threads_records_are_keyed_by_a_keyed_hash_of_the_thread(event: Event) -> None:
    key = record_key(HASH_KEY, event)
    assert key is not None and HEX_KEY.fullmatch(key)
    assert key == thread_record_key(HASH_KEY, THREAD)
    assert key != record_key(OTHER_HASH_KEY, event)


def test_a_threads_record_key_is_its_reference_so_its_erasure_follows_its_records() -> None:
    ref = reference(HASH_KEY, thread_subject("acme", THREAD))
    assert thread_record_key(HASH_KEY, THREAD) == ref
    assert record_key(HASH_KEY, ThreadErase(ref)) == ref


def test_a_copy_is_keyed_by_its_source_thread_and_its_barrier_by_the_target() -> None:
    assert record_key(HASH_KEY, ThreadCopy(THREAD, "acme/copy")) == thread_record_key(HASH_KEY, THREAD)
    assert record_key(HASH_KEY, ThreadCopyBarrier("acme/copy", 0, 7)) == thread_record_key(HASH_KEY, "acme/copy")


def test_events_for_every_partition_have_no_record_key() -> None:
    for event in (RunsDelete(("run-1",)), NamespaceErase("0a" * 16), TenantErase("acme")):
        assert record_key(HASH_KEY, event) is None


def test_an_items_events_share_one_record_key_a_keyed_hash_of_namespace_and_key() -> None:
    keys = {record_key(HASH_KEY, event) for event in STORE_EVENTS}
    assert keys == {item_record_key(HASH_KEY, NAMESPACE, ITEM)}
    key = keys.pop()
    assert key is not None and HEX_KEY.fullmatch(key)
    assert key != item_record_key(OTHER_HASH_KEY, NAMESPACE, ITEM)
    assert key != item_record_key(HASH_KEY, NAMESPACE, "other")
    assert key != item_record_key(HASH_KEY, (*NAMESPACE, ITEM), "")
    assert key != thread_record_key(HASH_KEY, "\x1f".join(NAMESPACE) + "\x1e" + ITEM)
