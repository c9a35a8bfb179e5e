"""The client's refresh-on-read coalescing (`store_refresh_coalesce_s`): one refresh per item per window,
over a bounded number of items. What a refresh does to an item is `integration/test_retention.py`."""

from __future__ import annotations

from graphledger.client.refresh import RefreshCoalescer


def test_the_refresh_coalescer_passes_one_refresh_per_item_per_window() -> None:
    coalescer = RefreshCoalescer(3600)
    a, b = (("ns",), "a"), (("ns",), "b")
    assert coalescer.due([a, a, b]) == [a, b]
    assert coalescer.due([a, b]) == []
    assert RefreshCoalescer(0).due([a]) == [a]
    bounded = RefreshCoalescer(3600, max_items=1)
    assert bounded.due([a]) == [a] and bounded.due([b]) == [b] and bounded.due([a]) == [a]  # a was forgotten
