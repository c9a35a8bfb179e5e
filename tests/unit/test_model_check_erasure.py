"""The model check's window around an erasure (`tests/model_check.py`): an erased thread may read erased,
and a copy may lose what it copied from the erased source, once the erase call has begun, and not before."""

from __future__ import annotations

from typing import Any

from model_check import History, Outcome
from model_ops import Op
from model_reference import ReferenceSaver

SOURCE, TARGET = "s", "t"


def _checkpoint(cid: str) -> dict[str, Any]:
    return {"v": 4, "id": cid, "ts": "2026-01-01T00:00:00+00:00", "channel_values": {},
            "channel_versions": {}, "versions_seen": {}, "updated_channels": None}  # fmt: skip


def _put(index: int, thread: str, cid: str) -> Op:
    args = {"thread": thread, "ns": "", "parent": None, "extra": {}, "checkpoint": _checkpoint(cid),
            "metadata": {}, "new_versions": {}}  # fmt: skip
    return Op(index, 0, "put", args)


def _history(read_at: tuple[float, float], answer_ids: list[str]) -> History:
    """S (partition 0) puts a; T (partition 1) puts b; S is copied onto T; S is erased from time 10
    (T with it, as a copy); a list of T runs at `read_at` and answers `answer_ids`."""
    ops = [
        _put(0, SOURCE, "a"),
        _put(1, TARGET, "b"),
        Op(2, 0, "copy_thread", {"source": SOURCE, "target": TARGET}),
        Op(3, 0, "erase", {"thread": SOURCE}),
        Op(4, 1, "list", {"thread": TARGET, "ns": None, "filter": None, "before": None, "limit": None}),
    ]
    tuples = [_tuple(cid) for cid in answer_ids]
    outcomes = {
        0: Outcome(True, 1.0, 2.0, [[(0, 0)]]),
        1: Outcome(True, 1.0, 2.0, [[(1, 0)]]),
        2: Outcome(True, 3.0, 4.0, [[(0, 1)], [(1, 1)]]),
        3: Outcome(True, 10.0, 20.0, []),
        4: Outcome(True, *read_at, [], tuples),
    }
    return History(ops, outcomes, [SOURCE, TARGET], {SOURCE: [(0, 2)], TARGET: [(1, 2)]})


def _tuple(cid: str) -> Any:
    reference = ReferenceSaver()
    config = {"configurable": {"thread_id": TARGET, "checkpoint_ns": ""}}
    reference.put(config, _checkpoint(cid), {}, {})
    return reference.get_tuple(config)


async def _violations(read_at: tuple[float, float], answer_ids: list[str]) -> int:
    history = _history(read_at, answer_ids)
    report = await history.check()
    assert not report.anomalies
    return len(report.violations)


async def test_a_copy_read_before_its_sources_erase_began_holds_what_it_copied() -> None:
    assert await _violations((5.0, 6.0), ["b", "a"]) == 0
    assert await _violations((5.0, 6.0), ["b"]) == 1


async def test_a_copy_read_while_its_sources_erase_runs_may_have_lost_what_it_copied() -> None:
    assert await _violations((12.0, 13.0), ["b", "a"]) == 0
    assert await _violations((12.0, 13.0), ["b"]) == 0
    assert await _violations((12.0, 13.0), []) == 0
    assert await _violations((12.0, 13.0), ["a"]) == 1


async def test_a_thread_may_read_erased_once_its_erase_began_though_later_writes_land_before_the_record() -> None:
    """The erase destroys the key first; a write begun after a read that saw the erasure lands before
    the `thread.erase` record (the model test's seed 865797764): the erasure took effect before both."""

    async def violations(read_at: tuple[float, float]) -> int:
        ops = [
            _put(0, SOURCE, "a"),
            Op(1, 0, "erase", {"thread": SOURCE}),
            Op(2, 1, "get_tuple", {"thread": SOURCE, "ns": "", "checkpoint_id": None}),
            _put(3, SOURCE, "c"),
        ]
        outcomes = {
            0: Outcome(True, 1.0, 2.0, [[(0, 0)]]),
            1: Outcome(True, 10.0, 20.0, []),
            2: Outcome(True, *read_at, [], None),
            3: Outcome(True, 14.0, 15.0, [[(0, 1)]]),
        }
        report = await History(ops, outcomes, [SOURCE], {SOURCE: [(0, 2)]}).check()
        assert not report.anomalies
        return len(report.violations)

    assert await violations((12.0, 13.0)) == 0
    assert await violations((5.0, 6.0)) == 1


