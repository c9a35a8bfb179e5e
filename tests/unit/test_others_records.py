"""A pod folds other pods' records of a thread it holds onto its view, as the projection applies them, and
falls back to the read API for whatever it cannot open or follow alone."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from checkpoint_builders import FIRST, SECOND, folded, newest, put, values, writes
from graphledger.client.others_records import Fallback, Opening, others_of_thread
from graphledger.client.others_records import folded as fold_others
from graphledger.client.threads import Held, Own
from graphledger.erasure.sealing import Cipher, SealedSubject, cipher_of, new_data_key, seal
from graphledger.events import envelope, to_envelope
from graphledger.events.checkpoint import CheckpointEvent, ThreadDelete
from graphledger.events.envelope import HEADER_CHUNK
from graphledger.folds import thread
from graphledger.log.records import LogRecord

KEY = b"thread-key"
REF = "ref-of-t"
PARTITION = 3
THREAD_KEY = cipher_of(new_data_key())


def _record(
    offset: int, event: CheckpointEvent, key: bytes | None = KEY, cipher: Cipher | None = None, **seal_as: str
) -> LogRecord:
    env = to_envelope(event)
    if cipher is not None:
        subject = SealedSubject(REF, "thread", seal_as.get("tenant", ""), seal_as.get("name", "t"))
        env = seal(env, subject, cipher, seal_as.get("key_id"))
    headers = tuple(envelope.headers_for(env))
    return LogRecord("checkpoints", PARTITION, offset, key, envelope.encode(env), headers, 1_767_225_600_000)


def _held(view: thread.View, through: int = 10, own: tuple[Own, ...] = ()) -> Held:
    return Held(1, PARTITION, through, view, own, 0)


def _opening(keys: Callable[[str, str | None], Cipher | None] = lambda ref, key_id: None, **kw: bool) -> Opening:
    return Opening(keys, "", kw.get("clear_refused", False))


def _thread_key(ref: str, key_id: str | None) -> Cipher | None:
    return THREAD_KEY if (ref, key_id) == (REF, None) else None


def test_another_pods_put_and_writes_fold_onto_the_held_view_as_the_projection_applies_them() -> None:
    held = _held(folded(FIRST))
    step = writes("02", "task", [("n", 3)])
    others = [_record(11, SECOND), _record(12, step)]
    view = fold_others(held, others, "t", _opening())
    assert isinstance(view, thread.View)
    assert newest(view) == newest(folded(FIRST, SECOND, step))
    assert values(newest(view))["n"] == 2  # type: ignore[arg-type]


def test_sealed_records_open_with_the_threads_own_key_when_held_and_fall_back_when_not() -> None:
    held = _held(folded(FIRST))
    sealed = [_record(11, SECOND, cipher=THREAD_KEY)]
    view = fold_others(held, sealed, "t", _opening(_thread_key, clear_refused=True))
    assert isinstance(view, thread.View) and newest(view) == newest(folded(FIRST, SECOND))
    fresh = [_record(11, SECOND, cipher=cipher_of(new_data_key()), key_id="another-pods-fresh-key")]
    assert fold_others(held, fresh, "t", _opening(_thread_key)) == Fallback("key_not_held")


def test_what_the_projector_would_dead_letter_is_left_to_the_read_api() -> None:
    held = _held(folded(FIRST))
    clear = [_record(11, SECOND)]
    assert fold_others(held, clear, "t", _opening(_thread_key, clear_refused=True)) == Fallback("dead_letter")
    forged = [_record(11, SECOND, cipher=THREAD_KEY, tenant="acme")]  # a seal claiming another tenant
    assert fold_others(held, forged, "t", _opening(_thread_key)) == Fallback("dead_letter")
    tampered = [_record(11, SECOND, cipher=cipher_of(new_data_key()))]  # another key under the thread's name
    assert fold_others(held, tampered, "t", _opening(_thread_key)) == Fallback("dead_letter")


def test_operations_chunks_and_records_before_own_ones_fall_back() -> None:
    held = _held(folded(FIRST))
    assert fold_others(held, [_record(11, ThreadDelete("t"))], "t", _opening()) == Fallback("operation")
    chunk = _record(11, SECOND)
    chunked = LogRecord(chunk.topic, PARTITION, 11, KEY, b"part", ((HEADER_CHUNK, b"e:0:2"),))
    assert fold_others(held, [chunked], "t", _opening()) == Fallback("chunked")
    own_after = _held(folded(FIRST, SECOND), own=(Own((12,), SECOND),))
    third = put("03", "02", {"msgs": ["a"], "n": 3}, {"msgs": "1", "n": "3"}, {"n": "3"})
    assert fold_others(own_after, [_record(11, third)], "t", _opening()) == Fallback("interleaved")


def test_only_the_threads_records_not_its_own_are_folded_and_another_threads_change_nothing() -> None:
    held = _held(folded(FIRST, SECOND), own=(Own((11,), SECOND),))
    records = [_record(11, SECOND), _record(12, SECOND, key=b"other"), _record(13, ThreadDelete("t"), key=None)]
    assert [r.offset for r in others_of_thread(held, records, KEY, 14)] == [13]
    assert others_of_thread(held, records, KEY, 13) == []  # at or past the end the fold is held as of
    collided = dataclasses.replace(SECOND, thread_id="u")  # keyed as the thread's, naming another
    view = fold_others(_held(folded(FIRST)), [_record(11, collided)], "t", _opening())
    assert isinstance(view, thread.View) and newest(view) == newest(folded(FIRST))
