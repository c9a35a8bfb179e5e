"""The writer's side of one writer per thread (`graphledger/ownership.py`): what each LangGraph run read of a
thread, and the intent each of its writes carries.

A run is told apart by the `Runtime` object LangGraph puts in the config of every call of the run, from its
first `get_tuple` to its last `put_writes`, whichever thread or callback makes the call; calls without one
(a direct `aput`, `update_state`, `get_state`) belong to no run and carry no intent, so they count as they
come, as with the official savers. A run's read of a namespace sets its *mark*: the thread's operation count
then, and the head its next write expects (the namespace's lead, else its newest checkpoint, else none). Each
put the run sends moves the mark to that put, on the client's loop as the put is sent, so a run's writes
expect its latest put in log order. Once a write of the run is refused, every later call of the run raises
(`get_next_version` too, which LangGraph calls every superstep: the run stops within one).
"""

from __future__ import annotations

import contextvars
import dataclasses
import hashlib
import hmac
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from graphledger import ownership
from graphledger.answers import Basis
from graphledger.errors import GraphledgerError, InvalidEventError, ThreadWriteRefusedError
from graphledger.events import checkpoint_event, chunks
from graphledger.events.checkpoint import CheckpointPut, RunsDelete
from graphledger.events.envelope import HEADER_CHUNK, HEADER_INTENT, HEADER_OPERATION, HEADER_TYPE, header
from graphledger.events.envelope import decode as envelope_decode
from graphledger.log.records import LogRecord
from graphledger.ownership import NO_CHECKPOINT, Intent, Ledger, Refused, Verdict

RUNTIME_KEY: Final = "__pregel_runtime"
"""Where LangGraph puts a run's `Runtime` in the configurable of each of the run's calls."""
UNSENT: Final = object()
"""A mark's `run_id` before the run sent a put."""
MAX_RUNS: Final = 4096
"""Runs a process remembers the marks of (least recently used out): more than run at once."""
HASH_BYTES: Final = 16
WRITER_BYTES: Final = 8


class IntentNames:
    """A thread's namespaces and checkpoints as intents name them: keyed hashes under the tenant's hashing
    key, scoped by the thread's stored id, so equal names are equal hashes for every writer of the tenant and
    nothing of a name shows; in the clear (no hashing key) the names themselves."""

    def __init__(self, hash_key: bytes | None, stored_thread_id: str) -> None:
        self._key = hash_key
        self._scope = stored_thread_id.encode("utf-8", "surrogatepass")

    def namespace(self, checkpoint_ns: str) -> bytes:
        return self._name(b"ns", checkpoint_ns)

    def checkpoint(self, checkpoint_id: str) -> bytes:
        return self._name(b"cp", checkpoint_id)

    def _name(self, kind: bytes, name: str) -> bytes:
        text = name.encode("utf-8", "surrogatepass")
        if self._key is None:
            return kind + b":" + text
        message = b"intent\x00" + kind + b"\x00" + self._scope + b"\x00" + text
        # Not `hmac.digest`: its one-shot OpenSSL call lets go of the GIL, and a process with other
        # threads then waits for it back (measured: 37 us a hash under the bench's load, 4 us this way).
        return hmac.new(self._key, message, hashlib.sha256).digest()[:HASH_BYTES]


@dataclass(slots=True)
class Mark:
    """What one run read of one thread namespace, and where its writes stand. On the client's loop only."""

    thread_id: str
    checkpoint_ns: str
    partition: int
    through: int
    """The read reflected every record of the thread below this offset of `partition`."""
    lead: bytes | None
    """The namespace's lead the read saw (None: open)."""
    lead_run: str | None
    """That lead's metadata `run_id` (None: none)."""
    lead_writer: bytes | None
    """The run that put that lead (None: not told)."""
    operations: int
    """The thread's operation count the run read."""
    expects: bytes | None
    """The hash the run's next write expects (its latest put, or the head it read); None: as named by
    `expects_id`, hashed once the names are known."""
    expects_id: str | None
    """The checkpoint id the next write expects (None: none): a put's id must be above it."""
    writer: bytes
    """The run's token (`Run.writer`), which each of its writes carries."""
    names: IntentNames | None = None
    """How its thread's names are hashed, once known."""
    namespace: bytes | None = None
    """The namespace's hash, once known."""
    run_id: object = UNSENT
    """The metadata `run_id` of the run's puts (`folds.thread.run_id_text`; `UNSENT` until it sent one)."""
    refusal: ThreadWriteRefusedError | None = None
    """Set once a write of the run on this thread was refused: every later call of the run raises it."""
    scanned: Scanned | None = None
    """How far a window scan of the run's counted writes has taken the rule's state (None: not yet): the next
    scan starts there rather than at the read, so each record of the thread is read once a run, not once a
    write."""

    def intent(self, names: IntentNames, checkpoint_id: str) -> Intent:
        """The intent of the run's next write, against `checkpoint_id`. Each name is hashed once: a run's
        writes name its namespace, and mostly the checkpoint its next write expects."""
        if self.expects is None:
            self.expects = NO_CHECKPOINT if self.expects_id is None else names.checkpoint(self.expects_id)
        if self.namespace is None:
            self.namespace = names.namespace(self.checkpoint_ns)
        checkpoint = self.expects if checkpoint_id == self.expects_id else names.checkpoint(checkpoint_id)
        return Intent(self.namespace, checkpoint, self.expects, self.operations, self.writer)

    def sent_put(self, intent: Intent, checkpoint_id: str, run_id: object) -> None:
        """The run sent a put of `checkpoint_id` (of metadata `run_id`) with `intent`: its next writes expect it."""
        self.expects, self.expects_id, self.run_id = intent.checkpoint, checkpoint_id, run_id


