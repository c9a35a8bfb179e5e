"""Whose personal data an event carries (its subject), and the keyed hashes that stand for identifiers
in the log (erasure, docs/security.md).

The log is kept for ever, so it must not hold identifiers in the clear: a record's key is an
HMAC-SHA256 of the thread id (or of the store item's namespace and key) under the tenant's hashing key,
which keeps one thread's (one item's) events in order on one partition. An event's user content is
sealed (`sealing.py`) with the data key of its subject, named in the log by the subject's reference,
the same kind of hash:
- a thread, for checkpoint events (the thread id as stored: with its tenant prefix); a copy's is its
  target's;
- a store namespace prefix, for store events: the first `namespace_depth` labels of the item's
  namespace after the tenant label (`("users", "42")` for the default 2), so that erasing a user's
  memories erases every namespace below theirs.
Erasing a subject destroys its data key; erasing a tenant destroys every key of the tenant and its
hashing key.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from dataclasses import dataclass
from typing import Literal, assert_never

from graphledger.events import Event, checkpoint, erasure, store
from graphledger.events.store import KEY_SEPARATOR, NAMESPACE_SEPARATOR

SubjectKind = Literal["thread", "namespace"]

LABEL_SEPARATOR = "."
"""Joins a namespace subject's labels: LangGraph refuses a label holding a period, so the name is
unambiguous, and it is the item's `store.prefix` as the official store writes it."""
REFERENCE_BYTES = 16
"""A reference or record key is the first 128 bits of the HMAC, in hex."""


@dataclass(frozen=True, slots=True)
class Subject:
    """Whose data: a thread (its id as stored) or a namespace prefix (labels as stored), in a tenant."""

    kind: SubjectKind
    tenant: str
    name: str
    """The thread id, or the namespace prefix's labels joined by `LABEL_SEPARATOR`."""


def thread_subject(tenant: str, stored_thread_id: str) -> Subject:
    return Subject("thread", tenant, stored_thread_id)


def namespace_subject(tenant: str, stored_namespace: tuple[str, ...], depth: int) -> Subject:
    """The subject of an item of `stored_namespace` (which starts with the tenant's label if any)."""
    kept = depth + (1 if tenant else 0)
    return Subject("namespace", tenant, LABEL_SEPARATOR.join(stored_namespace[:kept]))


def namespace_subject_depth(tenant: str, depth: int) -> int:
    """Labels of a full-depth namespace subject of `tenant` (its own label included); a shorter
    subject holds only the items stored right in it."""
    return depth + (1 if tenant else 0)


def subject_of(event: Event, tenant: str, namespace_depth: int) -> Subject | None:
    """The subject whose data key seals `event` (its names as stored), or None for an event that
    carries no one's data (`runs.delete`: run ids; erasures: references)."""
    match event:
        case (
            checkpoint.CheckpointPut()
            | checkpoint.CheckpointWrites()
            | checkpoint.ThreadDelete()
            | checkpoint.ThreadPrune()
            | checkpoint.ThreadExpire()
        ):
            return thread_subject(tenant, event.thread_id)
        case checkpoint.ThreadCopy() | checkpoint.ThreadCopyBarrier():
            # The target's: a copy into an erased thread must not bring its rows back. Erasing the
            # source erases its copies (`graphledger_server.keys.erase`).
            return thread_subject(tenant, event.target_thread_id)
        case checkpoint.RunsDelete() | erasure.ThreadErase() | erasure.NamespaceErase() | erasure.TenantErase():
            return None
        case store.StorePut() | store.StoreDelete() | store.StoreRefresh() | store.StoreExpire():
            return namespace_subject(tenant, event.namespace, namespace_depth)
        case _:
            assert_never(event)


def reference(hash_key: bytes, subject: Subject) -> str:
    """The subject's name in the log and in the key store."""
    return _hash(hash_key, subject.kind, subject.name)


def record_key(hash_key: bytes, event: Event) -> str | None:
    """The Kafka key of `event` (names as stored): the thread's reference for checkpoint events, a hash
    of namespace and key for store events; None for an event published to every partition."""
    match event:
        case store.StorePut() | store.StoreDelete() | store.StoreRefresh() | store.StoreExpire():
            return item_record_key(hash_key, event.namespace, event.item_key)
        case erasure.ThreadErase() | erasure.NamespaceErase() | erasure.TenantErase():
            return event.key
        case checkpoint.RunsDelete():
            return None
        case _:  # a thread's records, by its key (a copy's: the source's, after the source's writes)
            return thread_record_key(hash_key, event.key)


def thread_record_key(hash_key: bytes, stored_thread_id: str) -> str:
    """The key of every record of a thread (what a read of the thread looks for in the log)."""
    return _hash(hash_key, "thread", stored_thread_id)


def item_record_key(hash_key: bytes, stored_namespace: tuple[str, ...], item_key: str) -> str:
    return _hash(hash_key, "item", NAMESPACE_SEPARATOR.join(stored_namespace) + KEY_SEPARATOR + item_key)


@functools.lru_cache(maxsize=16384)
def _hash(hash_key: bytes, kind: str, name: str) -> str:
    """Cached: a thread's writes hash the same name for every event (two HMACs each)."""
    message = kind.encode() + b"\x00" + name.encode("utf-8", "surrogatepass")
    return hmac.new(hash_key, message, hashlib.sha256).digest()[:REFERENCE_BYTES].hex()
