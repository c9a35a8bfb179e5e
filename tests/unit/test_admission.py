"""Which events the projector admits (`opening/admission.py`): a seal claiming a subject of
another tenant than its key's, or naming other data than the subject it claims, is refused; so is an
event of a subject in the clear while encryption is on."""

from __future__ import annotations

from graphledger.erasure.sealing import SealedSubject
from graphledger.events.checkpoint import RunsDelete, ThreadCopy, ThreadCopyBarrier, ThreadDelete
from graphledger.events.envelope import HEADER_SUBJECT
from graphledger.events.erasure import TenantErase, ThreadErase
from graphledger.log.records import LogRecord
from graphledger.opening.admission import admitted, misattributed
from graphledger.opening.records import DeadLetter, Decoded
from projection_helpers import put
from store_helpers import put as store_put

ACME_THREAD = SealedSubject("r1", "thread", "acme", "acme/t")
ACME_MEMORIES = SealedSubject("r2", "namespace", "acme", "acme.users.42")


def test_a_subjects_own_events_sealed_with_its_tenants_key_are_admitted() -> None:
    assert misattributed(put("acme/t", 1), ACME_THREAD, "acme") is None
    assert misattributed(ThreadCopy("acme/s", "acme/t"), ACME_THREAD, "acme") is None
    assert misattributed(ThreadCopyBarrier("acme/t", 0, 5), ACME_THREAD, "acme") is None
    assert misattributed(store_put(("acme", "users", "42", "notes"), "k", {}), ACME_MEMORIES, "acme") is None
    unnamed = SealedSubject("r3", "thread", "", "t")  # the unnamed tenant owns every name
    assert misattributed(ThreadCopy("s", "t"), unnamed, "") is None


def test_a_seal_claiming_another_tenants_subject_is_refused() -> None:
    reason = misattributed(put("acme/t", 1), ACME_THREAD, "evil")
    assert reason is not None and "another tenant than its key's" in reason and "acme/t" not in reason
    assert "no owner" in (misattributed(put("acme/t", 1), ACME_THREAD, None) or "")


def test_an_event_naming_other_data_than_its_seals_subject_is_refused() -> None:
    assert "another thread" in (misattributed(put("acme/other", 1), ACME_THREAD, "acme") or "")
    namespace = ("acme", "users", "43")
    assert "another namespace" in (misattributed(store_put(namespace, "k", {}), ACME_MEMORIES, "acme") or "")
    evil = SealedSubject("r4", "thread", "evil", "evil/t")
    stolen = misattributed(ThreadCopy("acme/t", "evil/t"), evil, "evil")  # a copy reads its source's rows
    assert stolen is not None and "outside that tenant" in stolen


def test_the_verdict_is_taken_when_a_record_is_decoded_and_kept_with_it() -> None:
    """The read API keeps a record's classification for later reads, after its key may have left the
    cache: a refused event is a dead letter from the start, an admitted one stays as it was decoded."""
    record = LogRecord("t", 0, 7, b"k", b"v", ((HEADER_SUBJECT, b"r1"),))
    decoded = Decoded(record, put("acme/t", 1), subject=ACME_THREAD)
    assert admitted(decoded, lambda name: "acme") is decoded
    letter = admitted(decoded, lambda name: "evil" if name == ("r1", None) else None)
    assert (
        isinstance(letter, DeadLetter) and "another tenant" in letter.reason and letter.event_type == "checkpoint.put"
    )
    assert admitted(DeadLetter(record, "bad", None, b"v"), lambda name: None).reason == "bad"  # type: ignore[union-attr]


def test_with_encryption_on_an_event_of_a_subject_in_the_clear_is_refused_unless_a_clear_era_is_accepted() -> None:
    """Anyone can publish an event in the clear naming any thread or namespace: it proves no key, so with
    encryption on it is refused (`clear_refused`); erasures and `runs.delete` are never sealed and pass."""
    record = LogRecord("t", 0, 7, b"k", b"v", ())
    no_owner = lambda name: None  # noqa: E731
    for event in (
        put("acme/t", 1),
        ThreadCopy("acme/s", "acme/t"),
        ThreadCopyBarrier("acme/t", 0, 5),
        ThreadDelete("acme/t"),
        store_put(("acme", "users", "42"), "k", {}),
    ):
        clear = Decoded(record, event)
        letter = admitted(clear, no_owner, clear_refused=True)
        assert isinstance(letter, DeadLetter), event
        assert "in the clear while encryption is on" in letter.reason and "acme" not in letter.reason
        assert letter.event_type == event.TYPE
        assert admitted(clear, no_owner) is clear, "a log with a clear era (or encryption off) applies it"
    for keyless in (RunsDelete(("r",)), ThreadErase("ref"), TenantErase("acme")):
        clear = Decoded(record, keyless)
        assert admitted(clear, no_owner, clear_refused=True) is clear, keyless
