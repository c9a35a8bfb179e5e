"""Fair shares of the consistency wait slots (`api/consistency/wait_slots.py`): a tenant holding all it may never
stops another tenant's read; the total never exceeds the limit; a single tenant uses every slot."""

from __future__ import annotations

from contextlib import ExitStack

import pytest

from graphledger_server.api.consistency.wait_slots import WaitSlots, WaitSlotsFull


def fill(slots: WaitSlots, tenant: str, stack: ExitStack) -> int:
    """Take slots for `tenant` until refused; how many it got."""
    taken = 0
    while True:
        try:
            stack.enter_context(slots.slot(tenant))
        except WaitSlotsFull:
            return taken
        taken += 1


def test_a_tenant_holding_all_its_share_leaves_as_many_for_the_others() -> None:
    slots = WaitSlots(limit=10, tenants=3)
    with ExitStack() as stack:
        assert fill(slots, "greedy", stack) == 5
        with slots.slot("victim"):  # its read waits like any other
            assert slots.taken_by("victim") == 1
        assert fill(slots, "victim", stack) == 3  # then 5 + 3 held, 2 free
        assert fill(slots, "third", stack) == 1
        assert slots.waiting == 9 <= slots.limit
    assert slots.waiting == 0 and slots.taken_by("greedy") == 0


def test_tenants_that_keep_asking_settle_at_equal_shares_with_one_share_free() -> None:
    """Each round every tenant asks until refused, then the oldest wait of each ends: the slots freed go
    to whoever holds fewest, until k tenants hold about limit/(k+1) each."""
    slots = WaitSlots(limit=30, tenants=3)
    held: dict[str, list[ExitStack]] = {"a": [], "b": [], "c": []}
    for round_ in range(50):
        order = list(held)[round_ % 3 :] + list(held)[: round_ % 3]  # nobody always asks first
        for tenant in order:
            while True:
                stack = ExitStack()
                try:
                    stack.enter_context(slots.slot(tenant))
                except WaitSlotsFull:
                    break
                held[tenant].append(stack)
        shares = [slots.taken_by(t) for t in held]
        for stacks in held.values():
            stacks.pop(0).close()
    assert max(shares) - min(shares) <= 1 and all(abs(share - 30 / 4) <= 1.5 for share in shares), shares
    assert slots.limit - sum(shares) >= min(shares)  # a share stays free for a tenant holding none


def test_one_tenant_uses_every_slot_and_nobody_exceeds_the_limit() -> None:
    slots = WaitSlots(limit=4, tenants=1)
    with ExitStack() as stack:
        assert fill(slots, "", stack) == 4
        with pytest.raises(WaitSlotsFull):
            stack.enter_context(slots.slot("other"))