@dataclass(frozen=True, slots=True)
class Scanned:
    """The rule's state of a mark's namespace through `through` (exclusive) of its partition, from the read
    and the thread's records up to and including a counted write of the run."""

    through: int
    ledger: Ledger[bytes]


@dataclass(slots=True)
class Run:
    runtime: object
    """Held so that its id is not reused while the run's marks are kept."""
    marks: dict[tuple[str, str], Mark]
    writer: bytes = field(default_factory=lambda: os.urandom(WRITER_BYTES))
    """Random, told in each of the run's writes: the rule counts a run's writes of a step whose next put,
    the run's own, reached the log first."""


class RunMarks:
    """Every run's marks, by the run's `Runtime`, the least recently used forgotten beyond `MAX_RUNS`."""

    def __init__(self) -> None:
        self._runs: OrderedDict[int, Run] = OrderedDict()

    def read(
        self,
        config: Any,
        thread_id: str,
        checkpoint_ns: str,
        at: tuple[int, int],
        basis: Basis,
        head_id: str | None,
    ) -> Run | None:
        """A run read the namespace as of `at` (partition, offset): `basis` is what the one-writer rule held of
        the thread then, `head_id` the namespace's newest checkpoint (None: none). Returns the run (`enter` it
        in the caller's context); a call outside a run sets no mark, nor does a later read of a namespace the
        run read before (its writes since expect its own latest put, whatever code in a node reads)."""
        run = self._run(config, create=True)
        if run is not None and (thread_id, checkpoint_ns) not in run.marks:
            lead, ops = basis.lead, basis.operations
            mark = Mark(
                thread_id, checkpoint_ns, *at, lead, basis.lead_run, basis.lead_writer, ops, lead, head_id, run.writer
            )
            run.marks[(thread_id, checkpoint_ns)] = mark
        return run

    def run_marked(self, config: Any, thread_id: str, checkpoint_ns: str) -> Run | None:
        """The run `config` belongs to, if it read the namespace already."""
        run = self._run(config, create=False)
        return run if run is not None and (thread_id, checkpoint_ns) in run.marks else None

    def of(self, config: Any, thread_id: str, checkpoint_ns: str) -> Mark | None:
        """The mark of the run `config` belongs to on the namespace, if the run read it."""
        run = self._run(config, create=False)
        return None if run is None else run.marks.get((thread_id, checkpoint_ns))

    def _run(self, config: Any, *, create: bool) -> Run | None:
        runtime = _runtime_of(config)
        if runtime is None:
            return None
        run = self._runs.get(id(runtime))
        if run is not None and run.runtime is runtime:
            self._runs.move_to_end(id(runtime))
            return run
        if not create:
            return None
        run = self._runs[id(runtime)] = Run(runtime, {})
        while len(self._runs) > MAX_RUNS:
            self._runs.popitem(last=False)
        return run


def in_run(config: Any) -> bool:
    """Whether `config` is of a call a LangGraph run makes."""
    return _runtime_of(config) is not None


def _runtime_of(config: Any) -> object | None:
    configurable = config.get("configurable") if isinstance(config, dict) else None
    return configurable.get(RUNTIME_KEY) if isinstance(configurable, dict) else None


_current_run: contextvars.ContextVar[Run | None] = contextvars.ContextVar("graphledger_run", default=None)
"""The run whose loop reads in this context: LangGraph calls `get_next_version` in the loop's own context, the
one its first `get_tuple` ran in."""


def enter(run: Run | None) -> None:
    """`run` is the run of this context's loop (in the caller's frame, after any hop to the client's loop);
    None after a read outside any run (`update_state` calls `get_next_version` too, and no earlier run's
    refusal is its)."""
    _current_run.set(run)


def raise_if_refused() -> None:
    """Raise the refusal of a write of the run this context's loop belongs to, if any."""
    run = _current_run.get()
    if run is None:
        return
    for mark in run.marks.values():
        if mark.refusal is not None:
            raise mark.refusal


# -- a write's verdict from the log's headers ----------------------------------------------------------

OPERATIONS: Final = frozenset(
    name.encode() for name in ("thread.delete", "thread.expire", "thread.copy.barrier", "thread.erase", "tenant.erase")
)
"""The `gl-type` of records that count as a thread operation whatever their payload."""
PRUNE: Final = b"thread.prune"
"""An operation when its `gl-operation` header says so, or says nothing (only `delete` is one: its strategy
is sealed, and without the header this errs toward refusing)."""