async def test_a_copy_from_a_source_another_call_erases_may_be_hollow_once_that_call_began() -> None:
    """T holds copies of S and of U; the call erasing S erases T with it, another call erases U. Each
    copy may have copied nothing once the call erasing its source has begun (the model test's seed
    945543775: a read of T during both erasures answered T's own checkpoint alone)."""
    other = "u"

    async def violations(read_at: tuple[float, float], answer_ids: list[str]) -> int:
        ops = [
            _put(0, SOURCE, "a"),
            _put(1, other, "c"),
            _put(2, TARGET, "b"),
            Op(3, 0, "copy_thread", {"source": SOURCE, "target": TARGET}),
            Op(4, 0, "copy_thread", {"source": other, "target": TARGET}),
            Op(5, 0, "erase", {"thread": SOURCE}),
            Op(6, 1, "erase", {"thread": other}),
            Op(7, 1, "list", {"thread": TARGET, "ns": None, "filter": None, "before": None, "limit": None}),
        ]
        outcomes = {
            0: Outcome(True, 1.0, 2.0, [[(0, 0)]]),
            1: Outcome(True, 1.0, 2.0, [[(2, 0)]]),
            2: Outcome(True, 1.0, 2.0, [[(1, 0)]]),
            3: Outcome(True, 3.0, 4.0, [[(0, 1)], [(1, 1)]]),
            4: Outcome(True, 3.0, 4.0, [[(2, 1)], [(1, 2)]]),
            5: Outcome(True, 10.0, 20.0, []),
            6: Outcome(True, 12.0, 20.0, []),
            7: Outcome(True, *read_at, [], [_tuple(cid) for cid in answer_ids]),
        }
        erasures = {SOURCE: [(0, 2)], TARGET: [(1, 3)], other: [(2, 2)]}
        report = await History(ops, outcomes, [SOURCE, TARGET, other], erasures).check()
        assert not report.anomalies
        return len(report.violations)

    assert await violations((12.5, 13.0), ["c", "b", "a"]) == 0
    assert await violations((12.5, 13.0), ["b"]) == 0  # both copies hollow
    assert await violations((11.0, 11.5), ["c", "b"]) == 0  # S's copy hollow: its erase has begun
    assert await violations((11.0, 11.5), ["b"]) == 1  # U's erase had not begun


async def test_a_copy_of_an_empty_thread_made_before_its_erasure_may_be_erased_with_it() -> None:
    """The projector that meets the source's records erased cannot tell whether the copy copied anything,
    so it erases the copy with the source (docs/security.md, "Erase"; the model test's seed 325043049):
    no anomaly whether or not the target was erased, and once it was, a read during the call may answer
    it erased."""

    async def report(erasures: dict[str, list[tuple[int, int]]], answer_ids: list[str]) -> Any:
        ops = [
            _put(0, TARGET, "b"),
            Op(1, 0, "copy_thread", {"source": SOURCE, "target": TARGET}),
            Op(2, 0, "erase", {"thread": SOURCE}),
            Op(3, 1, "list", {"thread": TARGET, "ns": None, "filter": None, "before": None, "limit": None}),
        ]
        outcomes = {
            0: Outcome(True, 1.0, 2.0, [[(1, 0)]]),
            1: Outcome(True, 3.0, 4.0, [[(0, 0)], [(1, 1)]]),
            2: Outcome(True, 10.0, 20.0, []),
            3: Outcome(True, 12.0, 13.0, [], [_tuple(cid) for cid in answer_ids]),
        }
        return await History(ops, outcomes, [SOURCE, TARGET], erasures).check()

    spared = await report({SOURCE: [(0, 1)]}, ["b"])
    assert not spared.anomalies and not spared.violations
    erased = await report({SOURCE: [(0, 1)], TARGET: [(1, 2)]}, [])
    assert not erased.anomalies and not erased.violations
    assert (await report({SOURCE: [(0, 1)], TARGET: [(1, 2)]}, ["b"])).violations == []  # read before it applied
