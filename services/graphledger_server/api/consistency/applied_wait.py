"""Read-your-writes (invariant 5): hold a read until the projector has applied the client's token.

The wait is on the process's `AppliedOffsets` (`log/applied.py`), one watcher of `graphledger_offsets`
for every read. At most `api_max_consistency_waits` reads wait at once, shared fairly between tenants
(`wait_slots`); one more that would have to wait is a 503 with `Retry-After` at once, so a burst of
reads ahead of the projector cannot pile up without bound, and one tenant's cannot crowd out
another's. Postgres down is a 503 at once too: the projection cannot advance.
"""

from __future__ import annotations

import contextlib

from graphledger.settings import Settings
from graphledger.wire import Token
from graphledger_server.api.consistency.wait_slots import WaitSlots, WaitSlotsFull
from graphledger_server.api.errors import unavailable
from graphledger_server.log.applied import AppliedOffsets
from graphledger_server.telemetry import api as telemetry

PROBE_S = 1.0
"""How long a read with a token waits for the watcher to reconnect before answering 503 (Postgres down)."""


async def await_applied(
    token: Token, offsets: AppliedOffsets, settings: Settings, timeout_s: float, slots: WaitSlots, tenant: str
) -> None:
    """Return once the projection applied every `topic:partition:offset` of `token`, waiting in one of
    `tenant`'s wait slots; else a 503."""
    if not token:
        return
    if offsets.missing(token) and not await offsets.reachable(min(PROBE_S, timeout_s)):
        # Postgres is down: the projection cannot advance, so waiting would only delay the same 503.
        raise unavailable(
            "postgres_unavailable", f"the projection database is unreachable ({offsets.unreachable}); retry"
        )
    behind = bool(offsets.missing(token))
    try:
        # No await between the check and taking the slot: the bound is exact.
        with slots.slot(tenant) if behind else contextlib.nullcontext(), telemetry.consistency_wait(behind) as outcome:
            missing = await offsets.wait(token, timeout_s)
            outcome["timed_out"] = bool(missing)
    except WaitSlotsFull:
        raise unavailable(
            "too_many_waits",
            f"{slots.waiting} reads already wait for the projection, {slots.taken_by(tenant)} of them this tenant's "
            f"(GRAPHLEDGER_API_MAX_CONSISTENCY_WAITS {slots.limit}, shared fairly between tenants); retry shortly",
        ) from None
    if missing:
        behind_at = ", ".join(f"{topic}:{partition}:{offset}" for (topic, partition), offset in sorted(missing.items()))
        raise unavailable(
            "consistency_timeout",
            f"the projection has not applied {behind_at} after {settings.consistency_timeout_s:g}s; "
            "retry, or check the projector",
        )
