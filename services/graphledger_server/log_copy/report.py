"""What a copy of one topic met and did, for the operator."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from graphledger_server.log_copy.source import Position

log = logging.getLogger(__name__)

SHOWN_LEFT_OUT = 20
"""Left-out events listed one by one in the output; the rest are counted."""


@dataclass
class TopicReport:
    source: str
    target: str
    partitions: int
    events: int = 0
    """Events met in the source up to its end as of the start."""
    sealed: int = 0
    """Written sealed (they were in the clear)."""
    kept: int = 0
    """Written as they were: sealed already, or naming no one (keyless events)."""
    barriers: int = 0
    """Copy barriers pointed at their copy's new position."""
    broadcasts: int = 0
    """Keyless events written to every new partition."""
    earlier: int = 0
    """Copied by an earlier run."""
    erased: int = 0
    """Left out: their subject or tenant is erased."""
    left_out: list[str] = field(default_factory=list)
    """Left out, `partition@offset: why`: undecodable, invalid, incomplete, a barrier naming no copy."""
    records: int = 0
    """Records written by this run."""

    def describe(self) -> list[str]:
        lines = [
            f"{self.source} -> {self.target}: {self.events} events (up to the end as of the start): {self.sealed} "
            f"sealed, {self.kept} copied as they were, {self.barriers} copy barriers repositioned, {self.broadcasts} "
            f"written to all {self.partitions} partitions, {self.earlier} copied by an earlier run, {self.erased} "
            f"left out as erased, {len(self.left_out)} left out as unusable; {self.records} records written"
        ]
        lines += [f"  left out {self.source}:{why}" for why in self.left_out[:SHOWN_LEFT_OUT]]
        if len(self.left_out) > SHOWN_LEFT_OUT:
            lines.append(f"  ... and {len(self.left_out) - SHOWN_LEFT_OUT} more (the log at INFO lists them all)")
        return lines

    def leave_out(self, position: Position, why: str) -> None:
        self.left_out.append(f"{position[0]}@{position[1]}: {why}")
        log.info("left out %s:%d@%d: %s", self.source, *position, why)
