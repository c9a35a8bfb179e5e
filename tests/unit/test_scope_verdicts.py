"""The read API remembers whether a search scope is large for a bounded time and number of scopes."""

from __future__ import annotations

from graphledger_server.api.reads.scope_verdicts import ScopeVerdicts, scope_key
from manual_clock import ManualClock


def test_a_verdict_lasts_its_ttl_then_is_counted_again() -> None:
    clock = ManualClock(0.0)
    verdicts = ScopeVerdicts(ttl_s=10.0, clock=clock)
    key = scope_key(["users", "u1"], None)
    assert verdicts.get(key) is None
    verdicts.put(key, False)
    clock.now = 9.9
    assert verdicts.get(key) is False
    clock.now = 10.0
    assert verdicts.get(key) is None


def test_filters_are_keyed_by_content_not_key_order() -> None:
    verdicts = ScopeVerdicts()
    verdicts.put(scope_key(["docs"], {"a": 1, "b": {"$gt": 2}}), True)
    assert verdicts.get(scope_key(["docs"], {"b": {"$gt": 2}, "a": 1})) is True
    assert verdicts.get(scope_key(["docs"], {"a": 1})) is None
    assert verdicts.get(scope_key(["docs"], None)) is None
    assert verdicts.get(scope_key(["docs", "a"], {"a": 1, "b": {"$gt": 2}})) is None


def test_the_least_recently_set_verdict_goes_first() -> None:
    verdicts = ScopeVerdicts(max_entries=2)
    first, second, third = (scope_key([name], None) for name in ("a", "b", "c"))
    verdicts.put(first, True)
    verdicts.put(second, True)
    verdicts.put(first, True)  # set again: now the newest
    verdicts.put(third, False)
    assert verdicts.get(second) is None
    assert verdicts.get(first) is True
    assert verdicts.get(third) is False
