"""`ThreadReads` with a read API answering by hand: a read never folds onto the read API's answer this
process's own records acknowledged while the read API answered. The answer reflects the log only below
its end, and another process's record may lie between (the model-based test's `reads_racing_own_writes`,
`tests/acceptance/test_model_based.py`, races the same in processes).

Folded anyway, an own record would give a checkpoint or writes of its own without another process's
delete, put or writes before them in the log (no log prefix answers that), or raise `thread.Underivable`
to the caller when it cannot be folded at all.
"""

from __future__ import annotations

from typing import Any

from checkpoint_builders import FIRST, SECOND, newest, put
from graphledger.client.thread_reads import ThreadReads
from graphledger.client.threads import HeldThreads
from graphledger.folds import thread

PARTITION = 3
END = 4
"""Where the log ended when the read API read: it answers for the records below."""


def _reads(threads: HeldThreads, on_read: Any) -> ThreadReads:
    async def read(path: str, body: dict[str, Any], headers: Any) -> dict[str, Any]:
        on_read()  # while the read API answers, this process's next write is acknowledged at END + 1
        return {
            "log_partition": PARTITION,
            "log_end": END,
            "own_writes_from": END,
            "tuple": newest(thread.apply(thread.NEW, FIRST)),
            "namespaces": [""],
        }

    return ThreadReads(threads, "topic", read, lambda: None, lambda t: b"k", 1.0, lambda t: None, lambda: None)


def _held() -> HeldThreads:
    threads = HeldThreads()
    threads.install("t", None, PARTITION, thread.from_answer("", newest(thread.apply(thread.NEW, FIRST)), [""]), 0, END)
    return threads


async def test_an_answer_leaves_out_own_records_past_its_log_end() -> None:
    # Another process's put of checkpoint 03 lands at END, this process's put of 02 at END + 1: an answer
    # holding 02 must hold 03 too, which is the newest then. The read API answered as of END (01).
    threads = _held()
    reads = _reads(threads, lambda: threads.acked("t", PARTITION, (END + 1,), SECOND))
    answer = (await reads.get("t", "", None)).answer
    assert answer is not None and answer["config"]["checkpoint_id"] == "01"  # it answers 02


async def test_an_own_record_past_the_log_end_never_fails_the_read() -> None:
    # This process's put acknowledged during the read forks from a checkpoint the fold never saw.
    fork = put("05", "04", {}, {"other": "9"}, {})
    threads = _held()
    reads = _reads(threads, lambda: threads.acked("t", PARTITION, (END + 1,), fork))
    answer = (await reads.get("t", "", None)).answer  # raises thread.Underivable
    assert answer is not None and answer["config"]["checkpoint_id"] == "01"
