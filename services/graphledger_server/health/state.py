"""`WorkerHealth`: whether a worker's loop is live (it keeps completing steps) and ready (it does its job).

A frozen loop is one stuck inside a step: an await that never returns (a Postgres connection that
stopped answering, a statement waiting on a lock for ever) or a blocked event loop. It is told apart
from an idle one by the time since the loop last completed a step: the projector completes a poll at
least every fraction of a second even with nothing to do, and a batch attempt, failed or not, within
its statement's time; the sweeper completes a page or a try for its lock at least once per interval.
So "live" means: the last completed step is at most `deadline_s` old, after `allowance_s` (the longest
a worker legitimately waits between steps: the sweeper's interval and page wait, 0 for the projector).

A worker backing off from an outage (Postgres down, Kafka down) keeps completing failed attempts, so it
stays live: a restart would not bring the dependency back. It is not ready meanwhile.

The worker's loop writes and the probe server's thread reads; each field is replaced whole, so a
reader sees either the old or the new value of each.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Verdict:
    """One probe's answer: healthy or not, and what the operator should read in the body."""

    ok: bool
    status: str
    detail: Mapping[str, Any]


class WorkerHealth:
    """What a worker's loop reports (`progressed`, `set_ready`, `set_not_ready`) and what probes read."""

    def __init__(
        self,
        deadline_s: float,
        *,
        allowance_s: float = 0.0,
        not_ready_reason: str = "starting",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if deadline_s <= 0 or allowance_s < 0:
            raise ValueError(f"deadline_s must be > 0 and allowance_s >= 0, not {deadline_s} and {allowance_s}")
        self.deadline_s = deadline_s
        self.allowance_s = allowance_s
        self._clock = clock
        self._progressed_at = clock()  # starting counts as a step: a start that hangs turns not live too
        self._not_ready_reason: str | None = not_ready_reason

    # -- what the worker reports -----------------------------------------------------------------------

    def progressed(self) -> None:
        """The loop completed a step (whatever its outcome)."""
        self._progressed_at = self._clock()

    def set_ready(self) -> None:
        """The worker does its job: assigned and applying (or caught up), or sweeping (or standing by)."""
        self._not_ready_reason = None

    def set_not_ready(self, reason: str) -> None:
        """The worker cannot do its job now, for `reason` (shown in the `/readyz` answer)."""
        self._not_ready_reason = reason

    # -- what the probes read ----------------------------------------------------------------------------

    def liveness(self) -> Verdict:
        idle = max(0.0, self._clock() - self._progressed_at)
        limit = self.deadline_s + self.allowance_s
        detail = {"seconds_since_progress": round(idle, 3), "limit_s": limit}
        if idle > limit:
            reason = f"no step of the loop completed for {idle:.1f}s (limit {limit:g}s): it is stuck"
            return Verdict(False, "not live", {"reason": reason, **detail})
        return Verdict(True, "live", detail)

    def readiness(self) -> Verdict:
        live = self.liveness()
        if not live.ok:
            return Verdict(False, "not ready", live.detail)
        reason = self._not_ready_reason
        if reason is not None:
            return Verdict(False, "not ready", {"reason": reason})
        return Verdict(True, "ready", {})


def caught_up(
    assigned: Iterable[tuple[str, int]], paused: Iterable[tuple[str, int]], lag: Mapping[tuple[str, int], int]
) -> bool:
    """Whether every assigned partition that is not paused is known to have nothing left to apply.

    Paused partitions are the ones the projector stopped (a lost log, an event from a newer version):
    no restart or rollout helps them, so they must not hold readiness back.
    """
    skip = set(paused)
    return all(lag.get(tp) == 0 for tp in assigned if tp not in skip)
