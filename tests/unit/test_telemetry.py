"""graphledger.telemetry piece by piece: the metric registry against the real Prometheus exporter, the
dashboard against the registry, statement summaries, JSON logs, trace context parsing, exporter
selection. The projector's spans on real Postgres are `integration/test_projector_spans.py`, the whole
pipeline `acceptance/test_telemetry_e2e.py`.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import INVALID_SPAN, NonRecordingSpan, SpanContext, TraceFlags
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from graphledger.log.records import LogRecord
from graphledger.settings import Settings
from graphledger.telemetry.client import redact_url
from graphledger.telemetry.propagation import span_context_of, traceparent
from graphledger_server.log import offsets
from graphledger_server.opening import chunk_table
from graphledger_server.projection import checkpoint_sql, dead_letters, prune, store
from graphledger_server.telemetry import api as api_telemetry
from graphledger_server.telemetry import metrics as registry
from graphledger_server.telemetry.db import db_namespace, summarize
from graphledger_server.telemetry.logs import JsonFormatter
from graphledger_server.telemetry.projector import _link_producers, event_type_label
from graphledger_server.telemetry.sdk import exporter_names, prometheus_address
from projection_helpers import TOPIC

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docker" / "grafana" / "dashboards" / "graphledger.json"
PROVISIONING = ROOT / "docker" / "grafana" / "provisioning" / "dashboards" / "graphledger.yaml"

# -- the registry --------------------------------------------------------------------------------------


def test_registry_names_are_unique_and_conventional() -> None:
    names = [spec.name for spec in registry.REGISTRY]
    assert len(names) == len(set(names))
    for spec in registry.REGISTRY:
        assert re.fullmatch(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+", spec.name), spec.name
        assert spec.unit and spec.description
        assert spec.name.startswith("graphledger.") or spec.emitted_by != registry.GRAPHLEDGER
    series = registry.prometheus_series()
    assert len(series) == sum(len(spec.prometheus_names) for spec in registry.REGISTRY), "two metrics share a series"


def _exported_series(record: Callable[[MeterProvider], None]) -> set[str]:
    """The series names the real Prometheus exporter serves after `record` used a fresh meter provider."""
    prometheus = CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=prometheus)])
    try:
        record(provider)
        text = generate_latest(prometheus).decode()
    finally:
        provider.shutdown()
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def test_prometheus_names_are_what_the_exporter_serves() -> None:
    ours = [spec for spec in registry.REGISTRY if spec.emitted_by == registry.GRAPHLEDGER]

    def record(provider: MeterProvider) -> None:
        for spec in ours:
            meter = provider.get_meter(spec.scope)
            if spec.kind == "observable_gauge":
                meter.create_observable_gauge(spec.name, [lambda _o: [_observation()]], spec.unit, spec.description)
            elif spec.kind == "counter":
                meter.create_counter(spec.name, spec.unit, spec.description).add(1)
            elif spec.kind == "gauge":
                meter.create_gauge(spec.name, spec.unit, spec.description).set(0.5)
            elif spec.kind == "updown_counter":
                meter.create_up_down_counter(spec.name, spec.unit, spec.description).add(1)
            else:
                meter.create_histogram(spec.name, spec.unit, spec.description).record(1)

    exported = _exported_series(record)
    for spec in ours:
        assert set(spec.prometheus_names) <= exported, spec.name


def _observation() -> Any:
    from opentelemetry.metrics import Observation

    return Observation(1)


def test_the_fastapi_instrumentation_emits_the_registered_http_metrics() -> None:
    theirs = [spec for spec in registry.REGISTRY if spec.emitted_by == registry.FASTAPI_INSTRUMENTATION]

    def record(provider: MeterProvider) -> None:
        app = FastAPI()

        @app.post("/v1/things/get")
        def get() -> dict[str, str]:
            return {"ok": "yes"}

        api_telemetry.instrument_app(app, meter_provider=provider, tracer_provider=TracerProvider())
        assert TestClient(app).post("/v1/things/get", content=b"{}").status_code == 200

    exported = _exported_series(record)
    for spec in theirs:
        assert set(spec.prometheus_names) <= exported, spec.name


# -- the dashboard ------------------------------------------------------------------------------------

_PROMQL_WORDS = frozenset(
    "sum avg min max count rate irate increase histogram_quantile by without on ignoring group_left group_right "
    "bool and or unless offset le topk bottomk abs clamp_min clamp_max delta deriv label_replace vector scalar".split()
)


def _metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers outside label matchers, groupings,
    ranges and strings that are not functions or keywords."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)  # groupings
    expr = re.sub(r"\$\w+", "", expr)  # Grafana variables
    names = set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
        word = match.group(0)
        following = expr[match.end() :].lstrip()[:1]
        if word not in _PROMQL_WORDS and following != "(":
            names.add(word)
    return names


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def test_every_metric_the_dashboard_queries_is_in_the_registry() -> None:
    known = registry.prometheus_series()
    exprs = _dashboard_exprs()
    queried = set().union(*(_metric_names(e) for e in exprs))
    assert queried, "no metric found in the dashboard's queries"
    assert queried <= set(known), f"not emitted by graphledger: {sorted(queried - set(known))}"
    # Pipeline health, read API and store panels are all there.
    for wanted in (
        registry.PROJECTOR_LAG, registry.PROJECTOR_EVENTS_APPLIED, registry.PROJECTOR_FRESHNESS,
        registry.PROJECTOR_EVENTS_DEAD_LETTERED, registry.PROJECTOR_APPLY_DURATION,
        registry.HTTP_SERVER_REQUEST_DURATION, registry.API_STORE_SEARCH_DURATION,
    ):  # fmt: skip
        assert set(wanted.prometheus_names) & queried, wanted.name
    # Label names used in the queries are attributes of the metric they filter or group.
    labels = {registry.prometheus_label(a) for spec in registry.REGISTRY for a in spec.attributes} | {"le"}
    for expr in exprs:
        for grouping in re.findall(r"\bby\s*\(([^)]*)\)", expr):
            assert {g.strip() for g in grouping.split(",")} <= labels, expr


def test_the_metric_name_extraction_sees_through_promql() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le, http_route) (rate(http_server_request_duration_seconds_bucket"
        '{http_response_status_code=~"5.."}[$__rate_interval]))) / sum(graphledger_projector_lag)'
    )
    assert _metric_names(expr) == {"http_server_request_duration_seconds_bucket", "graphledger_projector_lag"}


def test_grafana_provisioning_loads_the_dashboard_folder() -> None:
    text = PROVISIONING.read_text()
    assert "type: file" in text and "/var/lib/grafana/dashboards" in text
    assert json.loads(DASHBOARD.read_text())["uid"] == "graphledger"


# -- spans ------------------------------------------------------------------------------------------


def _projection_statements() -> list[tuple[str, str]]:
    found = []
    for module in (checkpoint_sql, offsets, prune, chunk_table, dead_letters, store):
        for name, value in vars(module).items():
            if name.endswith("_SQL") and isinstance(value, str):
                found.append((f"{module.__name__}.{name}", value.replace("{schema}", "graphledger")))
    return found


def test_every_projection_statement_has_a_summary_of_operations_and_tables() -> None:
    statements = _projection_statements()
    assert len(statements) >= 20
    for name, sql in statements:
        summary, operation, _collection = summarize(sql)
        assert summary.startswith(operation), name
        assert re.fullmatch(r"[A-Z]+( [a-z_]+| [A-Z]+)*", summary), (name, summary)
        assert "graphledger." not in summary and "$" not in summary, name
    rendered = dict(statements)
    assert summarize(rendered["graphledger_server.projection.checkpoint_sql.UPSERT_CHECKPOINTS_SQL"]) == (
        "INSERT checkpoints", "INSERT", "checkpoints"
    )  # fmt: skip
    assert summarize(rendered["graphledger_server.log.offsets.ADVANCE_OFFSETS_SQL"])[0] == "UPDATE graphledger_offsets"
    # Not "UPDATE of" from `FOR UPDATE OF o`:
    assert summarize(rendered["graphledger_server.log.offsets.LOCK_OFFSETS_SQL"])[0] == "SELECT graphledger_offsets"
    assert summarize(offsets.NOTIFY_APPLIED_SQL)[0] == "SELECT pg_notify"
    # CTE names (`freed`, `garbage`) are not tables:
    gc_blobs = rendered["graphledger_server.projection.checkpoint_sql.GC_BLOBS_SQL"]
    assert summarize(gc_blobs)[0] == "SELECT checkpoints DELETE checkpoint_blobs"


def test_db_namespace_names_database_and_schema_only() -> None:
    assert db_namespace("postgresql://user:secret@db.example:5432/ledger?sslmode=require", "gl") == "ledger|gl"
    assert db_namespace("host=db user=u password=secret dbname=ledger", "gl") == "ledger|gl"
    assert db_namespace("postgresql://db", "gl") == "gl"


def test_traceparent_headers_parse_into_remote_span_contexts() -> None:
    context = span_context_of(b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    assert context is not None and context.is_remote and context.trace_flags.sampled
    assert (context.trace_id, context.span_id) == (0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331)
    zero_trace = b"00-" + b"0" * 32 + b"-b7ad6b7169203331-01"
    bad_version = b"ff-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01"
    for bad in (None, b"", b"garbage", zero_trace, bad_version, b"00-" + b"a" * 600):
        assert span_context_of(bad) is None


def test_without_an_sdk_the_callers_context_travels_on() -> None:
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1))
    caller = trace.set_span_in_context(NonRecordingSpan(remote), Context())
    assert traceparent(INVALID_SPAN, caller) == f"00-{0xABC:032x}-{0xDEF:016x}-01"
    assert traceparent(INVALID_SPAN, Context()) is None


def test_read_api_urls_lose_their_credentials() -> None:
    assert redact_url("https://user:pw@api.example:8443/base/?token=x#f") == "https://api.example:8443/base"


def test_links_stop_at_the_link_limit_and_count_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SPAN_LINK_COUNT_LIMIT", "3")
    records = [
        LogRecord(TOPIC, 0, i, None, b"", (("traceparent", f"00-{i + 1:032x}-{i + 1:016x}-01".encode()),))
        for i in range(5)
    ]
    records.append(records[0])  # a duplicate (chunks of one event share their producer span)
    span = TracerProvider().get_tracer("t").start_span("apply")
    _link_producers(span, records)
    assert [link.context.span_id for link in span.links] == [1, 2, 3]  # type: ignore[attr-defined]
    assert span.attributes["graphledger.batch.links_dropped"] == 2  # type: ignore[attr-defined]


def test_unknown_event_types_share_one_label() -> None:
    assert event_type_label("checkpoint.put") == "checkpoint.put"
    assert event_type_label("store.delete") == "store.delete"
    assert event_type_label("x" * 200) == event_type_label(None) == "other"


# -- logs and setup ---------------------------------------------------------------------------------


def _log_line(formatter: JsonFormatter, message: str, *args: Any, exc: bool = False) -> dict[str, Any]:
    exc_info = None
    if exc:
        try:
            raise ValueError("first\nsecond")
        except ValueError:
            exc_info = sys.exc_info()
    record = logging.LogRecord("graphledger.x", logging.WARNING, __file__, 1, message, args, exc_info)
    line = formatter.format(record)
    assert "\n" not in line
    return json.loads(line)


def test_json_log_lines_carry_the_current_span() -> None:
    formatter = JsonFormatter("graphledger-test")
    outside = _log_line(formatter, "batch of %d records", 3)
    assert outside["message"] == "batch of 3 records" and outside["level"] == "WARNING"
    assert outside["logger"] == "graphledger.x" and outside["service"] == "graphledger-test"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", outside["time"])
    assert "trace_id" not in outside and "span_id" not in outside
    with TracerProvider().get_tracer("t").start_as_current_span("work") as span:
        inside = _log_line(formatter, "inside", exc=True)
    context = span.get_span_context()
    assert (inside["trace_id"], inside["span_id"]) == (f"{context.trace_id:032x}", f"{context.span_id:016x}")
    assert "Traceback" in inside["exception"] and "second" in inside["exception"]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "console, otlp"}, ["console", "otlp"]),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, []),
    ],
)
def test_exporters_come_from_the_otel_variables(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: list[str]
) -> None:
    for name in (
        "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert exporter_names("traces") == expected


def test_the_client_uses_the_opentelemetry_api_only() -> None:
    """An application configures OpenTelemetry, not graphledger's client: importing and using the client
    loads no SDK, exporter, instrumentation or Prometheus module."""
    script = (
        "import sys\n"
        "from graphledger import KafkaSaver, KafkaStore, Settings\n"
        "import graphledger.client.publisher, graphledger.client.reader\n"
        "KafkaSaver(Settings())\n"
        "prefixes = ('opentelemetry.sdk', 'opentelemetry.exporter', 'opentelemetry.instrumentation',\n"
        "            'prometheus_client')\n"
        "print(sorted(m for m in sys.modules if m.startswith(prefixes)))\n"
        "print('opentelemetry.trace' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "True"]


def test_the_prometheus_endpoint_comes_from_the_setting_or_the_spec_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("OTEL_EXPORTER_PROMETHEUS_PORT", "OTEL_EXPORTER_PROMETHEUS_HOST", "OTEL_METRICS_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    assert prometheus_address(Settings(metrics_port=None)) is None  # type: ignore[call-arg]
    assert prometheus_address(Settings(metrics_port=0)) is None  # type: ignore[call-arg]
    configured = Settings(metrics_port=9500, metrics_host="0.0.0.0")  # type: ignore[call-arg]
    assert prometheus_address(configured) == ("0.0.0.0", 9500)
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_HOST", "0.0.0.0")  # what the Helm chart sets
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", "9464")
    assert prometheus_address(Settings(metrics_port=None)) == ("0.0.0.0", 9464)  # type: ignore[call-arg]
    monkeypatch.delenv("OTEL_EXPORTER_PROMETHEUS_PORT")
    monkeypatch.delenv("OTEL_EXPORTER_PROMETHEUS_HOST")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
    assert prometheus_address(Settings(metrics_port=None)) == ("localhost", 9464)  # type: ignore[call-arg]
