"""One writer per thread (DESIGN invariant 10): which of a thread's writes count, decided by the order of
the thread's records in its partition alone.

A protected write carries its writer's intent (`Intent`): what the writer read of the thread, namely the
head of the namespace it writes (as a keyed hash; `NO_CHECKPOINT` for none) and the thread's operation
count, and which run wrote it (a random token per run). The rule keeps, per thread, a `Ledger`: the
operation count and each namespace's lead, the last counted protected put, with its run (a namespace
without one is open). In log order:
- a put with no intent (written before this rule, or by a caller that read nothing: a direct `aput`)
  counts; it opens its namespace and counts as an operation, so a protected writer in flight is refused;
- a protected put of the lead again (a producer's retry) counts and changes nothing;
- a protected put counts if the thread's operation count is the one its writer read and its namespace is
  open or led by the head its writer expects; it then leads the namespace. Any other is refused: a
  superseded writer (a zombie) or the second of two concurrent writers, whichever the log puts later;
- protected writes count if they are of the lead, or their writer expects the lead (its latest put), or
  their run put the lead (a run's writes and its next put race to the log: a large write's last chunk can
  land after the put that follows it), or the namespace is open, or their checkpoint is newer than the lead
  (its put has not come yet, and takes them with it if it is refused), at the operation count their writer
  read; others are refused;
- a thread operation (delete, prune `delete`, expiry, a copy landing on it, erasure, a `runs.delete` of a
  lead's run) counts one operation and opens every namespace it touched.
A counted put has the greatest checkpoint id of its namespace (its writer refuses to put an id at or
below the one it expects), so a namespace's lead is its newest checkpoint, as every read orders them.
Pure: the projection's plan, the fold of every reader and a writer's own verdict apply the same functions.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

import ormsgpack

from graphledger.errors import InvalidEventError
from graphledger.events.envelope import HEADER_INTENT

NO_CHECKPOINT: Final = b""
"""`Intent.expects` of a writer that found no checkpoint in its namespace."""
MAX_HASH_BYTES: Final = 64

K = TypeVar("K", bound=Hashable)
"""How a namespace is named in a ledger: its name where the records are opened, its hash where only
their headers are read."""


@dataclass(frozen=True, slots=True)
class Intent:
    """What a protected write's writer read: its namespace and checkpoint (keyed hashes, equal for equal
    names within one thread), the head it expects and the thread's operation count."""

    namespace: bytes
    checkpoint: bytes
    expects: bytes
    """The namespace's head when its writer read it, or the writer's own latest put since (`NO_CHECKPOINT`:
    the namespace had none)."""
    operations: int
    writer: bytes = b""
    """The run that wrote it: random bytes, the same for every write of one run (b"": not told)."""

    def header(self) -> bytes:
        return ormsgpack.packb([self.namespace, self.checkpoint, self.expects, self.operations, self.writer])

    @classmethod
    def parse(cls, raw: bytes) -> Intent:
        """The intent of a `gl-intent` header (or payload); `InvalidEventError` naming what is wrong."""
        try:
            fields = ormsgpack.unpackb(raw)
        except (ormsgpack.MsgpackDecodeError, ValueError, TypeError):
            raise InvalidEventError(f"{HEADER_INTENT} is not msgpack") from None
        if not (isinstance(fields, list) and len(fields) == 5):
            raise InvalidEventError(f"{HEADER_INTENT} is not [namespace, checkpoint, expects, operations, writer]")
        namespace, checkpoint, expects, operations, writer = fields
        named = (("namespace", namespace), ("checkpoint", checkpoint), ("expects", expects), ("writer", writer))
        for name, value in named:
            if not isinstance(value, bytes) or len(value) > MAX_HASH_BYTES:
                raise InvalidEventError(f"{HEADER_INTENT} {name} is not bytes of at most {MAX_HASH_BYTES}")
        if not namespace or not checkpoint:
            raise InvalidEventError(f"{HEADER_INTENT} names no namespace or no checkpoint")
        if not isinstance(operations, int) or isinstance(operations, bool) or not 0 <= operations < 2**63:
            raise InvalidEventError(f"{HEADER_INTENT} operations {operations!r} is not a count")
        return cls(namespace, checkpoint, expects, operations, writer)


@functools.lru_cache(maxsize=4096)
def parsed(raw: bytes) -> Intent:
    """`Intent.parse`, once per header: a record's intent is read by its writer's fold, its verdict and the
    held thread's, and its writes name their checkpoint's again."""
    return Intent.parse(raw)


@dataclass(frozen=True, slots=True)
class Counted:
    """The write counts."""


SUPERSEDED: Final = "superseded"
"""A refusal's cause: another writer's put led the namespace where its writer expected another."""
THREAD_CHANGED: Final = "thread_changed"
"""A refusal's cause: a thread operation (or a put made without an intent) came after its writer's read."""


@dataclass(frozen=True, slots=True)
class Refused:
    """The write does not count: the thread is no longer as its writer read it."""

    reason: str
    cause: str
    """`SUPERSEDED` or `THREAD_CHANGED`: what metrics count refusals by."""
    superseded_by: bytes | None = None
    """The lead its writer did not expect (None: the thread's operations moved on)."""


