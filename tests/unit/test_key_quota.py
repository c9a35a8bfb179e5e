"""The data keys one token may create (`api/key_quota.py`): a full bucket at first, refilled at the
per-minute rate, per token; a request beyond it creates nothing and learns when to retry."""

from __future__ import annotations

import math

from graphledger_server.api.key_quota import KeyCreationQuota
from manual_clock import ManualClock


def test_a_token_creates_its_minute_at_once_then_at_the_rate() -> None:
    clock = ManualClock()
    quota = KeyCreationQuota(60, clock)  # one a second
    assert quota.take(b"a", 60) is None
    assert quota.take(b"a", 1) == 1.0  # empty: one more in a second
    assert quota.take(b"a", 3) == 3.0  # a refused request spends nothing
    clock.now += 3
    assert quota.take(b"a", 3) is None
    assert quota.take(b"a", 0) is None and quota.take(b"a", 1) is not None
    clock.now += 3600
    assert quota.take(b"a", 61) == math.inf  # more than a full bucket: never
    assert quota.take(b"a", 60) is None  # refilled to the capacity, not beyond


def test_each_token_has_its_own_bucket() -> None:
    quota = KeyCreationQuota(10, ManualClock())
    assert quota.take(b"a", 10) is None
    assert quota.take(b"a", 1) is not None
    assert quota.take(b"b", 10) is None
