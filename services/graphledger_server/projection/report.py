"""What applying a batch of one topic's events found worth reporting beyond the rows it wrote."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ApplyReport:
    forks: int = 0
    """Checkpoint puts made without an intent whose parent was not their thread namespace's newest checkpoint."""
    branches: int = 0
    """Counted protected puts whose parent was not the newest: branches their writers asked for."""
    refusals: Counter[str] = field(default_factory=Counter)
    """Puts and writes the rule refused (`graphledger.ownership`), by cause."""

    def __add__(self, other: ApplyReport | None) -> ApplyReport:
        if other is None:
            return self
        return ApplyReport(self.forks + other.forks, self.branches + other.branches, self.refusals + other.refusals)
