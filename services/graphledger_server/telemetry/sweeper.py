"""The sweeper's telemetry: its own root spans (nothing upstream triggers a sweep) and its metrics.

`graphledger.sweeper.expirations` is reported from the start, at 0, so a dashboard or an alert on it
works before the first expiry, and a standby replica reports `graphledger.sweeper.active` 0.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span

from graphledger.telemetry import names
from graphledger_server.telemetry import metrics

_tracer = trace.get_tracer(names.SWEEPER_SCOPE)
expirations = metrics.instrument(metrics.SWEEPER_EXPIRATIONS)
_duration = metrics.instrument(metrics.SWEEPER_SWEEP_DURATION)
_active = metrics.instrument(metrics.SWEEPER_ACTIVE)

STORE_ITEM = "store_item"
IDLE_THREAD = "idle_thread"
OLD_CHECKPOINTS = "old_checkpoints"
KINDS = (STORE_ITEM, IDLE_THREAD, OLD_CHECKPOINTS)


@contextmanager
def root_span(name: str) -> Iterator[Span]:
    """A span that starts a new trace, whatever context is current (a sweep answers no caller)."""
    with _tracer.start_as_current_span(name, context=Context()) as span:
        yield span


def started() -> None:
    """Report the expirations counter at 0 per kind and the replica as standing by."""
    for kind in KINDS:
        expirations.add(0, {names.SWEEP_KIND: kind})
    _active.set(0)


def active(is_active: bool) -> None:
    _active.set(1 if is_active else 0)


def expired(kind: str, count: int) -> None:
    """`count` expiry events of `kind` published (and acknowledged)."""
    if count:
        expirations.add(count, {names.SWEEP_KIND: kind})


@contextmanager
def sweep() -> Iterator[Span]:
    """One sweep: a root span, and its duration recorded whatever the outcome."""
    start = time.perf_counter()
    try:
        with root_span("sweeper sweep") as span:
            yield span
    finally:
        _duration.record(time.perf_counter() - start)
