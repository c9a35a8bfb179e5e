"""The replay's checks before it reads anything: a log that lost records is refused unless the loss is
accepted, and the rebuild schema's name fits Postgres. The rebuild itself is `integration/test_replay.py`."""

from __future__ import annotations

import pytest

from graphledger.errors import LossRefusedError
from graphledger_server.replay import schemas
from graphledger_server.replay.preflight import SourceTopic, refuse_losses


def test_refuses_a_log_whose_earliest_offset_is_above_zero() -> None:
    # tansu cannot delete records (no DeleteRecords), so the broker-side facts are given here.
    topics = [
        SourceTopic("p.checkpoints", {"retention.ms": "-1"}, {0: 0, 1: 7}),
        SourceTopic("p.store", {"retention.ms": "-1", "cleanup.policy": "delete"}, {0: 0}),
    ]
    with pytest.raises(LossRefusedError, match=r"partition p.checkpoints:1 starts at offset 7: offsets 0..6 are gone"):
        refuse_losses(topics, accept_loss=False)
    assert refuse_losses(topics, accept_loss=True) == [
        "partition p.checkpoints:1 starts at offset 7: offsets 0..6 are gone"
    ]
    compacted = [SourceTopic("p.store", {"cleanup.policy": "compact"}, {0: 0})]
    with pytest.raises(LossRefusedError, match="compaction"):
        refuse_losses(compacted, accept_loss=False)
    assert refuse_losses([SourceTopic("p.store", None, {0: 0})], accept_loss=False) == []


def test_schema_names_fit_postgres() -> None:
    assert schemas.rebuild_name("graphledger") == "graphledger_rebuild"
    with pytest.raises(Exception, match="63-character"):
        schemas.rebuild_name("x" * 60)
