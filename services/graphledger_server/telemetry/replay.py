"""The replay's telemetry: a root span per phase (nothing upstream triggers a replay) and its progress gauge."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.trace import Span

from graphledger.telemetry import names
from graphledger_server.telemetry import metrics

_tracer = trace.get_tracer(names.REPLAY_SCOPE)
progress = metrics.instrument(metrics.REPLAY_PROGRESS)


@contextmanager
def span(name: str, **attributes: str | int) -> Iterator[Span]:
    """A span of a replay phase, nested under the current one (`replay.run` starts the trace)."""
    with _tracer.start_as_current_span(name, attributes=attributes) as current:
        yield current


def report_progress(positions: Mapping[tuple[str, int], int], targets: Mapping[tuple[str, int], int]) -> None:
    """Per partition: the share of the live projector's records the rebuild has applied (1 when there are none)."""
    for (topic, partition), target in targets.items():
        done = min(positions.get((topic, partition), 0), target)
        progress.set(
            done / target if target else 1.0,
            {names.MESSAGING_DESTINATION_NAME: topic, names.MESSAGING_DESTINATION_PARTITION_ID: str(partition)},
        )
