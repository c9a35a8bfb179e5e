"""`ThreadReads` folds each of another process's records once: a look at the log holds the thread as of the end
its tail reports, while the tail's scan may bring records past that end (a later fetch of the scan reads on as
the log grows). Folded then, and again by the next look, which starts at that end, a put without an intent (a
direct `aput`, a run whose read set no mark) counts two operations: the process's rule state runs ahead of the
projection's, and a run marked from it writes at an operation count the log never had, which the rule refuses
while its writer, deciding from that state, counts it (the model-based test, `tests/acceptance/
test_model_based.py`, found it so).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiokafka import TopicPartition

from checkpoint_builders import FIRST, SECOND, newest, put
from graphledger.answers import Basis
from graphledger.client.others_records import Opening
from graphledger.client.thread_reads import ThreadReads
from graphledger.client.threads import HeldThreads
from graphledger.events import envelope, to_envelope
from graphledger.events.checkpoint import CheckpointPut
from graphledger.folds import thread
from graphledger.log.records import LogRecord, Tail

PARTITION = 3
KEY = b"t"
THIRD = put("03", "02", {"msgs": ["a"], "n": 3}, {"msgs": "1", "n": "3"}, {"n": "3"})


def _record(offset: int, event: CheckpointPut) -> LogRecord:
    env = to_envelope(event)
    headers = tuple(envelope.headers_for(env))
    return LogRecord("topic", PARTITION, offset, KEY, envelope.encode(env), headers, 1_767_225_600_000)


class _Log:
    """Two looks at the log: the first learns the end 11 and its scan brings the record at 11 too; the second
    learns the end 12."""

    def __init__(self) -> None:
        self.tails_answered = [
            Tail(10, 11, (_record(10, SECOND), _record(11, THIRD))),
            Tail(11, 12, (_record(11, THIRD),)),
        ]

    async def tails(self, starts: Mapping[TopicPartition, int], timeout_s: float) -> dict[TopicPartition, Tail]:
        tail = self.tails_answered.pop(0)
        assert all(start == tail.start for start in starts.values())
        return dict.fromkeys(starts, tail)


async def test_a_record_past_the_end_a_look_reports_is_folded_once_by_the_next_look() -> None:
    threads = HeldThreads()
    held = thread.from_answer("", newest(thread.apply(thread.NEW, FIRST)), [""], {}, basis=Basis(0))
    threads.install("t", None, PARTITION, held, 10, 10)
    log: Any = _Log()  # answers the `LogTail` calls the client makes

    async def no_read_api(path: str, body: dict[str, Any], headers: Any) -> Any:
        raise AssertionError(f"the looks at the log answer: {reads.fell_back}")

    opening = Opening(lambda ref, key_id: None, "", False)
    key, erased, denied = (lambda t: KEY), (lambda t: None), (lambda: None)
    reads = ThreadReads(threads, "topic", no_read_api, lambda: log, key, 1.0, erased, denied, opening=opening)
    answers = [(await reads.get("t", "", None)).answer for _ in range(2)]
    current = threads.peek("t")
    assert current is not None and current.through == 12
    # Two puts without an intent, two operations, as the projection counts them.
    assert current.view.ledger is not None and current.view.ledger.operations == 2
    assert [a["config"]["checkpoint_id"] for a in answers if a is not None] == ["02", "03"]
    assert reads.answered == {"folded": 2}
