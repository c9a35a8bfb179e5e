"""The read API's telemetry: HTTP server spans and metrics, consistency waits, store search latency.

Server spans and `http.server.request.duration` come from `opentelemetry-instrumentation-fastapi`,
which continues the caller's trace from the request headers (the client's HTTP span, see
`telemetry.client`) and names spans and labels by route template (`POST /v1/checkpoints/get`), never
by a request's content. It is switched to the stable HTTP conventions (`http.request.method`,
`http.response.status_code`) through `OTEL_SEMCONV_STABILITY_OPT_IN`, which it reads once per process.
Health probes are not traced unless `OTEL_PYTHON_FASTAPI_EXCLUDED_URLS` says otherwise. Without an
SDK provider (no exporter configured, see `telemetry.sdk`) the app is not instrumented at all: its
no-op spans and metrics cost 0.06 ms per request (measured), a twentieth of a store search.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from graphledger.telemetry import names
from graphledger_server.telemetry import metrics

_tracer = trace.get_tracer(names.API_SCOPE)
_consistency_wait = metrics.instrument(metrics.API_CONSISTENCY_WAIT)
_consistency_timeouts = metrics.instrument(metrics.API_CONSISTENCY_TIMEOUTS)
_search_duration = metrics.instrument(metrics.API_STORE_SEARCH_DURATION)

DEFAULT_EXCLUDED_URLS = "/healthz,/readyz"


def instrument_app(app: Any, *, tracer_provider: Any = None, meter_provider: Any = None) -> None:
    """Trace and measure every request of the FastAPI `app` (server spans, HTTP server metrics).

    The providers default to the global ones, which `telemetry.setup` installs in a service; when
    neither is given nor installed, nothing would be recorded and the app is left as it is.
    """
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    if tracer_provider is None and meter_provider is None and not _sdk_installed():
        return

    opt_in = [mode.strip() for mode in os.environ.get("OTEL_SEMCONV_STABILITY_OPT_IN", "").split(",") if mode.strip()]
    if "http" not in opt_in and "http/dup" not in opt_in:
        os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = ",".join([*opt_in, "http"])
    configured = os.environ.get("OTEL_PYTHON_FASTAPI_EXCLUDED_URLS") or os.environ.get("OTEL_PYTHON_EXCLUDED_URLS")
    FastAPIInstrumentor.instrument_app(
        app,
        excluded_urls=None if configured else DEFAULT_EXCLUDED_URLS,
        # One server span per request; the ASGI receive/send spans would double the span count for nothing.
        exclude_spans=["receive", "send"],
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
    )


def _sdk_installed() -> bool:
    return isinstance(trace.get_tracer_provider(), TracerProvider) or isinstance(
        otel_metrics.get_meter_provider(), MeterProvider
    )


def started() -> None:
    """Report the consistency timeouts counter at 0, so the first timeout is an increase a rate (the
    dashboard, GraphledgerConsistencyTimeouts) sees, not the first sample of a new series."""
    _consistency_timeouts.add(0)


@contextmanager
def consistency_wait(must_wait: bool) -> Iterator[dict[str, bool]]:
    """Measure a read's wait for its consistency token; set `outcome["timed_out"]` before leaving.

    Reads that must wait get a span of their own, so a slow read's trace shows the wait apart from
    the query.
    """
    outcome = {"timed_out": False}
    started = time.perf_counter()
    if must_wait:
        with _tracer.start_as_current_span("consistency wait"):
            yield outcome
    else:
        yield outcome
    label = "timeout" if outcome["timed_out"] else "reached"
    _consistency_wait.record(time.perf_counter() - started, {names.CONSISTENCY_OUTCOME: label})
    if outcome["timed_out"]:
        _consistency_timeouts.add(1)


def store_searches(timings: Sequence[tuple[str, float]]) -> None:
    """Record the store search ops of an answer given: `(mode, seconds)`, the mode `vector` (ranked by a
    query vector) or `filter`. A search run ahead and then discarded is not one."""
    for mode, seconds in timings:
        _search_duration.record(seconds, {names.SEARCH_MODE: mode})
