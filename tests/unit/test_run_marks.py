"""A LangGraph run's mark (`client/ownership.py`) is the one-writer rule's state of the thread as of the mark's
`through`, taken from what the run's read answered from: the writer decides its writes' verdicts from it,
replaying the log's records from `through` by their headers (`window_verdict`), so a mark holding a record at or
past `through` replays that record out of its place in the log.

Here this process's own put (another run's) is acknowledged while the read waits, for the read API or for its
look at the log (the model-based test, `tests/acceptance/test_model_based.py`, races the same between
processes). It lands behind another process's put, which the read's answer (as of the log's end it learned)
does not hold, and the rule refuses it. The process folds it onto what it holds, a guess its next look at the log
corrects: an answer or a mark taken from that would give the refused put as the thread's newest checkpoint and
its lead, and the writer would count the run's next put, which expects it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest
from aiokafka import TopicPartition
from opentelemetry.context import Context

from checkpoint_builders import FIRST, newest, put
from graphledger import KafkaSaver, Settings, ownership
from graphledger.answers import Basis
from graphledger.client.ownership import RUNTIME_KEY, IntentNames
from graphledger.client.thread_reads import ThreadReads
from graphledger.errors import ThreadWriteRefusedError
from graphledger.events import envelope, to_envelope
from graphledger.events.checkpoint import CheckpointPut
from graphledger.folds import thread
from graphledger.log.records import LogRecord, Tail
from graphledger.ownership import Counted, Intent, Ledger, Refused, Verdict

PARTITION = 3
END = 4
"""Where the log ended when the read learned its end: the answer holds the records below (checkpoint 01, the
lead)."""
KEY = b"t"
NAMES = IntentNames(None, "t")
BASIS = Basis(0, NAMES.checkpoint("01"), "run-1")
"""The rule's state below END."""


def _protected(event: CheckpointPut, expects: str, writer: bytes) -> CheckpointPut:
    intent = Intent(NAMES.namespace(""), NAMES.checkpoint(event.checkpoint_id), NAMES.checkpoint(expects), 0, writer)
    return dataclasses.replace(event, intent=intent.header())


def _record(offset: int, event: CheckpointPut) -> LogRecord:
    env = to_envelope(event)
    return LogRecord("topic", PARTITION, offset, KEY, envelope.encode(env), tuple(envelope.headers_for(env)))


OTHERS = _protected(put("03", "01", {}, {}, {}), "01", b"o" * 8)
"""Another process's run's put, at END: it read checkpoint 01, and counts."""
MINE = _protected(put("02", "01", {}, {}, {}), "01", b"m" * 8)
"""This process's other run's put, at END + 1: it read checkpoint 01 too, and the rule refuses it."""


class _Log:
    """The thread's partition (`LogTail`'s calls the client makes): the records at END and END + 1 (the first
    look sees the log end at END, and this process's put is acknowledged while it waits), then whatever the
    client publishes."""

    def __init__(self, ack: Any) -> None:
        self.records = [_record(END, OTHERS), _record(END + 1, MINE)]
        self._ack: Any = ack

    def note_end(self, tp: TopicPartition, end: int) -> None:
        pass

    async def tails(self, starts: Mapping[TopicPartition, int], timeout_s: float) -> dict[TopicPartition, Tail]:
        if self._ack is not None:
            self._ack, ack = None, self._ack
            ack()
            return {tp: Tail(start, END, ()) for tp, start in starts.items()}
        end = END + len(self.records)
        return {tp: Tail(s, end, tuple(r for r in self.records if r.offset >= s)) for tp, s in starts.items()}


def _saver(read_by: str) -> tuple[KafkaSaver, _Log]:
    """A saver whose reads and writes run here: the read API answers as of END by hand, or the thread is held
    and the read looks at the log. While the read waits, this process's other run's put is acknowledged."""
    saver = KafkaSaver(Settings())
    runtime = saver._runtime
    threads = runtime.threads
    answer = newest(thread.apply(thread.NEW, FIRST))

    def ack() -> None:
        threads.acked("t", PARTITION, (END + 1,), MINE)

    async def read(path: str, body: dict[str, Any], headers: Any) -> dict[str, Any]:
        ack()
        wire = {"log_partition": PARTITION, "log_end": END, "tuple": answer, "namespaces": [""]}
        return {**wire, "basis": BASIS.to_wire()}

    log = _Log(ack if read_by == "log" else None)
    if read_by == "log":  # held as of END - 2: the look at the log finds other threads' records since
        held = thread.from_answer("", answer, [""], {}, basis=BASIS)
        threads.install("t", None, PARTITION, held, END - 2, END - 2)

    async def publish(topic: str, key: str | None, event: envelope.Envelope, **kwargs: Any) -> list[Any]:
        offset = END + len(log.records)
        headers = tuple(envelope.headers_for(event))
        log.records.append(LogRecord(topic, PARTITION, offset, key.encode() if key else None, b"", headers))
        return [(topic, PARTITION, offset)]

    runtime.publisher.publish = publish  # type: ignore[method-assign]
    tail: Any = log  # answers the `LogTail` calls the client makes
    runtime.log = tail
    key, erased, denied = (lambda t: KEY), (lambda t: None), (lambda: None)
    runtime.thread_reads = ThreadReads(threads, "topic", read, lambda: tail, key, 1.0, erased, denied)
    return saver, log


def _rule(records: list[LogRecord]) -> list[Verdict]:
    """The rule's verdict of each put among `records`, in log order, from its state below END."""
    assert BASIS.lead is not None
    ledger: Ledger[bytes] = Ledger(BASIS.operations, {NAMES.namespace(""): BASIS.lead})
    verdicts = []
    for record in records:
        intent = Intent.parse(envelope.header(record.headers, envelope.HEADER_INTENT) or b"")
        ledger, verdict = ownership.put(ledger, intent.namespace, intent)
        verdicts.append(verdict)
    return verdicts


@pytest.mark.parametrize("read_by", ["read_api", "log"])
async def test_a_run_reads_and_is_marked_with_what_its_read_found_not_an_own_put_acknowledged_meanwhile(
    read_by: str,
) -> None:
    saver, log = _saver(read_by)
    runtime = saver._runtime
    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": "", RUNTIME_KEY: object()}}
    answer, run = await saver._get(config)
    assert answer is not None and answer["config"]["checkpoint_id"] == "01"  # as of END: 02 came after 03
    assert run is not None
    assert run.marks[("t", "")].lead == BASIS.lead  # the rule's lead below the mark's through

    # The run's next step, on top of 01. In the log 03 leads: the rule refuses it, and so must its writer.
    with pytest.raises(ThreadWriteRefusedError, match="superseded"):
        await runtime._publish(saver.settings.checkpoint_topic, put("04", "01", {}, {}, {}), Context(), config)
    assert runtime.verdicts == {"refused": 1}
    assert [type(v) for v in _rule(log.records)] == [Counted, Refused, Refused]
