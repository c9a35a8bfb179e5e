"""A writer's verdict of its own write from the log's headers (`client/ownership.window_verdict`): what it
cannot open (another writer's sealed put, an older writer's prune) it takes as what would refuse, and nothing
else: a `runs.delete` refuses only a run whose lead it may name, a prune only when its `gl-operation` header
(checked against its payload by every reader that opens it) does not say it keeps the latest."""

from __future__ import annotations

import dataclasses
import random

import pytest

from graphledger.client.ownership import FROM_HEADERS, IntentNames, Mark, window_start, window_verdict
from graphledger.errors import InvalidEventError
from graphledger.events import envelope, to_envelope
from graphledger.events.checkpoint import RunsDelete, ThreadPrune
from graphledger.log.records import LogRecord
from graphledger.opening.records import check_clear_headers
from graphledger.ownership import NO_CHECKPOINT, Counted, Intent, Refused

KEY = b"thread-key"
NAMES = IntentNames(None, "t")
WRITER, OTHER = b"w" * 8, b"o" * 8


def _mark(lead: str | None = "c1", lead_run: str | None = None) -> Mark:
    expects = NAMES.checkpoint(lead) if lead is not None else NO_CHECKPOINT
    lead_hash = NAMES.checkpoint(lead) if lead is not None else None
    return Mark("t", "", 0, 10, lead_hash, lead_run, None, 0, expects, lead, WRITER)


def _put(offset: int, checkpoint: str, expects: str | None, writer: bytes) -> LogRecord:
    intent = Intent(NAMES.namespace(""), NAMES.checkpoint(checkpoint),
                    NAMES.checkpoint(expects) if expects else NO_CHECKPOINT, 0, writer)  # fmt: skip
    headers = ((envelope.HEADER_TYPE, b"checkpoint.put"), (envelope.HEADER_INTENT, intent.header()))
    return LogRecord("checkpoints", 0, offset, KEY, b"", headers)


def _runs_delete(offset: int, *run_ids: str) -> LogRecord:
    env = to_envelope(RunsDelete(run_ids=tuple(run_ids)))
    return LogRecord("checkpoints", 0, offset, None, envelope.encode(env), tuple(envelope.headers_for(env)))


def _prune(offset: int, operation: bytes | None = None) -> LogRecord:
    headers = [(envelope.HEADER_TYPE, b"thread.prune")]
    if operation is not None:
        headers.append((envelope.HEADER_OPERATION, operation))
    return LogRecord("checkpoints", 0, offset, KEY, b"", tuple(headers))


def test_a_runs_delete_cannot_name_a_lead_without_a_run_id() -> None:
    mark = _mark(lead="c1", lead_run=None)
    write = _put(12, "c2", "c1", WRITER)
    assert window_verdict(mark, NAMES, [_runs_delete(11, "run-1"), write], KEY, write) == Counted()


def test_a_runs_delete_refuses_a_run_whose_own_lead_it_names_and_no_other() -> None:
    mark = _mark(lead=None)
    mark.run_id = "run-1"  # the run's own puts carry it
    own = _put(11, "c1", None, WRITER)
    write = _put(13, "c2", "c1", WRITER)
    assert window_verdict(mark, NAMES, [own, _runs_delete(12, "run-2"), write], KEY, write) == Counted()
    refused = window_verdict(mark, NAMES, [own, _runs_delete(12, "run-1"), write], KEY, write)
    assert isinstance(refused, Refused) and refused.reason.endswith(FROM_HEADERS)


def test_a_prune_is_an_operation_unless_its_header_says_it_keeps_the_latest() -> None:
    mark = _mark(lead="c1")
    write = _put(13, "c2", "c1", WRITER)
    assert window_verdict(mark, NAMES, [_prune(12, b"0"), write], KEY, write) == Counted()
    assert isinstance(window_verdict(mark, NAMES, [_prune(12, b"1"), write], KEY, write), Refused)


@pytest.mark.parametrize(("strategy", "operation"), [("delete", b"1"), ("keep_latest", b"0")])
def test_a_prunes_operation_header_is_its_strategy_and_a_record_saying_otherwise_is_refused(
    strategy: str, operation: bytes
) -> None:
    prune = ThreadPrune(thread_id="t", strategy=strategy)
    headers = envelope.headers_for(to_envelope(prune))
    assert envelope.header(headers, envelope.HEADER_OPERATION) == operation
    check_clear_headers(headers, prune)
    lying = [(k, b"0" if v == b"1" else b"1") if k == envelope.HEADER_OPERATION else (k, v) for k, v in headers]
    with pytest.raises(InvalidEventError, match=envelope.HEADER_OPERATION):
        check_clear_headers(lying, prune)
    check_clear_headers([h for h in headers if h[0] != envelope.HEADER_OPERATION], prune)  # an older writer's


