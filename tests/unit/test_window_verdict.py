"""A writer's verdict of its own write from the log's headers (`client/ownership.window_verdict`): what it
cannot open (another writer's sealed put, a prune's strategy) it takes as what would refuse, and nothing
else: a `runs.delete` refuses only a run whose lead it may name."""

from __future__ import annotations

from graphledger.client.ownership import FROM_HEADERS, IntentNames, Mark, window_verdict
from graphledger.events import envelope, to_envelope
from graphledger.events.checkpoint import RunsDelete
from graphledger.log.records import LogRecord
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


def _prune(offset: int) -> LogRecord:
    return LogRecord("checkpoints", 0, offset, KEY, b"", ((envelope.HEADER_TYPE, b"thread.prune"),))


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


def test_another_writers_put_supersedes_and_a_prune_whose_strategy_is_sealed_counts_as_an_operation() -> None:
    mark = _mark(lead="c1")
    write = _put(13, "c3", "c1", WRITER)
    superseded = window_verdict(mark, NAMES, [_put(11, "c2", "c1", OTHER), write], KEY, write)
    assert isinstance(superseded, Refused) and superseded.superseded_by == NAMES.checkpoint("c2")
    changed = window_verdict(mark, NAMES, [_prune(12), write], KEY, write)
    assert isinstance(changed, Refused) and "changed" in changed.reason
