"""How a split replay divides the partitions (`replay/shares.py`): disjoint, covering, the same in every process."""

from __future__ import annotations

import random

import pytest

from graphledger.errors import GraphledgerError
from graphledger_server.cli import main as cli_main
from graphledger_server.replay.shares import Share, Stall

PARTITIONS = [(topic, p) for topic in ("graphledger.checkpoints", "graphledger.store") for p in range(12)]


@pytest.mark.parametrize("count", [1, 2, 3, 5, 24, 30])
def test_the_shares_are_disjoint_and_cover_every_partition(count: int) -> None:
    shares = [Share(i, count).of(PARTITIONS) for i in range(count)]
    seen = [tp for share in shares for tp in share]
    assert sorted(seen) == sorted(PARTITIONS)
    assert len(seen) == len(set(seen))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1  # balanced to one partition


def test_every_process_computes_the_same_share_whatever_order_it_listed_the_partitions_in() -> None:
    shuffled = PARTITIONS[:]
    random.Random(7).shuffle(shuffled)
    assert Share(1, 3).of(shuffled) == Share(1, 3).of(PARTITIONS)
    assert Share(0, 2).of(PARTITIONS) == sorted(PARTITIONS)[0::2]


@pytest.mark.parametrize(
    ("index", "count", "wrong"), [(0, 0, "--workers"), (2, 2, "--worker-index"), (-1, 2, "--worker-index")]
)
def test_a_share_outside_its_count_is_refused_naming_the_option(index: int, count: int, wrong: str) -> None:
    with pytest.raises(GraphledgerError, match=wrong):
        Share(index, count)


def test_a_share_stalls_only_once_its_positions_stand_still_for_the_stall_time() -> None:
    stall = Stall(stall_s=0.0)
    assert not stall.stalled({("t", 0): 5})  # moved (from nothing)
    assert stall.stalled({("t", 0): 5})  # unchanged, and 0 s is the stall time
    assert not stall.stalled({("t", 0): 6})
    patient = Stall(stall_s=3600.0)
    assert not patient.stalled({("t", 0): 5})
    assert not patient.stalled({("t", 0): 5})


def test_an_indexed_job_pod_without_its_index_is_refused_naming_the_variable(monkeypatch, capsys) -> None:
    monkeypatch.delenv("JOB_COMPLETION_INDEX", raising=False)
    assert cli_main(["replay", "run", "--workers", "2", "--indexed-job", "--run-id", "r"]) == 1
    assert "JOB_COMPLETION_INDEX" in capsys.readouterr().err


def test_a_worker_index_beyond_the_workers_is_refused_before_anything_runs(monkeypatch, capsys) -> None:
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "3")
    assert cli_main(["replay", "run", "--workers", "3", "--indexed-job", "--run-id", "r"]) == 1
    assert "--worker-index must be from 0 to 2 for 3 workers, not 3" in capsys.readouterr().err