Verdict = Counted | Refused
COUNTED: Final = Counted()


@dataclass(frozen=True, slots=True)
class Ledger(Generic[K]):
    """The rule's state of one thread. Immutable: every step returns a new ledger."""

    operations: int = 0
    leads: Mapping[K, bytes] = field(default_factory=dict)
    """Each namespace's lead (the checkpoint hash of its last counted protected put); missing: open."""
    lead_runs: Mapping[K, object] = field(default_factory=dict)
    """The metadata `run_id` of each lead (`folds.thread.run_id_text`; missing: none), for `runs.delete`."""
    lead_ids: Mapping[K, str] = field(default_factory=dict)
    """The checkpoint id of each lead, where the reader opens records (its writes' checkpoints compare to it)."""
    lead_writers: Mapping[K, bytes] = field(default_factory=dict)
    """The run that put each lead (`Intent.writer`; missing: not told)."""

    def lead(self, namespace: K) -> bytes | None:
        return self.leads.get(namespace)


def put(
    ledger: Ledger[K], namespace: K, intent: Intent | None, run_id: object = None, checkpoint_id: str | None = None
) -> tuple[Ledger[K], Verdict]:
    """A put of `namespace` (of `checkpoint_id`, with its metadata `run_id`), and whether it counts."""
    lead = ledger.leads.get(namespace)
    if intent is None:
        return _opened(ledger, (namespace,), bump=True), COUNTED
    if lead is not None and intent.checkpoint == lead:
        return ledger, COUNTED
    if intent.operations != ledger.operations:
        return ledger, _changed(intent, ledger)
    if lead is not None and lead != intent.expects:
        return ledger, Refused("another writer's checkpoint superseded the one its writer expected", SUPERSEDED, lead)
    leads = {**ledger.leads, namespace: intent.checkpoint}
    runs = {**ledger.lead_runs, namespace: run_id}
    ids = {ns: i for ns, i in ledger.lead_ids.items() if ns != namespace}
    if checkpoint_id is not None:
        ids[namespace] = checkpoint_id
    writers = {ns: w for ns, w in ledger.lead_writers.items() if ns != namespace}
    if intent.writer:
        writers[namespace] = intent.writer
    return Ledger(ledger.operations, leads, runs, ids, writers), COUNTED


def writes(ledger: Ledger[K], namespace: K, intent: Intent | None, checkpoint_id: str | None = None) -> Verdict:
    """Writes against checkpoint `checkpoint_id` of `namespace`, and whether they count. Writes of a checkpoint
    newer than the lead have come before their put (a writer's put and its writes race to the log): they
    count now, and go with their put if the rule refuses it."""
    if intent is None:
        return COUNTED
    lead = ledger.leads.get(namespace)
    if lead is None:
        return COUNTED if intent.operations == ledger.operations else _changed(intent, ledger)
    if lead in (intent.checkpoint, intent.expects):
        return COUNTED
    if intent.writer and ledger.lead_writers.get(namespace) == intent.writer:
        return COUNTED  # its own run put the lead since: its writes of the step before still count
    lead_id = ledger.lead_ids.get(namespace)
    ahead = checkpoint_id is not None and lead_id is not None and checkpoint_id > lead_id
    if ahead and intent.operations == ledger.operations:
        return COUNTED
    return Refused("another writer's checkpoint superseded the one its writer wrote against", SUPERSEDED, lead)


def operation(ledger: Ledger[K]) -> Ledger[K]:
    """A thread operation that may have changed every namespace (delete, prune `delete`, expiry, a copy
    landing on the thread, erasure): one more operation, every namespace open."""
    return Ledger(ledger.operations + 1)


def runs_deleted(ledger: Ledger[K], run_ids: Iterable[str]) -> Ledger[K]:
    """`runs.delete`: a namespace whose lead is of a deleted run is open again, and that is an operation
    (its writer's later writes are refused: a cancelled run's late puts never land); else nothing."""
    deleted = frozenset(run_ids)
    hit = tuple(ns for ns, run in ledger.lead_runs.items() if isinstance(run, str) and run in deleted)
    return _opened(ledger, hit, bump=True) if hit else ledger


def _changed(intent: Intent, ledger: Ledger[K]) -> Refused:
    read, now = intent.operations, ledger.operations
    return Refused(
        f"the thread changed since its writer read it (its operations: {read} read, {now} now)", THREAD_CHANGED
    )


def _opened(ledger: Ledger[K], namespaces: Iterable[K], *, bump: bool) -> Ledger[K]:
    opened = set(namespaces)
    leads = {ns: lead for ns, lead in ledger.leads.items() if ns not in opened}
    runs = {ns: run for ns, run in ledger.lead_runs.items() if ns not in opened}
    ids = {ns: i for ns, i in ledger.lead_ids.items() if ns not in opened}
    writers = {ns: w for ns, w in ledger.lead_writers.items() if ns not in opened}
    return Ledger(ledger.operations + (1 if bump else 0), leads, runs, ids, writers)
