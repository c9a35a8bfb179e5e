"""What a decoded event may affect: producers are not trusted (docs/security.md, "Threat model").

Agents of every tenant can write the shared topics, so anyone can publish any event naming any thread
or namespace. What they cannot forge is a seal: a sealed event opens only with its subject's data key,
which the key store hands to that subject's tenant alone, and the subject it was sealed for (its
reference, kind, tenant and name) is inside the AEAD (`graphledger.erasure.sealing`). So an event is admitted
only for the subject its seal authenticates:

- sealed: its key is its tenant's (the key store's owner of the key is the tenant sealed inside), its
  reference is the keyed hash of the subject it names under that tenant's hashing key, the subject
  sealed inside is the thread or namespace prefix the event names, and what it names lies within that
  tenant (a copy's source too: a copy reads the source's rows);
- in the clear, with sealing on (`GRAPHLEDGER_ENCRYPT_EVENTS`): only events that name no one's data
  (`runs.delete` and the erasure events);
- an erasure event applies only once the key store recorded that erasure (checked by the batch, which
  reads the key store in its transaction), and never from chunks (erasure events are small, and the
  eraser never splits them).

Everything here is pure; the batch applier supplies the key's owner.
"""

from __future__ import annotations

from typing import Any

from graphledger.erasure.sealing import SealedSubject
from graphledger.erasure.subjects import Subject, reference, subject_of
from graphledger.events import checkpoint, erasure
from graphledger.pg_text import index_key_problem
from graphledger.tenancy import THREAD_SEPARATOR
from graphledger_server.keys.lookup import KeyOwner

SEALING_SETTING = "GRAPHLEDGER_ENCRYPT_EVENTS"


def refusal(
    event: Any,
    subject: SealedSubject | None,
    owner: KeyOwner | None,
    *,
    sealed_only: bool,
    namespace_depth: int,
    chunked: bool = False,
) -> str | None:
    """Why `event` (a projection's typed event, or its timed wrapper) may not apply, or None.

    `subject`: what its seal authenticates (None: in the clear); `owner`: whose the key that opened it
    is; `sealed_only`: whether content events must be sealed; `chunked`: whether it was reassembled from
    chunks. The reason names references and kinds, never the names the event carries.
    """
    event = getattr(event, "event", event)  # the projections' timed wrappers
    kind = event.TYPE
    if isinstance(event, erasure.ThreadErase | erasure.NamespaceErase | erasure.TenantErase):
        if chunked:
            return f"{kind} in chunks: the eraser never splits an erasure event"
        if subject is not None:
            return f"{kind} is sealed: erasure events name no one's data and travel in the clear"
        return None
    if subject is None:
        if sealed_only and subject_of(event, "", namespace_depth) is not None:
            return f"{kind} in the clear names a subject's data, and events are sealed ({SEALING_SETTING} is on)"
        return None
    tenant = subject.tenant
    named = subject_of(event, tenant, namespace_depth)
    if named is None:
        return f"{kind} is sealed but names no one's data"
    if owner is None:
        return f"sealed for subject {subject.ref} with a key the key store names no owner of"
    if owner.tenant != tenant:
        return f"sealed for subject {subject.ref} of another tenant than its key's"
    if named.kind != subject.kind or named.name != subject.name:
        return (
            f"sealed for {subject.kind or 'a subject'} {subject.ref}, but names another {named.kind} "
            f"(a namespace's first {namespace_depth} labels are its subject: GRAPHLEDGER_ERASURE_NAMESPACE_DEPTH)"
        )
    if index_key_problem("its subject's kind and name", named.kind, named.name) is not None:
        return f"sealed for subject {subject.ref}, whose name is longer than Postgres indexes"
    if not _within(tenant, event, named):
        return f"sealed for subject {subject.ref} of its tenant, but names data outside that tenant"
    if owner.hash_key is None:
        return f"sealed for subject {subject.ref}, whose tenant has no hashing key"
    if reference(owner.hash_key, Subject(named.kind, tenant, named.name)) != subject.ref:
        return f"sealed for subject {subject.ref}, which is not the reference of the {named.kind} it names"
    return None


def _within(tenant: str, event: Any, named: Subject) -> bool:
    """Whether everything `event` names (the subject, and a copy's source) is the tenant's (the unnamed
    tenant of a single token or none owns every name)."""
    if not tenant:
        return True
    if named.kind == "namespace":
        return event.namespace[:1] == (tenant,)
    prefix = tenant + THREAD_SEPARATOR
    names = [named.name]
    if isinstance(event, checkpoint.ThreadCopy):
        names.append(event.source_thread_id)
    return all(name.startswith(prefix) for name in names)