def window_start(mark: Mark, names: IntentNames, last: int) -> Scanned:
    """Where the scan for the verdict of the run's write at `last` starts: after the run's latest counted write
    below it, else at the read (the mark's lead, operations and `through`)."""
    if mark.scanned is not None and mark.scanned.through <= last:
        return mark.scanned
    own_ns = names.namespace(mark.checkpoint_ns)
    runs: dict[bytes, object] = {own_ns: mark.lead_run} if mark.lead is not None else {}
    writers = {own_ns: mark.lead_writer} if mark.lead_writer else {}
    leads = {own_ns: mark.lead} if mark.lead is not None else {}
    return Scanned(mark.through, Ledger(mark.operations, leads, runs, {}, writers))


def window_verdict(
    mark: Mark,
    names: IntentNames,
    records: Sequence[LogRecord],
    key: bytes,
    write: LogRecord,
    start: Scanned | None = None,
) -> Verdict:
    """The one-writer rule's verdict of `write`, the run's own record, from the records of the thread (`key`)
    and the keyless ones in the mark's partition from `start` (default: `window_start`) up to it, read by their
    headers alone, each event at its last record (where every reader completes a chunked one): every other
    writer's record is taken as applied (what the projector dead-letters would only have left the thread as the
    run read it, so this errs toward refusing, never toward counting). A counted write moves `mark.scanned`
    past it."""
    start = window_start(mark, names, write.offset) if start is None else start
    own_ns = names.namespace(mark.checkpoint_ns)
    ledger = start.ledger
    for record in records:
        if record.offset >= write.offset or record.offset < start.through:
            continue
        if (record.key != key and record.key is not None) or not _completes_its_event(record):
            continue
        kind = header(record.headers, HEADER_TYPE)
        raw = header(record.headers, HEADER_INTENT)
        intent = None if raw is None else ownership.parsed(raw)
        if kind == PUT:
            # A put's run id is sealed: the run's own is known, another writer's is not.
            run = mark.run_id if intent is not None and intent.writer == mark.writer else UNKNOWN_RUN
            ledger, _ = ownership.put(ledger, intent.namespace if intent is not None else b"?", intent, run)
        elif kind in OPERATIONS or (kind == PRUNE and header(record.headers, HEADER_OPERATION) != b"0"):
            ledger = ownership.operation(ledger)  # a prune without the header (an older writer's) may delete
        elif kind == RUNS_DELETE:
            ledger = _runs_deleted(ledger, own_ns, record)
    raw = header(write.headers, HEADER_INTENT)
    assert raw is not None, "a run's write carries its intent"
    intent = ownership.parsed(raw)
    if header(write.headers, HEADER_TYPE) == PUT:
        # As a later scan takes this record: the run's own put, of its run id.
        ledger, verdict = ownership.put(ledger, own_ns, intent, mark.run_id)
    else:
        verdict = ownership.writes(ledger, own_ns, intent)
    if isinstance(verdict, Refused):
        return dataclasses.replace(verdict, reason=verdict.reason + FROM_HEADERS)
    if mark.scanned is None or mark.scanned.through <= write.offset:
        mark.scanned = Scanned(write.offset + 1, ledger)
    return verdict


def _completes_its_event(record: LogRecord) -> bool:
    """Whether the record is where its event takes its place in the log: a chunked event's last chunk (every
    reader completes it there; the publisher sends chunks in order), any other record itself. A malformed
    chunk header is taken as complete, which errs toward refusing."""
    raw = header(record.headers, HEADER_CHUNK)
    if raw is None:
        return True
    try:
        ref = chunks.parse_header(raw)
    except InvalidEventError:
        return True
    return ref.index == ref.count - 1


FROM_HEADERS: Final = (
    " (decided from the log's headers, taking the other writer's record as applied: if the projector"
    " dead-lettered that record, the projection counts this write, and `graphledger forks list` shows no refusal"
    " of it)"
)


PUT: Final = CheckpointPut.TYPE.encode()
UNKNOWN_RUN: Final = object()
"""The run id of another writer's put, which its sealed metadata holds: a `runs.delete` may name it."""
RUNS_DELETE: Final = RunsDelete.TYPE.encode()


def _runs_deleted(ledger: Ledger[bytes], own_ns: bytes, record: LogRecord) -> Ledger[bytes]:
    """A `runs.delete` (never sealed: its run ids travel in clear): an operation if it names the lead's run,
    or if the lead is another writer's, whose run the headers do not tell."""
    if own_ns not in ledger.leads:
        return ledger
    if ledger.lead_runs.get(own_ns) is UNKNOWN_RUN:
        return ownership.operation(ledger)
    try:
        event = checkpoint_event(envelope_decode(record.value))
    except GraphledgerError:
        return ledger  # the projector dead-letters it: no effect
    return ownership.runs_deleted(ledger, event.run_ids) if isinstance(event, RunsDelete) else ledger
