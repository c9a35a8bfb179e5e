"""Consistency tokens: a thread read waits for this client's writes to that thread, never less."""

from __future__ import annotations

from graphledger.client.tokens import ConsistencyTokens


def test_a_thread_read_waits_for_its_own_writes_and_broadcasts_only() -> None:
    tokens = ConsistencyTokens()
    tokens.record([("cp", 0, 5)], ["a"])
    tokens.record([("cp", 1, 7)], ["b"])
    tokens.record([("cp", 0, 9), ("cp", 1, 9)], None)  # a broadcast such as delete_for_runs
    tokens.record([("cp", 0, 11)], ["a"])
    assert tokens.for_scope("a") == {("cp", 0): 11, ("cp", 1): 9}
    assert tokens.for_scope("b") == {("cp", 0): 9, ("cp", 1): 9}
    assert tokens.for_scope("never-written") == {("cp", 0): 9, ("cp", 1): 9}
    assert tokens.for_scope(None) == {("cp", 0): 11, ("cp", 1): 9}


def test_a_copy_scopes_source_and_target() -> None:
    tokens = ConsistencyTokens()
    tokens.record([("cp", 2, 3)], ["source", "target"])
    assert tokens.for_scope("target") == {("cp", 2): 3}


def test_an_evicted_thread_falls_back_to_the_client_wide_token() -> None:
    tokens = ConsistencyTokens(max_scopes=2)
    tokens.record([("cp", 0, 1)], ["a"])
    tokens.record([("cp", 1, 2)], ["b"])
    tokens.record([("cp", 2, 3)], ["c"])  # evicts "a"
    assert tokens.for_scope("a") == {("cp", 0): 1, ("cp", 1): 2, ("cp", 2): 3}
    assert tokens.for_scope("c") == {("cp", 2): 3}
