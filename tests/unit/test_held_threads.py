"""What a client holds of each thread: snapshots that never change under a read, whole-thread eviction,
own records kept until a read proves the log current past them."""

from __future__ import annotations

from checkpoint_builders import FIRST, SECOND, newest, values, writes
from graphledger.client.threads import HeldThreads
from graphledger.folds import thread

PARTITION = 3


def test_a_thread_written_here_first_is_known_only_after_a_read_fixes_its_base() -> None:
    threads = HeldThreads()
    threads.acked("t", PARTITION, (10,), FIRST)
    held = threads.get("t")
    assert held is not None and not held.local and held.named() == frozenset({10})
    # The read API answered as of offset 11, the projection holding nothing of the thread: the own put,
    # below the answer's end, is folded on.
    view = threads.install("t", held, PARTITION, thread.from_answer("", None, []), applied=5, end=11).view
    assert newest(view)["config"]["checkpoint_id"] == "01"  # type: ignore[index]
    held = threads.get("t")
    assert held is not None and held.through == 11 and held.local


def test_a_local_read_forgets_the_own_records_below_the_end_it_saw() -> None:
    threads = HeldThreads()
    threads.install("t", None, PARTITION, thread.NEW, applied=0, end=5)
    threads.acked("t", PARTITION, (5,), FIRST)
    threads.acked("t", PARTITION, (6, 7), writes("01", "task", [("n", 1)]))  # a chunked event: two records
    snapshot = threads.get("t")
    assert snapshot is not None and snapshot.named() == frozenset({5, 6, 7})
    threads.acked("t", PARTITION, (9,), SECOND)  # after the read took its snapshot
    threads.advance("t", snapshot, end=8)
    held = threads.get("t")
    assert held is not None and held.through == 8 and held.named() == frozenset({9})
    assert newest(held.view)["config"]["checkpoint_id"] == "02"  # type: ignore[index]
    assert newest(snapshot.view)["config"]["checkpoint_id"] == "01"  # type: ignore[index]  # unchanged


def test_an_eviction_never_changes_a_snapshot_and_a_read_does_not_hold_it_again() -> None:
    threads = HeldThreads(max_bytes=1)  # every acknowledgement evicts
    threads.install("t", None, PARTITION, thread.NEW, applied=0, end=0)
    threads.acked("t", PARTITION, (0,), FIRST)
    assert threads.get("t") is None and len(threads) == 0 and threads.size == 0


def test_eviction_is_of_whole_threads_least_recently_used_first() -> None:
    threads = HeldThreads()
    for thread_id in ("a", "b", "c"):
        threads.install(thread_id, None, PARTITION, thread.NEW, applied=0, end=0)
        threads.acked(thread_id, PARTITION, (1,), FIRST)
    threads.get("a")  # used: "b" is now the least recently used
    one = threads.get("c").size  # type: ignore[union-attr]
    threads.max_bytes = 2 * one + 1000  # room for two threads, not three
    threads.acked("c", PARTITION, (2,), writes("01", "task", [("n", 1)]))
    assert threads.get("b") is None
    assert threads.get("a") is not None and threads.get("c") is not None


def test_an_answer_replaced_meanwhile_is_returned_but_not_held() -> None:
    threads = HeldThreads()
    threads.acked("t", PARTITION, (4,), FIRST)
    snapshot = threads.get("t")
    threads.forget("t")
    threads.acked("t", PARTITION, (8,), SECOND)  # held anew, after an eviction
    view = threads.install("t", snapshot, PARTITION, thread.from_answer("", None, []), applied=0, end=9).view
    assert values(newest(view)) == {"msgs": ["a"], "n": 2}  # type: ignore[arg-type]
    held = threads.get("t")
    assert held is not None and not held.local  # the new holding is left as it is


def test_own_records_at_or_after_the_applied_offset_are_folded_onto_an_answer() -> None:
    threads = HeldThreads()
    threads.acked("t", PARTITION, (4,), FIRST)
    threads.acked("t", PARTITION, (6,), SECOND)
    snapshot = threads.get("t")
    # The projection holds everything below 5 (the first put) and answered the first checkpoint.
    answer = thread.from_answer("", newest(thread.apply(thread.NEW, FIRST)), [""])
    view = threads.install("t", snapshot, PARTITION, answer, applied=5, end=7).view
    assert newest(view)["config"]["checkpoint_id"] == "02"  # type: ignore[index]


def test_an_erased_thread_reads_empty_and_stays_so() -> None:
    threads = HeldThreads()
    threads.install("t", None, PARTITION, thread.NEW, applied=0, end=0)
    threads.acked("t", PARTITION, (0,), FIRST)
    threads.erased("t")
    threads.acked("t", PARTITION, (1,), SECOND)
    held = threads.get("t")
    assert held is not None and held.view.erased and newest(held.view) is None


def test_writes_wait_for_their_put_only_when_newer_than_the_newest_held() -> None:
    threads = HeldThreads()
    assert not threads.before_newest("t", "", "02")  # not held
    threads.install("t", None, PARTITION, thread.NEW, applied=0, end=0)
    threads.acked("t", PARTITION, (0,), FIRST)
    assert threads.before_newest("t", "", "02")
    assert not threads.before_newest("t", "", "01")


def test_a_tail_of_own_records_decides_by_offsets_but_not_for_the_threads_records_held_anew() -> None:
    threads = HeldThreads()
    threads.install("t", None, PARTITION, thread.NEW, applied=0, end=10)
    threads.acked("t", PARTITION, (10,), FIRST)
    threads.acked("u", PARTITION, (11,), FIRST)  # another thread's record, also this process's
    snapshot = threads.get("t")
    assert snapshot is not None
    assert threads.unchanged_by_others("t", snapshot, end=12)
    assert not threads.unchanged_by_others("t", snapshot, end=13)  # 12: another process's record
    threads.forget("t")
    threads.acked("t", PARTITION, (12,), SECOND)  # the thread's, but held anew: not in the snapshot
    assert not threads.unchanged_by_others("t", snapshot, end=13)


def test_a_look_at_the_log_starts_past_the_own_records_its_offsets_clear() -> None:
    threads = HeldThreads()
    threads.install("t", None, PARTITION, thread.NEW, applied=0, end=10)
    threads.acked("t", PARTITION, (10,), FIRST)
    threads.acked("u", PARTITION, (11,), FIRST)  # another thread's, this process's: cleared too
    snapshot = threads.get("t")
    assert snapshot is not None
    assert threads.first_unknown("t", snapshot) == 12  # the log most likely ends there
    assert threads.first_unknown("t", snapshot, end=11) == 11
    threads.forget("t")
    threads.acked("t", PARTITION, (12,), SECOND)  # the thread's, held anew: the snapshot must look at it
    threads.acked("u", PARTITION, (13,), SECOND)
    assert threads.first_unknown("t", snapshot) == 12


def test_a_chunked_own_event_is_settled_only_when_nothing_lies_between_its_chunks() -> None:
    """Every reader completes a chunked event at its last chunk: another writer's record between its chunks
    comes before it, which the process's own records cannot rule out."""
    threads = HeldThreads()
    threads.install("t", None, PARTITION, thread.NEW, applied=0, end=5)
    decided = threads.acked("t", PARTITION, (5, 6, 7), FIRST)
    assert decided is not None and decided.settled and decided.at == 7
    decided = threads.acked("t", PARTITION, (8, 10), SECOND)  # offset 9 is no record of this process
    assert decided is not None and not decided.settled and decided.unknown == 8
