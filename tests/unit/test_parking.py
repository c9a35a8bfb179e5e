"""What a record no projector version can apply does to its subject (`projection/parking.py`), without a
database: a barrier's decision, who releases what, and which later records a parked subject holds."""

from __future__ import annotations

import pytest

from graphledger.errors import ParkedSubjectError
from graphledger.events.checkpoint import RunsDelete, ThreadCopyBarrier
from graphledger.opening.checkpoint_events import TimedCheckpointEvent
from graphledger_server.log.parked import Cause, ParkedSubject, Verdict, parse_subject_name, subject_name
from graphledger_server.projection.parking import (
    Apply,
    Drop,
    Park,
    Parking,
    Pause,
    barrier_decision,
    releasable,
    threads_named,
)
from projection_helpers import TOPIC, put, record

COPY = (2, 40)
"""The copy's record a barrier requires: partition 2, offset 40."""


@pytest.mark.parametrize(
    ("committed", "end", "held", "verdict", "expected"),
    [
        (41, 50, False, None, Apply()),  # the copy has applied
        (40, 50, False, None, Pause()),  # within the log, not applied yet: wait, as a copy's barrier always did
        (0, 41, False, None, Pause()),  # the copy is the log's last record
        (0, None, False, None, Pause()),  # the end not known: never beyond
        (0, 40, False, None, Park(Cause.BEYOND_LOG, "")),  # the end is at its position: no copy there
        (0, 0, False, None, Park(Cause.BEYOND_LOG, "")),  # a partition the topic does not have
        (41, 50, True, None, Park(Cause.COPY_PARKED, "", COPY)),  # passed, but held by a parked subject
        (41, 50, False, Verdict.BEYOND_LOG, Park(Cause.BEYOND_LOG, "")),  # decided so once, the log grown since
        (41, 50, False, Verdict.DROPPED, Drop("")),
    ],
)
def test_a_barrier_waits_for_a_copy_within_its_log_and_parks_only_when_none_can_come(
    committed: int, end: int | None, held: bool, verdict: Verdict | None, expected: object
) -> None:
    decision = barrier_decision(COPY, committed, end, held, verdict)
    assert type(decision) is type(expected)
    if isinstance(decision, Park) and isinstance(expected, Park):
        assert (decision.cause, decision.waits_for) == (expected.cause, expected.waits_for)
        assert "partition 2 offset 40" in decision.reason
    if isinstance(decision, Drop):
        assert "dropped by an operator" in decision.reason


def _subject(cause: Cause, version: int | None = None, parked_by: int = 3) -> ParkedSubject:
    return ParkedSubject(TOPIC, 0, 7, b"k", cause, "why", event_version=version, parked_by_version=parked_by)


def test_a_projector_releases_a_version_it_reads_and_a_barrier_whose_copy_applied_never_a_forged_one() -> None:
    assert releasable(_subject(Cause.NEWER_VERSION, 4), 4, copy_applied=False)
    assert not releasable(_subject(Cause.NEWER_VERSION, 4), 3, copy_applied=False)  # the version that parked it
    assert not releasable(_subject(Cause.NEWER_VERSION, 99), 4, copy_applied=False)
    # A version below the parker's: no upcaster reached it (a packaging bug), no projector of it helps.
    assert not releasable(_subject(Cause.NEWER_VERSION, 2, parked_by=3), 3, copy_applied=False)
    assert releasable(_subject(Cause.COPY_PARKED), 3, copy_applied=True)
    assert not releasable(_subject(Cause.COPY_PARKED), 3, copy_applied=False)
    assert not releasable(_subject(Cause.BEYOND_LOG), 99, copy_applied=True)


def test_a_parked_subject_holds_its_later_records_and_keyless_ones_are_kept_for_it() -> None:
    parking = Parking(schema_version=3)
    first = record(put("t", 1), 0, 5)
    subject = parking.park(first, Cause.NEWER_VERSION, "event version 99 ...", version=99)
    assert (subject.name, subject.record_key, subject.event_version) == (f"{TOPIC}:0@5", b"t", 99)
    assert parking.parked_at(record(put("t", 2), 0, 6)) == 5
    assert parking.parked_at(record(put("u", 1), 0, 7)) is None  # another subject
    assert parking.parked_at(record(put("t", 2), 1, 6)) is None  # another partition
    parking.keep_keyless(record(RunsDelete(("r",)), 0, 8))
    parking.keep_keyless(record(RunsDelete(("r",)), 1, 8))  # no subject of that partition is parked
    assert [(h.partition, h.offset, h.first_offset) for h in parking.parked_records] == [(0, 5, 5), (0, 8, None)]
    assert parking.parked_before(record(RunsDelete(("r",)), 0, 8))
    assert not parking.parked_before(record(RunsDelete(("r",)), 0, 4))


def test_a_keyless_record_parks_alone_and_a_barrier_beyond_the_log_is_a_verdict() -> None:
    parking = Parking(schema_version=3)
    keyless = record(RunsDelete(("r",)), 0, 3)
    parking.park(keyless, Cause.NEWER_VERSION, "event version 99 ...")
    assert parking.parked_at(record(RunsDelete(("r",)), 0, 4)) is None
    parking.keep_keyless(record(RunsDelete(("r",)), 0, 4))  # kept only for keyed subjects
    barrier = record(ThreadCopyBarrier("t", 1, 2**62), 0, 9)
    parking.park(barrier, Cause.BEYOND_LOG, "beyond")
    assert parking.decided == {(TOPIC, 0, 9): Verdict.BEYOND_LOG}
    assert [(h.offset, h.first_offset) for h in parking.parked_records] == [(3, 3), (9, 9)]


def test_a_released_subjects_threads_bound_the_runs_delete_kept_for_it() -> None:
    events = [TimedCheckpointEvent(put("t", 1), 0), ThreadCopyBarrier("u", 0, 1), RunsDelete(("r",))]
    assert threads_named(events) == ("t", "u")


def test_a_subject_is_named_by_its_first_records_position() -> None:
    assert parse_subject_name(subject_name("graphledger.checkpoints", 3, 1207)) == ("graphledger.checkpoints", 3, 1207)
    for wrong in ("graphledger.checkpoints:3", "x:y@1", ":1@2", "t:1@-2", "t:1@2 ; drop"):
        with pytest.raises(ParkedSubjectError, match="not a parked subject's name"):
            parse_subject_name(wrong)