def test_another_writers_put_supersedes_and_a_prune_whose_strategy_is_sealed_counts_as_an_operation() -> None:
    mark = _mark(lead="c1")
    write = _put(13, "c3", "c1", WRITER)
    superseded = window_verdict(mark, NAMES, [_put(11, "c2", "c1", OTHER), write], KEY, write)
    assert isinstance(superseded, Refused) and superseded.superseded_by == NAMES.checkpoint("c2")
    changed = window_verdict(mark, NAMES, [_prune(12), write], KEY, write)
    assert isinstance(changed, Refused) and "changed" in changed.reason


def _chunk(record: LogRecord, index: int, count: int, offset: int) -> LogRecord:
    chunk = (envelope.HEADER_CHUNK, f"event:{index}:{count}".encode())
    return dataclasses.replace(record, offset=offset, headers=(*record.headers, chunk))


def test_a_chunked_put_takes_its_place_in_the_log_at_its_last_chunk() -> None:
    """As the projector completes it: another writer's put whose last chunk lands after the run's write comes
    after it, and the run's own chunked put comes after another writer's record between its chunks."""
    mark = _mark(lead="c1")
    other = _put(0, "c2", "c1", OTHER)
    own = _put(0, "c3", "c1", WRITER)
    write = _chunk(own, 1, 2, 13)
    straddling = [_chunk(other, 0, 2, 11), _chunk(own, 0, 2, 12), write, _chunk(other, 1, 2, 14)]
    assert window_verdict(mark, NAMES, straddling, KEY, write) == Counted()
    between = [_chunk(own, 0, 2, 11), _chunk(other, 0, 2, 12), _chunk(other, 1, 2, 13), _chunk(own, 1, 2, 14)]
    refused = window_verdict(_mark(lead="c1"), NAMES, between, KEY, between[-1])  # another log: a fresh run
    assert isinstance(refused, Refused) and refused.superseded_by == NAMES.checkpoint("c2")


@pytest.mark.parametrize("seed", range(20))
def test_a_scan_from_the_runs_last_counted_write_decides_as_a_scan_from_its_read(seed: int) -> None:
    """Each verdict moves the mark's scan past its counted write; the next write's verdict, scanned from there,
    is the verdict a scan from the run's read gives."""
    rng = random.Random(seed)
    mark = _mark(lead="c1")
    mark.run_id = "run-1"
    records: list[LogRecord] = []
    expects, offset = "c1", mark.through
    for step in range(30):
        offset += 1
        roll = rng.random()
        if roll < 0.15:
            records.append(_put(offset, f"o{step}", rng.choice([expects, "c1"]), OTHER))
        elif roll < 0.2:
            records.append(_prune(offset, rng.choice([b"0", b"1"])))
        elif roll < 0.25:
            records.append(_runs_delete(offset, rng.choice(["run-1", "run-2"])))
        else:
            write = _put(offset, f"c{step + 2}", expects, WRITER)
            records.append(write)
            from_read = window_verdict(dataclasses.replace(mark, scanned=None), NAMES, records, KEY, write)
            assert window_verdict(mark, NAMES, records, KEY, write) == from_read, f"seed {seed}, step {step}"
            if isinstance(from_read, Refused):
                assert mark.scanned is None or mark.scanned.through <= write.offset
                return
            assert mark.scanned is not None and mark.scanned.through == write.offset + 1
            expects = f"c{step + 2}"


def test_a_write_below_the_runs_last_scanned_one_is_scanned_from_the_read() -> None:
    """Verdicts run concurrently: one of a write below the one a scan went past starts at the read again."""
    mark = _mark(lead="c1")
    later = _put(14, "c2", "c1", WRITER)
    assert window_verdict(mark, NAMES, [later], KEY, later) == Counted()
    assert window_start(mark, NAMES, 15).through == 15
    assert window_start(mark, NAMES, 12).through == mark.through
    earlier = _put(12, "c2", "c1", WRITER)
    assert window_verdict(mark, NAMES, [earlier, later], KEY, earlier) == Counted()
    assert mark.scanned is not None and mark.scanned.through == 15
