"""Whether a sealed event may affect what it names: producers are not trusted (docs/security.md, "Tenants").

Agents of every tenant can write the shared topics, so anyone can publish an event naming any thread or
namespace, and seal it under a key of their own while claiming another tenant's subject inside the seal.
What they cannot forge is whose a key is: the key store made each data key for one tenant (a fresh key
too: it was issued to one). So a sealed event is admitted only when the tenant its seal claims is its
key's, what it names lies within that tenant (a copy's source too: a copy reads the source's rows), and
the subject it claims is the thread or namespace it names. With encryption on, an event of a thread or
namespace in the clear is refused too, unless the log is known to hold a clear era
(`accept_clear_events`): a clear event carries no proof of whose it is. Pure; the projector's batch and
the read API's read-through apply `admitted` to each record as they decode it, right after loading its
key and its key's owner (`DataKeyCache.owner`), so a classification kept for later carries the verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from graphledger.erasure.sealing import SealedSubject
from graphledger.erasure.subjects import LABEL_SEPARATOR, subject_of
from graphledger.events.checkpoint import ThreadCopy
from graphledger.opening.records import DeadLetter, Decoded, unwrapped
from graphledger.settings import DEFAULT_ERASURE_NAMESPACE_DEPTH
from graphledger.tenancy import THREAD_SEPARATOR

Item = TypeVar("Item")


def admitted(
    item: Item, owner_of: Callable[[tuple[str, str | None]], str | None], *, clear_refused: bool = False
) -> Item | DeadLetter:
    """`item` (a classified record), or a dead letter when it is a sealed event `misattributed` refuses, or
    (`clear_refused`: encryption on, no clear era accepted) an event of a thread or namespace in the clear."""
    if not isinstance(item, Decoded):
        return item
    if item.subject is None:
        reason = in_the_clear(item.event) if clear_refused else None
    else:
        # The key it opened with, as its seal names it (authenticated), not as its headers do (anyone's).
        reason = misattributed(item.event, item.subject, owner_of((item.subject.ref, item.key_id)))
    if reason is None:
        return item
    kind = getattr(unwrapped(item.event), "TYPE", None)
    return DeadLetter(item.record, reason, kind, item.value, item.chunk_event_id, item.subject, item.key_id)


def in_the_clear(event: Any) -> str | None:
    """Why an event that reached the log unsealed may not apply with encryption on (None: it carries no
    one's data, as erasures and `runs.delete`, which are never sealed). Names no thread or namespace."""
    event = unwrapped(event)
    if subject_of(event, "", DEFAULT_ERASURE_NAMESPACE_DEPTH) is None:
        return None
    return (
        f"{event.TYPE} in the clear while encryption is on: writers seal every event of a thread or namespace "
        "(a log with a clear era: GRAPHLEDGER_ACCEPT_CLEAR_EVENTS, until `graphledger encrypt-log` has sealed it)"
    )


def misattributed(event: Any, subject: SealedSubject, owner: str | None) -> str | None:
    """Why the sealed `event` (a projection's event, or its timed wrapper) may not apply (None: it may).
    `subject`: what its seal claims; `owner`: the tenant its key was made for (None: the key store names
    none). The reason names the reference, never the names the event carries."""
    event = unwrapped(event)
    kind, ref, tenant = event.TYPE, subject.ref, subject.tenant
    if owner is None:
        return f"{kind} sealed for subject {ref} with a key the key store names no owner of"
    if owner != tenant:
        return f"{kind} sealed for subject {ref} of another tenant than its key's"
    # The subject a writer seals the event for (its depth matters not: a namespace is checked against the
    # labels the seal claims, which are the first labels of the namespace the event names).
    named = subject_of(event, tenant, DEFAULT_ERASURE_NAMESPACE_DEPTH)
    if named is None:
        return None  # names no one's data (run ids, references): nothing to check
    outside = f"{kind} sealed for subject {ref} of its tenant, but names data outside that tenant"
    if named.kind == "namespace":
        labels = tuple(subject.name.split(LABEL_SEPARATOR))
        if subject.kind != "namespace" or tuple(event.namespace[: len(labels)]) != labels:
            return f"{kind} sealed for subject {ref}, but names another namespace"
        return outside if tenant and event.namespace[:1] != (tenant,) else None
    if subject.kind != "thread" or subject.name != named.name:
        return f"{kind} sealed for subject {ref}, but names another thread"
    threads = [named.name, event.source_thread_id] if isinstance(event, ThreadCopy) else [named.name]
    prefix = tenant + THREAD_SEPARATOR
    return outside if tenant and not all(name.startswith(prefix) for name in threads) else None
