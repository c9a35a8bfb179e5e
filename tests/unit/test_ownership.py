"""One writer per thread (`graphledger/ownership.py`): which writes count, from the order of the records alone."""

from __future__ import annotations

import pytest

from graphledger import ownership
from graphledger.errors import InvalidEventError
from graphledger.ownership import NO_CHECKPOINT, SUPERSEDED, THREAD_CHANGED, Counted, Intent, Ledger, Refused

NS = ""


def intent(checkpoint: str, expects: str | None, operations: int = 0, writer: bytes = b"") -> Intent:
    expected = NO_CHECKPOINT if expects is None else expects.encode()
    return Intent(b"ns", checkpoint.encode(), expected, operations, writer)


def test_the_first_of_two_writers_that_read_an_empty_thread_counts_and_the_second_is_refused() -> None:
    ledger, first = ownership.put(Ledger(), NS, intent("a1", None))
    assert first == Counted() and ledger.lead(NS) == b"a1"
    after, second = ownership.put(ledger, NS, intent("b1", None))
    assert isinstance(second, Refused) and second.cause == SUPERSEDED and second.superseded_by == b"a1"
    assert after == ledger


def test_a_writers_own_chain_counts_put_by_put_with_its_writes() -> None:
    ledger, _ = ownership.put(Ledger(), NS, intent("c1", None))
    assert ownership.writes(ledger, NS, intent("c1", "c1")) == Counted()
    ledger, verdict = ownership.put(ledger, NS, intent("c2", "c1"))
    assert verdict == Counted() and ledger.lead(NS) == b"c2"
    # A write of the parent sent after the put (a sync step's late write) expects the writer's latest put.
    assert ownership.writes(ledger, NS, intent("c1", "c2")) == Counted()


def test_a_superseded_writer_is_refused_at_its_writes_and_its_next_put() -> None:
    """LangGraph issue 8796: A stopped inside a node, B resumed the thread and went on, A thawed."""
    ledger, _ = ownership.put(Ledger(), NS, intent("c1", None))  # A's input
    ledger, verdict = ownership.put(ledger, NS, intent("c2", "c1"))  # B's step on top of it
    assert verdict == Counted()
    late_writes = ownership.writes(ledger, NS, intent("c1", "c1"))  # A's task, written against its own tip
    assert isinstance(late_writes, Refused) and late_writes.superseded_by == b"c2"
    after, late_put = ownership.put(ledger, NS, intent("c2a", "c1"))
    assert isinstance(late_put, Refused) and late_put.cause == SUPERSEDED and after == ledger


def test_writes_before_their_put_count_at_the_operations_read_and_go_with_their_put() -> None:
    ledger, _ = ownership.put(Ledger(), NS, intent("c1", None), checkpoint_id="1")
    # The writer's next checkpoint "2": its writes raced its put to the log.
    assert ownership.writes(ledger, NS, intent("c2", "c2"), checkpoint_id="2") == Counted()
    # Not newer than the lead: no put of it is to come.
    old = ownership.writes(ledger, NS, intent("c0", "c0"), checkpoint_id="0")
    assert isinstance(old, Refused) and old.cause == SUPERSEDED
    # At another operation count: the thread changed under the writer.
    stale = ownership.writes(ledger, NS, intent("c2", "c2", operations=5), checkpoint_id="2")
    assert isinstance(stale, Refused)


def test_a_runs_writes_of_a_step_count_after_its_next_put_reached_the_log_first() -> None:
    """A large write's last chunk can land after the put of the run's next step: its run put the lead."""
    ledger, _ = ownership.put(Ledger(), NS, intent("c1", None, writer=b"run-a"), checkpoint_id="1")
    ledger, _ = ownership.put(ledger, NS, intent("c2", "c1", writer=b"run-a"), checkpoint_id="2")
    assert ownership.writes(ledger, NS, intent("c1", "c1", writer=b"run-a"), checkpoint_id="1") == Counted()
    # Another run that read c1 (a zombie) is refused, and so is a write that names no run.
    zombie = ownership.writes(ledger, NS, intent("c1", "c1", writer=b"run-b"), checkpoint_id="1")
    assert isinstance(zombie, Refused) and zombie.superseded_by == b"c2"
    assert isinstance(ownership.writes(ledger, NS, intent("c1", "c1"), checkpoint_id="1"), Refused)
    # Once a thread operation opened the namespace, the run's writes count only at the operations it read.
    opened = ownership.operation(ledger)
    assert isinstance(ownership.writes(opened, NS, intent("c1", "c1", writer=b"run-a")), Refused)


