"""Other processes' records of a thread this process holds, folded onto its view as the projection applies them.

In Kubernetes a thread's next turn most often lands on another pod. The log tail a read fetches anyway
(`thread_reads.py`) brings every record appended since the view's `through`, the other pods' too. When each
of the thread's records there that is not this process's own is a put or writes of the thread that this
process opens as the projector does (decoded, unsealed with a key it holds, validated by
`opening/checkpoint_events.py`, admitted by its seal and its key's owner), and all of them come after the
view's own records, the view with them folded in (`thread.apply`, the one-writer rule included) is the
projection's as of the log's end, and the read needs no read API. Anything else is a `Fallback` to the read
API, which settles it, its reason counted:
- a record sealed with a key the process does not hold (another pod's fresh key, until the pods share the
  thread's own key: `EventSealer.share`), or holds past its `key_cache_ttl_s` (an erasure it has not heard of);
  for the thread's own key, the read asks for it and folds again (`THREAD_KEY_NOT_HELD`);
- a chunk, a dead letter, a record from a newer graphledger;
- any other operation of the thread: delete, prune, copy onto it, expiry, `runs.delete`, erasures;
- another writer's record before one of the view's own (the view has folded its own records already).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from graphledger.client.threads import Held
from graphledger.erasure.sealing import Cipher
from graphledger.events import envelope
from graphledger.events.checkpoint import CheckpointPut, CheckpointWrites, ThreadCopy
from graphledger.folds import thread
from graphledger.log.records import LogRecord
from graphledger.opening import checkpoint_events
from graphledger.opening.admission import admitted
from graphledger.opening.records import DeadLetter, Decoded, Erased, TooNew, classify, key_name, unwrapped

THREAD_KEY_NOT_HELD = "thread_key_not_held"
"""A record sealed with the thread's own key, which the process can ask for (`EventSealer.share`) and fold."""


class Fallback(NamedTuple):
    """Why the process cannot fold the records alone: the read API answers the read."""

    reason: str
    """A short label, the `fell_back` counter's key."""


@dataclass(frozen=True, slots=True)
class Opening:
    """What this process opens other processes' records with."""

    keys: Callable[[str, str | None], Cipher | None]
    """The data keys it holds, by `(reference, fresh key id)` (None: not held, or no longer trusted)."""
    tenant: str
    """The tenant every key it holds was issued to (the read API scopes keys to the token's tenant)."""
    clear_refused: bool
    """Encryption on and no clear era accepted: a record in the clear is a dead letter to the projector."""


def others_of_thread(held: Held, records: Sequence[LogRecord], key: bytes, end: int) -> list[LogRecord]:
    """The records among `records` below `end` that may change the thread and are not the snapshot's own: its
    key's, and the keyless ones (`runs.delete`, a tenant's erasure).

    The fold is held as of `end`, so a record at or past it is left to the next look, which starts there: a
    tail's scan reads on past the end its first fetch learned, and folded twice, a put without an intent
    would count two operations."""
    own = held.own_offsets
    return [r for r in records if r.offset < end and (r.key == key or r.key is None) and r.offset not in own]


def folded(held: Held, others: Sequence[LogRecord], stored_thread_id: str, opening: Opening) -> thread.View | Fallback:
    """The snapshot's view with `others` (`others_of_thread`, in log order) applied, or why not."""
    if others and any(own.last > others[0].offset for own in held.own):
        return Fallback("interleaved")
    view = held.view
    for record in others:
        event = _opened(record, opening)
        if isinstance(event, Fallback):
            return event
        if isinstance(event, ThreadCopy) or event.thread_id != stored_thread_id:
            continue  # a copy is keyed by its source, which it does not change; another thread's, by a collision
        view = thread.apply(view, event)
    return view


def _opened(record: LogRecord, opening: Opening) -> CheckpointPut | CheckpointWrites | ThreadCopy | Fallback:
    if envelope.header(record.headers, envelope.HEADER_CHUNK) is not None:
        return Fallback("chunked")
    sealed = key_name(record)
    key = None if sealed is None else opening.keys(*sealed)
    if sealed is not None and key is None:
        return Fallback("key_not_held" if sealed[1] is not None else THREAD_KEY_NOT_HELD)

    def lookup(ref: str, key_id: str | None) -> Cipher | None:
        return key if (ref, key_id) == sealed else None  # the seal names what its headers name, or opens not

    classified = classify(record, checkpoint_events.to_event, lookup)
    item = admitted(
        classified, lambda name: opening.tenant if name == sealed else None, clear_refused=opening.clear_refused
    )
    match item:
        case Decoded():
            event = unwrapped(item.event)
            if isinstance(event, CheckpointPut | CheckpointWrites | ThreadCopy):
                return event
            return Fallback("operation")
        case DeadLetter():
            return Fallback("dead_letter")
        case TooNew():
            return Fallback("too_new")
        case Erased():
            return Fallback("erased")
        case _:
            return Fallback("chunked")
