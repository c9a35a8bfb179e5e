"""The sweeper's telemetry: its own root spans (nothing upstream triggers a sweep) and its counter.

`graphledger.sweeper.expirations` is reported from the start, at 0, so a dashboard or an alert on it
works before TTL sweeping lands (issue 4) and shows a sweeper that runs but expires nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span

from graphledger.telemetry import metrics, names

_tracer = trace.get_tracer(names.SWEEPER_SCOPE)
expirations = metrics.instrument(metrics.SWEEPER_EXPIRATIONS)


@contextmanager
def root_span(name: str) -> Iterator[Span]:
    """A span that starts a new trace, whatever context is current (a sweep answers no caller)."""
    with _tracer.start_as_current_span(name, context=Context()) as span:
        yield span


def started() -> None:
    """Report the expirations counter at 0, so its series exists before the first expiry."""
    expirations.add(0)
