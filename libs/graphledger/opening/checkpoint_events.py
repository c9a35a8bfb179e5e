"""What the checkpoint projection accepts of a checkpoint envelope, as a typed event at its time: the one
validation the projector, a replay and the read API's read-through open checkpoint records with."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import assert_never

from graphledger.errors import InvalidEventError
from graphledger.events import checkpoint, checkpoint_event
from graphledger.events.envelope import Envelope
from graphledger.events.erasure import TenantErase, ThreadErase
from graphledger.ownership import Intent
from graphledger.pg_text import json_text_problem, json_text_suspect
from graphledger.quick_init import quick_init


@quick_init
@dataclass(frozen=True, slots=True)
class TimedCheckpointEvent:
    """A checkpoint event with its time (ms, `envelope.append_time_ms`): a thread's activity time."""

    event: checkpoint.CheckpointEvent
    ts_ms: int
    source_erased_later: bool = False
    """For a `thread.copy`: its source's erasure was recorded in the key store after the copy was
    appended (`BatchApplier`), so the source held what the copy copied even if the projector, reaching
    the source's records after its key was destroyed, holds none of it: the copy's lineage is kept."""
    within_threads: tuple[str, ...] | None = None
    """For a `runs.delete` applied again when a parked subject is released (`projection/parked_release.py`): the
    threads it may change (it changed the partition's others where it stands). None: every thread."""

    @property
    def TYPE(self) -> str:
        return self.event.TYPE


# A JSON `\u0000` escape (not an escaped backslash followed by "u0000"): jsonb cannot hold NUL.
_JSON_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
_INT4 = range(-(2**31), 2**31)


def to_checkpoint_event(env: Envelope) -> checkpoint.CheckpointEvent:
    """The typed event, refusing what would make its batch's statements fail or what no read of it
    could return (`InvalidEventError`).

    Without this one bad event would fail the set-based statement of a whole batch; the projector
    then falls back to applying events one by one to find it, which is correct but slow.
    """
    event = checkpoint_event(env)
    match event:
        case checkpoint.CheckpointPut():
            if event.intent is not None:
                Intent.parse(event.intent)
            for name, text in (("checkpoint", event.checkpoint_json), ("metadata", event.metadata_json)):
                try:
                    text.decode()
                except UnicodeDecodeError as exc:
                    raise InvalidEventError(f"{name} JSON is not UTF-8: {exc}") from None
                if b"\x00" in text or (b"\\u0000" in text and _JSON_NUL.search(text)):
                    raise InvalidEventError(f"{name} JSON contains \\u0000, which Postgres jsonb cannot store")
                if json_text_suspect(text) and (problem := json_text_problem(text, f"{name} JSON")):
                    raise InvalidEventError(problem)
        case checkpoint.CheckpointWrites():
            if event.intent is not None:
                Intent.parse(event.intent)
            for w in event.writes:
                if w.idx not in _INT4:
                    raise InvalidEventError(f"write idx {w.idx} does not fit checkpoint_writes.idx (int4)")
        case (
            checkpoint.ThreadDelete()
            | checkpoint.ThreadCopy()
            | checkpoint.ThreadCopyBarrier()
            | checkpoint.ThreadPrune()
            | checkpoint.ThreadExpire()
            | checkpoint.RunsDelete()
            | ThreadErase()
            | TenantErase()
        ):
            pass  # nothing in them that the schema's checks let through and Postgres would refuse
        case _:
            assert_never(event)
    return event


def to_event(env: Envelope, appended_ms: int) -> TimedCheckpointEvent:
    """The typed event at its time (`envelope.append_time_ms`); raises `InvalidEventError`."""
    return TimedCheckpointEvent(to_checkpoint_event(env), appended_ms)
