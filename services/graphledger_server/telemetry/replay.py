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


def report_progress(
    positions: Mapping[tuple[str, int], int], targets: Mapping[tuple[str, int], int], worker: str = "0/1"
) -> None:
    """Per partition: the share of the live projector's records the rebuild has applied (1 when there are none),
    from the worker (`i/N`) that applies it."""
    for (topic, partition), target in targets.items():
        done = min(positions.get((topic, partition), 0), target)
        attributes = {
            names.MESSAGING_DESTINATION_NAME: topic,
            names.MESSAGING_DESTINATION_PARTITION_ID: str(partition),
            names.GRAPHLEDGER_REPLAY_WORKER: worker,
        }
        progress.set(done / target if target else 1.0, attributes)
