"""Fork detection: a put whose parent is not its thread namespace's newest checkpoint."""

from __future__ import annotations

from graphledger_server.projection.checkpoint_plan import Put, find_forks


def _put(cid: str, parent: str | None, thread: str = "t", ns: str = "", offset: int = 0) -> Put:
    return Put(thread, ns, cid, parent, "cp", 0, offset)


def test_a_chain_has_no_fork_and_a_second_child_of_one_parent_is_one() -> None:
    chain = [_put("01", None), _put("02", "01"), _put("03", "02")]
    assert find_forks(chain, {}) == []
    forks = find_forks([*chain, _put("04", "02", offset=9)], {})
    assert [(f.put.checkpoint_id, f.newest_checkpoint_id, f.put.offset) for f in forks] == [("04", "03", 9)]


def test_the_newest_before_the_batch_counts_and_namespaces_are_apart() -> None:
    newest = {("t", ""): "05", ("t", "child:1"): None}
    puts = [_put("06", "05"), _put("01", None, ns="child:1"), _put("07", "02")]
    assert [f.put.checkpoint_id for f in find_forks(puts, newest)] == ["07"]


def test_a_second_first_checkpoint_is_a_fork_and_a_repeated_put_is_not() -> None:
    assert [f.put.checkpoint_id for f in find_forks([_put("02", None)], {("t", ""): "01"})] == ["02"]
    assert find_forks([_put("01", None)], {("t", ""): "01"}) == []


def test_the_newest_is_the_greatest_id_as_the_official_saver_orders_them() -> None:
    # A writer whose clock runs behind puts a smaller id; the newest stays the greater one.
    puts = [_put("09", "08"), _put("05", "09"), _put("10", "09")]
    assert find_forks(puts, {("t", ""): "08"}) == []


def test_a_fork_is_a_branch_when_its_writer_asked_for_it() -> None:
    """A protected put (a run's time travel) and `update_state`'s put (made outside any run) branch on
    purpose; an unprotected put of a run does not."""
    newest = {("t", ""): "05"}
    run_put = Put("t", "", "06", "02", "cp", 0, 1, metadata_json=b'{"source":"loop","step":3}')
    asked = [
        Put("t", "", "06", "02", "cp", 0, 1, protected=True),
        Put("t", "", "06", "02", "cp", 0, 1, metadata_json=b'{"source":"update","step":3}'),
        Put("t", "", "06", "02", "cp", 0, 1, metadata_json=b'{"source":"fork","step":3}'),
    ]
    assert [f.kind for put in asked for f in find_forks([put], newest)] == ["branch"] * 3
    assert [f.kind for f in find_forks([run_put], newest)] == ["fork"]
    assert [f.kind for f in find_forks([_put("06", "02")], newest)] == ["fork"]