def test_a_put_of_the_lead_again_is_a_retry_and_counts() -> None:
    ledger, _ = ownership.put(Ledger(), NS, intent("c1", None))
    assert ownership.put(ledger, NS, intent("c1", None)) == (ledger, Counted())


def test_a_put_without_intent_counts_opens_its_namespace_and_refuses_writers_that_read_before() -> None:
    ledger, _ = ownership.put(Ledger(), NS, intent("c1", None))
    ledger, verdict = ownership.put(ledger, NS, None)  # a direct aput, or a record from before the rule
    assert verdict == Counted() and ledger.lead(NS) is None and ledger.operations == 1
    _, stale = ownership.put(ledger, NS, intent("c2", "c1", operations=0))
    assert isinstance(stale, Refused) and stale.cause == THREAD_CHANGED
    _, fresh = ownership.put(ledger, NS, intent("c3", "whatever-it-read", operations=1))
    assert fresh == Counted()  # an open namespace takes the next protected put whatever its writer read
    assert ownership.writes(ledger, NS, None) == Counted()


def test_a_thread_operation_opens_every_namespace_and_refuses_writers_that_read_before_it() -> None:
    ledger, _ = ownership.put(Ledger(), "a", intent("c1", None))
    ledger, _ = ownership.put(ledger, "b", intent("d1", None))
    ledger = ownership.operation(ledger)  # a delete, a prune that deletes, an expiry, a copy onto it
    assert (ledger.operations, dict(ledger.leads)) == (1, {})
    refused = ownership.writes(ledger, "a", intent("c1", "c1"))
    assert isinstance(refused, Refused) and refused.cause == THREAD_CHANGED
    assert ownership.writes(ledger, "a", intent("e1", None, operations=1)) == Counted()


def test_runs_delete_opens_a_namespace_led_by_a_deleted_run_only() -> None:
    ledger, _ = ownership.put(Ledger(), "a", intent("c1", None), run_id="run-1")
    ledger, _ = ownership.put(ledger, "b", intent("d1", None), run_id="run-2")
    assert ownership.runs_deleted(ledger, ["run-3"]) == ledger
    after = ownership.runs_deleted(ledger, ["run-1"])
    assert (after.operations, dict(after.leads)) == (1, {"b": b"d1"})
    _, late = ownership.put(after, "a", intent("c2", "c1"))  # the cancelled run's late put
    assert isinstance(late, Refused) and late.cause == THREAD_CHANGED


def test_an_intent_travels_as_the_header_it_is_parsed_from() -> None:
    sent = Intent(b"\x01" * 16, b"\x02" * 16, NO_CHECKPOINT, 7, b"\x03" * 8)
    assert Intent.parse(sent.header()) == sent


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\xc1", "not msgpack"),
        (b"\x95\xc4\x01n\xc4\x01c\xc4\x01e\xc0\xc4\x00", "not a count"),
        (b"\x93\xc4\x01n\xc4\x01c\xc4\x01e", "not \\[namespace, checkpoint, expects, operations, writer\\]"),
        (Intent(b"n", b"c", b"", 0, b"w" * 65).header(), "writer is not bytes of at most 64"),
        (Intent(b"", b"c", b"", 0).header(), "names no namespace"),
        (Intent(b"n" * 65, b"c", b"", 0).header(), "at most 64"),
    ],
)
def test_a_malformed_intent_is_refused_naming_what_is_wrong(raw: bytes, message: str) -> None:
    with pytest.raises(InvalidEventError, match=message):
        Intent.parse(raw)
