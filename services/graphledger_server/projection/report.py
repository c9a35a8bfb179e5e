"""What applying a batch of one topic's events found worth reporting beyond the rows it wrote."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ApplyReport:
    forks: int = 0
    """Checkpoint puts whose parent was not their thread namespace's newest checkpoint."""

    def __add__(self, other: ApplyReport | None) -> ApplyReport:
        return self if other is None else ApplyReport(self.forks + other.forks)
