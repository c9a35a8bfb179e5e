"""Offsets a fetch's answer passes over: fetched again, not read past, until they prove missing.

A fetch from offset `p` answers with records from `p` on, in offset order, and a reader takes the next
record as the one after the last it took. tansu breaks that near the end of a partition that several
producers write at once: a fetch can bring a later batch while an earlier one is not readable yet, and
the next fetch brings the earlier one (measured with three producers and one consumer seeking at random:
3 gaps in 85,000 records, each one to three records, each there on the next fetch). aiokafka hands such
an answer on as it is (a compacted topic has gaps too), so a reader that took it would never see the
records it passed over: the projector would lose them for good. Kafka appends a partition's batches in
order and never answers beyond what is readable, and graphledger's topics are neither compacted nor
written in transactions, so there a gap does not happen.

So a reader meeting a gap stops before it and fetches again from the first missing offset. A gap still
there after `confirm_s` is offsets the log does not hold (a compacted topic, transaction markers, a
producer that is not graphledger's): the reader is then let past it, with a warning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

CONFIRM_S = 2.0
"""How long a gap must persist before it is taken as offsets the log does not hold."""


@dataclass
class GapWatch:
    """Per reader: the gaps met, and since when."""

    confirm_s: float = CONFIRM_S
    clock: Callable[[], float] = time.monotonic
    _since: dict[tuple[Hashable, int], float] = field(default_factory=dict)
    on_gap: Callable[[bool], None] | None = None
    """Told of each gap when first met (False) and when read past (True): the projector counts them."""

    def may_pass(self, partition: Hashable, expected: int, found: int) -> bool:
        """Whether a reader of `partition` expecting offset `expected` may take the record at `found`
        (above it): only once the gap has persisted `confirm_s`; else it fetches from `expected` again."""
        key = (partition, expected)
        now = self.clock()
        since = self._since.get(key)
        if since is None:
            since = self._since[key] = now
            log.info("a fetch of %s passed over offsets %d..%d: fetching them again", partition, expected, found - 1)
            if self.on_gap is not None:
                self.on_gap(False)
        if now - since < self.confirm_s:
            return False
        del self._since[key]
        if self.on_gap is not None:
            self.on_gap(True)
        log.warning(
            "%s has no records at offsets %d..%d (still missing after %.0fs): reading on past them (a compacted "
            "topic, transaction markers, or a producer that is not graphledger's)",
            partition, expected, found - 1, self.confirm_s,
        )  # fmt: skip
        return True

    def forget(self, partition: Hashable) -> None:
        """The reader no longer reads `partition` (revoked, sought elsewhere)."""
        for key in [key for key in self._since if key[0] == partition]:
            del self._since[key]
